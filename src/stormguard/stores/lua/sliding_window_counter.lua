-- Sliding window counter: string "<window index>:<previous>:<current>";
-- p1 = limit, p2 = window. used = previous * (1 - elapsed/window) + current.
local function swc_reset(window, prev, curr, elapsed)
  if curr > 0 then return 2 * window - elapsed end
  if prev > 0 then return window - elapsed end
  return 0
end

STEP.sliding_window_counter = function(state, limit, window, now, cost, want)
  local index, stored = current_window(state, window, now)
  local prev, curr = 0, 0
  if stored == index then
    prev, curr = state[2], state[3]
  elseif stored == index - 1 then
    prev = state[3]
  end
  local elapsed = math.min(window, math.max(0, now - index * window))
  local used = prev * (1 - elapsed / window) + curr
  if cost > limit then
    return false, nil, limit - used, swc_reset(window, prev, curr, elapsed), INF, 0
  end
  if used + cost > limit + EPS then
    local room = limit - curr - cost
    local retry
    if room >= -EPS and prev > 0 then
      retry = window * (1 - room / prev) - elapsed
    else
      local later = 0
      if curr > limit - cost then later = window * (1 - (limit - cost) / curr) end
      retry = (window - elapsed) + later
    end
    return false, nil, limit - used, swc_reset(window, prev, curr, elapsed), math.max(0, retry), 0
  end
  local granted = grant(cost, want, limit - used)
  curr = curr + granted
  return true, {index, prev, curr}, limit - used - granted, swc_reset(window, prev, curr, elapsed),
    0, granted
end
PARSE.sliding_window_counter = parse_fields
RENDER.sliding_window_counter = function(state)
  return state[1] .. ':' .. state[2] .. ':' .. state[3]
end

-- The hit counts in its own window's `current`, or in `previous` once the stored
-- state has moved one window on; older than that it no longer counts.
REFUND.sliding_window_counter = function(key, aux, limit, window, cost, lease, taken, now)
  local _, stored, counts = read_window(key, window, now)
  if stored == nil then return end
  local at, prev, curr = stored - window_index(taken, window), counts[1], counts[2]
  if at == 0 then
    curr = math.max(0, curr - cost)
  elseif at == 1 then
    prev = math.max(0, prev - cost)
  else
    return
  end
  set_keep_ttl(key, stored .. ':' .. prev .. ':' .. curr)
end
