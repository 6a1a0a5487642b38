--#include _helpers
-- Cooldown: the pause of one origin, shared by every process (rules:
-- protection/_cooldown.py). The key holds the pause's end on Redis' clock; its
-- TTL only lets an ended pause expire. A pause is only ever extended.
--
-- KEYS: pause key. ARGV: op ("pause" | "remaining") seconds [now (tests only)]
-- Returns the seconds the origin stays paused, as a string.
local K = KEYS[1]
local op, seconds = ARGV[1], tonumber(ARGV[2])
local now = clock_now(ARGV[3])

local ends = tonumber(redis.call('GET', K)) or 0
if op == 'pause' then
  if now + seconds > ends then
    ends = now + seconds
    redis.call('SET', K, fmt(ends), 'PX', math.ceil(seconds * 1000) + 1000)
  end
elseif op ~= 'remaining' then
  return redis.error_reply('cooldown.lua: unknown op ' .. tostring(op))
end
return fmt(math.max(0, ends - now))
