--#include _helpers
-- Retry budget (rules: core/_budget.py), one script for both operations.
-- KEYS: budget hash. ARGV: ratio reserve window buckets op [now (tests only)]
--   op = "request": deposit one first attempt; returns the balance (retries still
--                   allowed) as a string.
--   op = "retry":   withdraw one retry if  retries + 1 <= ratio * first_attempts + reserve
--                   over the window (a new budget starts at the reserve, not full);
--                   returns 1 (allowed, withdrawn) or 0.
-- The hash holds per-bucket counts q<j> (first attempts) and r<j> (retries), the
-- running totals q and r, and idx (the newest bucket). Time is Redis' (TIME).
local H = KEYS[1]
local ratio, reserve = tonumber(ARGV[1]), tonumber(ARGV[2])
local window, n = tonumber(ARGV[3]), tonumber(ARGV[4])
local op = ARGV[5]
local now = clock_now(ARGV[6])

-- Roll the window: drop the buckets that have aged out since the last call.
local s = redis.call('HMGET', H, 'idx', 'q', 'r')
local last, q, r = tonumber(s[1]) or -1, tonumber(s[2]) or 0, tonumber(s[3]) or 0
last, q, r = ring_roll(H, 'q', 'r', n, window, now, last, q, r)

local reply
if op == 'request' then
  redis.call('HINCRBY', H, 'q' .. (last % n), 1)
  q = q + 1
  reply = fmt(ratio * q + reserve - r)
elseif op == 'retry' then
  reply = 0
  if r + 1 <= ratio * q + reserve then
    redis.call('HINCRBY', H, 'r' .. (last % n), 1)
    r = r + 1
    reply = 1
  end
else
  return redis.error_reply('budget.lua: unknown op ' .. tostring(op))
end
redis.call('HSET', H, 'idx', last, 'q', q, 'r', r)
redis.call('PEXPIRE', H, math.ceil(window * 2000))
return reply
