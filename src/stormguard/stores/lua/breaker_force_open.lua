-- Circuit breaker: FORCE_OPEN. Open until reset, in every process; never expires.
-- KEYS: state hash, probe leases, window hash. Returns {state, generation}
local H, L = KEYS[1], KEYS[2]
local gen = (tonumber(redis.call('HGET', H, 'gen')) or 0) + 1
redis.call('HSET', H, 'st', 'open', 'gen', gen, 'until', '1e300', 'padm', 0, 'psucc', 0)
redis.call('DEL', L)
redis.call('PERSIST', H)
return {'open', gen}
