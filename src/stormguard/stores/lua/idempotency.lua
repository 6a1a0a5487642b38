-- Idempotency claims (core/_idempotency.py has the table these rules follow).
-- KEYS[1]: the claim hash {s = p|d, f = fingerprint, o = owner, u = until (ms), r = response}.
-- ARGV: op, then
--   claim:    fingerprint, owner, lease_ms
--   complete: owner, ttl_ms, response
--   release:  owner
-- Time is Redis' own (TIME), so every process agrees on when a lease ends.
local key, op = KEYS[1], ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local e = redis.call('HMGET', key, 's', 'f', 'o', 'u', 'r')
local state, fp, owner, untl = e[1], e[2], e[3], tonumber(e[4] or 0)
if state and untl <= now then state = false end  -- expired: absent

if op == 'claim' then
  if not state then
    local lease = tonumber(ARGV[4])
    redis.call('DEL', key)
    redis.call('HSET', key, 's', 'p', 'f', ARGV[2], 'o', ARGV[3], 'u', now + lease)
    redis.call('PEXPIRE', key, lease)
    return {'claimed'}
  end
  if fp ~= ARGV[2] then return {'mismatch'} end
  if state == 'p' then return {'in_flight', untl - now} end
  return {'replay', e[5]}
elseif op == 'complete' then
  if state ~= 'p' or owner ~= ARGV[2] then return {'refused'} end
  local ttl = tonumber(ARGV[3])
  redis.call('HSET', key, 's', 'd', 'u', now + ttl, 'r', ARGV[4])
  redis.call('PEXPIRE', key, ttl)
  return {'completed'}
elseif op == 'release' then
  if state == 'p' and owner == ARGV[2] then
    redis.call('DEL', key)
    return {'released'}
  end
  return {'kept'}
end
return redis.error_reply('idempotency: unknown op ' .. tostring(op))
