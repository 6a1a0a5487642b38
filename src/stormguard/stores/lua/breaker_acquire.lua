--#include _helpers
-- Circuit breaker: admit or refuse one call (or, with peek, just read the state).
-- The rules are the table in core/_breaker.py; this script applies the
-- transitions that happen by time alone (OPEN_ELAPSED, LEASE_EXPIRED) and hands
-- out half-open probe leases, at most `half_open_probes` per generation, so the
-- limit holds across every process sharing the key. Time is Redis' own (TIME).
--
-- KEYS: state hash, probe leases (zset id -> expiry), window hash
-- ARGV: failure_rate min_calls window kind buckets open_for open_for_max
--       half_open_probes probe_lease jitter draw ttl | peek [now (tests only)]
-- Returns {allowed, probe, generation, remaining, lease_id, state}
local H, L, W = KEYS[1], KEYS[2], KEYS[3]
local open_for, open_max = tonumber(ARGV[6]), tonumber(ARGV[7])
local probes, lease = tonumber(ARGV[8]), tonumber(ARGV[9])
local jitter, draw, ttl = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local peek = ARGV[13] == '1'
local now = clock_now(ARGV[14])

local s = redis.call('HMGET', H, 'st', 'gen', 'until', 'reo', 'padm')
local st = s[1] or 'closed'
local gen = tonumber(s[2]) or 0
local open_until = tonumber(s[3]) or 0
local reo = tonumber(s[4]) or 0
local padm = tonumber(s[5]) or 0
local dirty = false

local function first_lease()
  local first = redis.call('ZRANGE', L, 0, 0, 'WITHSCORES')
  return tonumber(first[2])
end

-- LEASE_EXPIRED: a hung probe counts as a failed one (reopens + 1).
local function reopen()
  reo = reo + 1
  local base = math.min(open_for * 2 ^ math.min(reo, 64), open_max)
  st, gen, padm = 'open', gen + 1, 0
  open_until = now + base * (1 - jitter * draw)
  redis.call('HSET', H, 'st', st, 'gen', gen, 'until', fmt(open_until), 'reo', reo,
    'padm', 0, 'psucc', 0)
  redis.call('DEL', L)
end

if st == 'open' and now >= open_until then
  -- OPEN_ELAPSED
  st, gen, padm = 'half_open', gen + 1, 0
  redis.call('HSET', H, 'st', st, 'gen', gen, 'padm', 0, 'psucc', 0)
  redis.call('DEL', L)
  dirty = true
elseif st == 'half_open' then
  local expiry = first_lease()
  if expiry and expiry <= now then
    reopen()
    dirty = true
  end
end

local allowed, probe, remaining, lease_id = 0, 0, 0, ''
if st == 'open' then
  remaining = math.max(0, open_until - now)
elseif not peek then
  if st == 'closed' then
    allowed = 1
  elseif padm < probes then
    padm = padm + 1
    lease_id = gen .. ':' .. redis.call('HINCRBY', H, 'lseq', 1)
    redis.call('HSET', H, 'padm', padm)
    redis.call('ZADD', L, fmt(now + lease), lease_id)
    allowed, probe, dirty = 1, 1, true
  else
    local expiry = first_lease()
    if expiry then remaining = math.max(0, expiry - now) end
  end
end

if dirty then
  local ms = math.ceil(ttl * 1000)
  if open_until > 1e299 then redis.call('PERSIST', H) else redis.call('PEXPIRE', H, ms) end
  redis.call('PEXPIRE', L, ms)
end
return {allowed, probe, gen, fmt(remaining), lease_id, st}
