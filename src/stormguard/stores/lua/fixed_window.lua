-- Fixed window: string "<window index>:<count>"; p1 = limit, p2 = window.
ALG.fixed_window = function(key, aux, limit, window, now, cost, lease, write)
  local index, stored, counts = read_window(key, window, now)
  local count = 0
  if stored == index then count = counts[1] end
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
  local _, stored, counts = read_window(key, window, now)
  if stored == nil or stored ~= window_index(taken, window) then return end
  set_keep_ttl(key, stored .. ':' .. math.max(0, counts[1] - cost))
end
