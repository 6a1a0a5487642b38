-- Fixed window: string "<window index>:<count>"; p1 = limit, p2 = window.
ALG.fixed_window = function(key, aux, limit, window, now, cost, lease, write)
  local index = math.floor((now + EPS) / window)
  local count = 0
  local state = redis.call('GET', key)
  if state then
    local w, c = string.match(state, '^([^:]+):(.+)$')
    w = tonumber(w)
    if w > index then index = w end
    if w == index then count = tonumber(c) end
  end
  local reset = wait((index + 1) * window, now)
  if cost > limit then return false, limit - count, reset, INF end
  if count + cost > limit + EPS then return false, limit - count, reset, reset end
  count = count + cost
  if count == 0 then return true, limit, 0, 0 end
  if write and cost > 0 then
    redis.call('SET', key, index .. ':' .. count, 'PX', px(reset))
  end
  return true, limit - count, reset, 0
end

-- Give back only while the window the hit was counted in is the stored one.
REFUND.fixed_window = function(key, aux, limit, window, cost, lease, taken, now)
  local state = redis.call('GET', key)
  if not state then return end
  local w, c = string.match(state, '^([^:]+):(.+)$')
  if tonumber(w) ~= math.floor((taken + EPS) / window) then return end
  set_keep_ttl(key, w .. ':' .. math.max(0, tonumber(c) - cost))
end
