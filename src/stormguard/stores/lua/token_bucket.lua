-- Token bucket: hash {t = tokens, s = last update}; p1 = rate, p2 = burst.
ALG.token_bucket = function(key, aux, rate, burst, now, cost, lease, write)
  local state = redis.call('HMGET', key, 't', 's')
  local tokens, last = tonumber(state[1]), tonumber(state[2])
  if tokens == nil or last == nil then
    tokens, last = burst, now
  else
    if now < last then now = last end
    tokens = math.min(burst, tokens + (now - last) * rate)
  end
  if cost > burst then return false, tokens, 0, INF end
  if cost > tokens + EPS then
    return false, tokens, (burst - tokens) / rate, (cost - tokens) / rate
  end
  tokens = tokens - cost
  local reset = (burst - tokens) / rate
  if write and cost > 0 then
    redis.call('HSET', key, 't', fmt(tokens), 's', fmt(now))
    expire(key, reset)
  end
  return true, tokens, reset, 0
end
