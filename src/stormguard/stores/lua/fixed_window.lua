-- Fixed window: string "<window index>:<count>"; p1 = limit, p2 = window.
STEP.fixed_window = function(state, limit, window, now, cost, want)
  local index, stored = current_window(state, window, now)
  local count = 0
  if stored == index then count = state[2] end
  local reset = wait((index + 1) * window, now)
  if cost > limit then return false, nil, limit - count, reset, INF, 0 end
  if count + cost > limit + EPS then return false, nil, limit - count, reset, reset, 0 end
  local granted = grant(cost, want, limit - count)
  count = count + granted
  if count == 0 then return true, nil, limit, 0, 0, 0 end
  return true, {index, count}, limit - count, reset, 0, granted
end
PARSE.fixed_window = parse_fields
RENDER.fixed_window = function(state) return state[1] .. ':' .. state[2] end

-- Give back only while the window the hit was counted in is the stored one.
REFUND.fixed_window = function(key, aux, limit, window, cost, lease, taken, now)
  local _, stored, counts = read_window(key, window, now)
  if stored == nil or stored ~= window_index(taken, window) then return end
  set_keep_ttl(key, stored .. ':' .. math.max(0, counts[1] - cost))
end
