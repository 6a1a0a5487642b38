-- Sliding window log: sorted set of entries scored by time, member "seq:cost";
-- aux hash {n = total cost held, q = sequence}. p1 = limit, p2 = window.
ALG.sliding_window_log = function(key, aux, limit, window, now, cost, lease, write)
  local cutoff = now - window + EPS
  local expired = redis.call('ZRANGEBYSCORE', key, '-inf', cutoff)
  local used = tonumber(redis.call('HGET', aux, 'n')) or 0
  if #expired > 0 then
    local freed = 0
    for _, member in ipairs(expired) do
      freed = freed + tonumber(string.match(member, ':(.*)$'))
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    if redis.call('ZCARD', key) == 0 then used = 0 else used = used - freed end
    redis.call('HSET', aux, 'n', fmt(used))
  end
  local reset = 0
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #newest > 0 then reset = wait(tonumber(newest[2]) + window, now) end
  if cost > limit then return false, limit - used, reset, INF end
  if used + cost > limit + EPS then
    local need, freed, start = used + cost - limit, 0, 0
    while true do
      local batch = redis.call('ZRANGE', key, start, start + 31, 'WITHSCORES')
      if #batch == 0 then return false, limit - used, reset, INF end
      for i = 1, #batch, 2 do
        freed = freed + tonumber(string.match(batch[i], ':(.*)$'))
        if freed >= need - EPS then
          return false, limit - used, reset, wait(tonumber(batch[i + 1]) + window, now)
        end
      end
      start = start + 32
    end
  end
  if cost > 0 then
    reset = window
    if write then
      local seq = redis.call('HINCRBY', aux, 'q', 1)
      redis.call('ZADD', key, fmt(now), seq .. ':' .. fmt(cost))
      redis.call('HSET', aux, 'n', fmt(used + cost))
      expire(key, window)
      expire(aux, window)
    end
  end
  return true, limit - used - cost, reset, 0
end
