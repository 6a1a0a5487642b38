-- Sliding window log: sorted set with one member per unit of cost, scored by the
-- time it was taken; members are "<TIME>#<n>", unique because TIME is. Entries
-- older than the window are trimmed first, so ZCARD is the units in use.
-- p1 = limit, p2 = window. Cost counts in whole units (rounded up).
local function newest_reset(key, window, now)
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #newest == 0 then return 0 end
  return wait(tonumber(newest[2]) + window, now)
end

ALG.sliding_window_log = function(key, aux, limit, window, now, cost, lease, write, stamp)
  cost = math.ceil(cost - EPS)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window + EPS)
  local used = redis.call('ZCARD', key)
  if cost > limit then return false, limit - used, newest_reset(key, window, now), INF end
  if used + cost > limit + EPS then
    local rank = math.ceil(used + cost - limit - EPS) - 1
    local entry = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
    local retry = wait(tonumber(entry[2]) + window, now)
    return false, limit - used, newest_reset(key, window, now), retry
  end
  if cost == 0 then return true, limit - used, newest_reset(key, window, now), 0 end
  if write then
    local args = {}
    for i = 1, cost do
      args[2 * i - 1] = now
      args[2 * i] = stamp .. '#' .. (used + i)
    end
    redis.call('ZADD', key, unpack(args))
    redis.call('PEXPIRE', key, px(window))
  end
  return true, limit - used - cost, window, 0
end

-- The hit's members are scored `taken`; any `cost` of the members with that score
-- are interchangeable (trimmed ones no longer count).
REFUND.sliding_window_log = function(key, aux, limit, window, cost, lease, taken, now)
  local mine = redis.call('ZRANGEBYSCORE', key, taken, taken, 'LIMIT', 0, math.ceil(cost - EPS))
  if #mine > 0 then redis.call('ZREM', key, unpack(mine)) end
end
