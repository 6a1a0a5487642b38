-- Helpers of the shared-protection scripts (breaker_*.lua, budget.lua,
-- cooldown.lua). A script names this file on a `--#include _helpers` line and the
-- store places it in front (stores/_scripts.py); the rules live in core/.

-- Now, in seconds: Redis' own clock (TIME), so every process agrees. `arg` is an
-- ARGV slot after the script's own arguments that only the test suite fills, to run
-- the scripts under a fake clock; the library never passes it.
local function clock_now(arg)
  local now = tonumber(arg)
  if now then return now end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end

-- A sliding time window of two counters as a ring of `n` buckets over `window`
-- seconds (core/_window.py): the hash B holds the bucket counts as fields
-- <a><slot> and <b><slot>; `last` is the newest bucket number (-1: none yet) and
-- ta, tb the running totals. Clears the buckets skipped up to the bucket of `now`
-- (at most n) and returns the newest bucket number and the new totals.
local function ring_roll(B, a, b, n, window, now, last, ta, tb)
  local idx = math.floor(now * n / window)
  if idx > last then
    for i = math.max(last + 1, idx - n + 1), idx do
      local j = i % n
      local old = redis.call('HMGET', B, a .. j, b .. j)
      ta = ta - (tonumber(old[1]) or 0)
      tb = tb - (tonumber(old[2]) or 0)
      redis.call('HDEL', B, a .. j, b .. j)
    end
    last = idx
  end
  return last, ta, tb
end

local function fmt(x)
  return string.format('%.17g', x)
end
