-- Circuit breaker: RESET. Closed, empty window, re-opens forgotten, in every process.
-- KEYS: state hash, probe leases, window hash. ARGV: ttl. Returns {state, generation}
local H, L, W = KEYS[1], KEYS[2], KEYS[3]
local gen = (tonumber(redis.call('HGET', H, 'gen')) or 0) + 1
redis.call('HSET', H, 'st', 'closed', 'gen', gen, 'until', 0, 'reo', 0, 'padm', 0,
  'psucc', 0, 'idx', -1, 'calls', 0, 'fails', 0, 'pos', 0)
redis.call('DEL', L, W)
redis.call('PEXPIRE', H, math.ceil(tonumber(ARGV[1]) * 1000))
return {'closed', gen}
