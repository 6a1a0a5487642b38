-- stormguard limiter scripts: shared helpers. The store concatenates
-- _common.lua, one file per algorithm and limit.lua into one script, so deciding
-- several limits (or a batch of requests) is one EVALSHA. Each algorithm
-- registers ALG[kind](key, aux, p1, p2, now, cost, lease, write, stamp) returning
-- allowed (bool), remaining, reset_after, retry_after; it writes only when
-- `write` is true and the hit is allowed. Rules: see core/_limiters.py.
--
-- It also registers REFUND[kind](key, aux, p1, p2, cost, lease, taken, now): give
-- back a hit allowed at time `taken` (Redis Cluster: a group spanning slots is
-- decided slot by slot, and a later slot's refusal refunds the earlier ones). A
-- refund never gives back more than the hit still holds, so it never over-admits.
--
-- Cost: every redis.call is the unit of work here, so state lives in as few keys
-- and calls as possible: numbers go to redis.call as Lua numbers (Redis renders
-- them exactly) and the values of several numbers are joined with ':' (integers
-- and counts, exact to 14 digits).
local EPS = 1e-6
local INF = 1 / 0
local ALG = {}
local REFUND = {}

local function wait(deadline, now)
  if deadline > now then return deadline - now end
  return 0
end

local function px(seconds)
  return math.max(1, math.ceil(seconds * 1000) + 1)
end

-- Window counters: a string "<window index>:<count>[:<count>...]".
-- window_index(t, window): the window `t` falls in. read_window(key, window, now):
-- the current window index (never behind the stored one, so a clock stepping back
-- does not reopen a window), the stored index (nil without state) and the stored
-- counts as numbers.
local function window_index(t, window)
  return math.floor((t + EPS) / window)
end

local function read_window(key, window, now)
  local index = window_index(now, window)
  local state = redis.call('GET', key)
  if not state then return index, nil, {} end
  local counts = {}
  for field in string.gmatch(state, '[^:]+') do counts[#counts + 1] = tonumber(field) end
  local stored = table.remove(counts, 1)
  if stored > index then index = stored end
  return index, stored, counts
end

-- Rewrite a string value, keeping the key's expiry.
local function set_keep_ttl(key, value)
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then redis.call('SET', key, value, 'PX', ttl) else redis.call('SET', key, value) end
end
