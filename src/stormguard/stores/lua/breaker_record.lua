--#include _helpers
-- Circuit breaker: record the outcome of an admitted call ('ok', 'fail'), give a
-- probe's slot back without an outcome ('release'), or record a batch of closed
-- outcomes counted by a near-cached breaker ('batch': n_ok successes and n_fail
-- failures; 0 and 0 only reads the state). Rules: core/_breaker.py.
-- A result from an older generation (the breaker moved on since the call was
-- admitted, e.g. its probe lease expired) changes nothing.
--
-- KEYS: state hash, probe leases (zset), window hash
-- ARGV: failure_rate min_calls window kind buckets open_for open_for_max
--       half_open_probes probe_lease jitter draw ttl | generation probe lease_id outcome
--       n_ok n_fail [now (tests only)]
-- Returns {state, generation, remaining open time}
local H, L, W = KEYS[1], KEYS[2], KEYS[3]
local rate, min_calls = tonumber(ARGV[1]), tonumber(ARGV[2])
local window, kind, n = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local open_for, open_max = tonumber(ARGV[6]), tonumber(ARGV[7])
local probes = tonumber(ARGV[8])
local jitter, draw, ttl = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local rgen, is_probe, lease_id, outcome = tonumber(ARGV[13]), ARGV[14] == '1', ARGV[15], ARGV[16]
local n_ok, n_fail = 0, 0
if outcome == 'batch' then
  n_ok, n_fail = tonumber(ARGV[17]), tonumber(ARGV[18])
elseif outcome == 'ok' then
  n_ok = 1
elseif outcome == 'fail' then
  n_fail = 1
end
local now = clock_now(ARGV[19])

local s = redis.call('HMGET', H, 'st', 'gen', 'until', 'reo', 'padm', 'psucc')
local st = s[1] or 'closed'
local gen = tonumber(s[2]) or 0
local open_until = tonumber(s[3]) or 0
local reo = tonumber(s[4]) or 0
local padm = tonumber(s[5]) or 0
local psucc = tonumber(s[6]) or 0

-- TRIP (bump = false) or PROBE_FAILED / LEASE_EXPIRED (bump = true)
local function open(bump)
  if bump then reo = reo + 1 end
  local base = math.min(open_for * 2 ^ math.min(reo, 64), open_max)
  st, gen = 'open', gen + 1
  open_until = now + base * (1 - jitter * draw)
  redis.call('HSET', H, 'st', st, 'gen', gen, 'until', fmt(open_until), 'reo', reo,
    'padm', 0, 'psucc', 0)
  redis.call('DEL', L)
end

-- PROBE_SUCCEEDED: close, empty the window, forget re-opens.
local function close()
  st, gen = 'closed', gen + 1
  redis.call('HSET', H, 'st', st, 'gen', gen, 'until', 0, 'reo', 0, 'padm', 0, 'psucc', 0,
    'idx', -1, 'calls', 0, 'fails', 0, 'pos', 0)
  redis.call('DEL', L, W)
end

-- Transitions due by time alone.
if st == 'open' and now >= open_until then
  st, gen = 'half_open', gen + 1
  redis.call('HSET', H, 'st', st, 'gen', gen, 'padm', 0, 'psucc', 0)
  redis.call('DEL', L)
elseif st == 'half_open' then
  local first = redis.call('ZRANGE', L, 0, 0, 'WITHSCORES')
  if first[2] and tonumber(first[2]) <= now then open(true) end
end

if rgen == gen then
  local failure = outcome == 'fail'
  if st == 'closed' and n_ok + n_fail > 0 then
    local w = redis.call('HMGET', H, 'idx', 'calls', 'fails', 'pos')
    local last = tonumber(w[1]) or -1
    local calls, fails = tonumber(w[2]) or 0, tonumber(w[3]) or 0
    local pos = tonumber(w[4]) or 0
    if kind == 'time' then
      last, calls, fails = ring_roll(W, 'c', 'f', n, window, now, last, calls, fails)
      local j = last % n
      redis.call('HINCRBY', W, 'c' .. j, n_ok + n_fail)
      if n_fail > 0 then redis.call('HINCRBY', W, 'f' .. j, n_fail) end
      calls = calls + n_ok + n_fail
      fails = fails + n_fail
    else
      -- Count window: a ring of the last n outcomes. A batch goes in as its
      -- successes, then its failures (only the last n of them matter).
      local keep_fail = math.min(n_fail, n)
      local keep_ok = math.min(n_ok, n - keep_fail)
      for i = 1, keep_ok + keep_fail do
        local bad = i > keep_ok
        if calls >= n then
          if redis.call('HGET', W, 'r' .. pos) == '1' then fails = fails - 1 end
        else
          calls = calls + 1
        end
        redis.call('HSET', W, 'r' .. pos, bad and 1 or 0)
        if bad then fails = fails + 1 end
        pos = (pos + 1) % n
      end
    end
    redis.call('HSET', H, 'idx', last, 'calls', calls, 'fails', fails, 'pos', pos)
    if fails > 0 and calls >= min_calls and fails >= rate * calls then open(false) end
  elseif st == 'half_open' and is_probe then
    local removed = redis.call('ZREM', L, lease_id)
    if removed == 1 then
      if outcome == 'release' then
        redis.call('HSET', H, 'padm', math.max(0, padm - 1))
      elseif failure then
        open(true)
      else
        psucc = psucc + 1
        if psucc >= probes then close() else redis.call('HSET', H, 'psucc', psucc) end
      end
    end
  end
end

local ms = math.ceil(ttl * 1000)
if open_until > 1e299 then redis.call('PERSIST', H) else redis.call('PEXPIRE', H, ms) end
redis.call('PEXPIRE', L, ms)
redis.call('PEXPIRE', W, ms)
local remaining = 0
if st == 'open' then remaining = math.max(0, open_until - now) end
return {st, gen, fmt(remaining)}
