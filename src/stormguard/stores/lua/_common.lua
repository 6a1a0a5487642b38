-- stormguard limiter scripts: shared helpers. The store concatenates
-- _common.lua, one file per algorithm and limit.lua into one script, so deciding
-- several limits (or a batch of requests) is one EVALSHA. Rules: core/_limiters.py.
--
-- Two kinds of algorithm:
-- * one-string state (token_bucket, gcra, fixed_window, sliding_window_counter):
--   STEP[kind](state, p1, p2, now, cost, want) is pure -- it returns
--   ok, new_state, remaining, reset_after, retry_after, granted -- and the driver
--   reads each key once per script call (GET, parsed by PARSE[kind]) and writes it
--   once at the end (SET ... PX, rendered by RENDER[kind]), however many requests
--   of the batch touch it: a global limit in a batch of 50 requests is one GET and
--   one SET, not 50 of each. `want` >= cost asks for a reservation (approximate
--   mode): admitted only if `cost` fits, it takes up to `want` units and says how
--   many in `granted`.
-- * sorted-set state (sliding_window_log, concurrency): ALG[kind](key, aux, p1,
--   p2, now, cost, lease, write, stamp) works on Redis directly and returns
--   allowed, remaining, reset_after, retry_after; it writes only when `write` is
--   true and the hit is allowed.
--
-- REFUND[kind](key, aux, p1, p2, cost, lease, taken, now) gives back a hit allowed
-- at time `taken` (Redis Cluster: a group spanning slots is decided slot by slot,
-- and a later slot's refusal refunds the earlier ones; approximate mode: units a
-- process reserved and did not use). A refund never gives back more than the hit
-- still holds, so it never over-admits.
--
-- Stored values keep one format across versions (a fleet upgraded one process at a
-- time runs old and new scripts on the same keys): a number, or numbers joined
-- with ':'. Numbers go to redis.call as Lua numbers (Redis renders them exactly);
-- joined numbers are integers and counts (exact to 14 digits).
local EPS = 1e-6
local INF = 1 / 0
local ALG = {}
local STEP = {}
local PARSE = {}
local RENDER = {}
local REFUND = {}

local function wait(deadline, now)
  if deadline > now then return deadline - now end
  return 0
end

local function px(seconds)
  return math.max(1, math.ceil(seconds * 1000) + 1)
end

-- What a reservation takes: `cost`, or up to `want` when more is `available`.
local function grant(cost, want, available)
  if want > cost and available > cost then return math.min(want, available) end
  return cost
end

-- Window counters: a string "<window index>:<count>[:<count>...]", parsed into
-- {index, count, ...}. window_index(t, window): the window `t` falls in.
local function window_index(t, window)
  return math.floor((t + EPS) / window)
end

local function parse_fields(raw)
  local fields = {}
  for field in string.gmatch(raw, '[^:]+') do fields[#fields + 1] = tonumber(field) end
  return fields
end

-- The current window index (never behind the stored one, so a clock stepping back
-- does not reopen a window), the stored index (nil without state) and the counts.
local function current_window(state, window, now)
  local index = window_index(now, window)
  if not state then return index, nil end
  local stored = state[1]
  if stored > index then index = stored end
  return index, stored
end

-- For the refunds, which work on Redis directly: read_window(key, window, now)
-- is current_window of the stored value, with its counts.
local function read_window(key, window, now)
  local raw = redis.call('GET', key)
  if not raw then return window_index(now, window), nil, {} end
  local state = parse_fields(raw)
  local index, stored = current_window(state, window, now)
  table.remove(state, 1)
  return index, stored, state
end

-- Rewrite a string value, keeping the key's expiry.
local function set_keep_ttl(key, value)
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then redis.call('SET', key, value, 'PX', ttl) else redis.call('SET', key, value) end
end
