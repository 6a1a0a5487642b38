-- Concurrency: sorted set of leases scored by expiry; aux hash lease -> cost.
-- p1 = limit, p2 = lease seconds.
local function conc_cleanup(key, aux, now)
  local gone = redis.call('ZRANGEBYSCORE', key, '-inf', now + EPS)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now + EPS)
    for i = 1, #gone, 1000 do  -- unpack() is bounded by the Lua stack
      redis.call('HDEL', aux, unpack(gone, i, math.min(i + 999, #gone)))
    end
  end
  local used = 0
  for _, c in ipairs(redis.call('HVALS', aux)) do used = used + tonumber(c) end
  local reset = 0
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last > 0 then reset = wait(tonumber(last[2]), now) end
  return used, reset
end

local function conc_expire(key, aux, reset)
  if reset > 0 then
    redis.call('PEXPIRE', key, px(reset))
    redis.call('PEXPIRE', aux, px(reset))
  else
    redis.call('DEL', key, aux)
  end
end

ALG.concurrency = function(key, aux, limit, lease_for, now, cost, lease, write)
  local used, reset = conc_cleanup(key, aux, now)
  if cost > limit then return false, limit - used, reset, INF end
  if used + cost > limit + EPS then
    local need, freed, start = used + cost - limit, 0, 0
    while true do
      local batch = redis.call('ZRANGE', key, start, start + 31, 'WITHSCORES')
      if #batch == 0 then return false, limit - used, reset, INF end
      for i = 1, #batch, 2 do
        freed = freed + tonumber(redis.call('HGET', aux, batch[i]) or 0)
        if freed >= need - EPS then
          return false, limit - used, reset, wait(tonumber(batch[i + 1]), now)
        end
      end
      start = start + 32
    end
  end
  if cost > 0 then
    reset = math.max(reset, lease_for)
    if write then
      redis.call('ZADD', key, now + lease_for, lease)
      redis.call('HSET', aux, lease, cost)
      conc_expire(key, aux, reset)
    end
  end
  return true, limit - used - cost, reset, 0
end

-- release: drop the lease. renew: push its expiry to now + lease_for.
local function conc_release(key, aux, lease, now)
  redis.call('ZREM', key, lease)
  redis.call('HDEL', aux, lease)
  local _, reset = conc_cleanup(key, aux, now)
  conc_expire(key, aux, reset)
  return 1
end

local function conc_renew(key, aux, lease, lease_for, now)
  conc_cleanup(key, aux, now)
  redis.call('ZADD', key, 'XX', now + lease_for, lease)
  if redis.call('ZSCORE', key, lease) == false then return 0 end
  local _, reset = conc_cleanup(key, aux, now)
  conc_expire(key, aux, reset)
  return 1
end

REFUND.concurrency = function(key, aux, limit, lease_for, cost, lease, taken, now)
  conc_release(key, aux, lease, now)
end
