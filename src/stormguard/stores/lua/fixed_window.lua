-- Fixed window: hash {w = window index, c = count}; p1 = limit, p2 = window.
ALG.fixed_window = function(key, aux, limit, window, now, cost, lease, write)
  local state = redis.call('HMGET', key, 'w', 'c')
  local index = math.floor((now + EPS) / window)
  local w, count = tonumber(state[1]), tonumber(state[2]) or 0
  if w ~= nil and w > index then index = w end
  if w ~= index then count = 0 end
  local reset = wait((index + 1) * window, now)
  if cost > limit then return false, limit - count, reset, INF end
  if count + cost > limit + EPS then return false, limit - count, reset, reset end
  count = count + cost
  if write and cost > 0 then
    redis.call('HSET', key, 'w', fmt(index), 'c', fmt(count))
    expire(key, reset)
  end
  if count == 0 then reset = 0 end
  return true, limit - count, reset, 0
end
