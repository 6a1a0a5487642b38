-- Retry budget: withdraw one retry if  retries + 1 <= ratio * first_attempts + reserve
-- over the window (rules: core/_budget.py). Starts at the reserve, not full.
-- KEYS: budget hash. ARGV: ratio reserve window buckets
-- Returns 1 (allowed, withdrawn) or 0.
local H = KEYS[1]
local ratio, reserve = tonumber(ARGV[1]), tonumber(ARGV[2])
local window, n = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6

local s = redis.call('HMGET', H, 'idx', 'q', 'r')
local last, q, r = tonumber(s[1]) or -1, tonumber(s[2]) or 0, tonumber(s[3]) or 0
local idx = math.floor(now * n / window)
if idx > last then
  for i = math.max(last + 1, idx - n + 1), idx do
    local j = i % n
    local old = redis.call('HMGET', H, 'q' .. j, 'r' .. j)
    q = q - (tonumber(old[1]) or 0)
    r = r - (tonumber(old[2]) or 0)
    redis.call('HDEL', H, 'q' .. j, 'r' .. j)
  end
  last = idx
end
local allowed = 0
if r + 1 <= ratio * q + reserve then
  redis.call('HINCRBY', H, 'r' .. (last % n), 1)
  r = r + 1
  allowed = 1
end
redis.call('HSET', H, 'idx', last, 'q', q, 'r', r)
redis.call('PEXPIRE', H, math.ceil(window * 2000))
return allowed
