-- stormguard limiter scripts: shared helpers. The store concatenates
-- _common.lua, one file per algorithm and limit.lua into one script, so deciding
-- several limits for one request is one EVALSHA. Each algorithm registers
-- ALG[kind](key, aux, p1, p2, now, cost, lease, write) returning
-- allowed (bool), remaining, reset_after, retry_after; it writes only when
-- `write` is true and the hit is allowed. Rules: see core/_limiters.py.
local EPS = 1e-6
local INF = 1 / 0
local ALG = {}

local function fmt(x)
  return string.format('%.17g', x)
end

local function wait(deadline, now)
  if deadline > now then return deadline - now end
  return 0
end

local function expire(key, seconds)
  redis.call('PEXPIRE', key, math.max(1, math.ceil(seconds * 1000) + 1))
end
