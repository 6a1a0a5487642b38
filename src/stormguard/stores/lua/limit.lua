-- Driver. ARGV[1] = mode.
--   "hit": ARGV[2] = n, then per limit 5 values: kind, p1, p2, cost, lease.
--          KEYS = key1, aux1, key2, aux2, ... Returns {all_allowed, then per limit
--          allowed, remaining, reset_after, retry_after} (numbers as strings).
--          All or nothing: if one limit denies, nothing is written anywhere.
--   "release" / "renew": KEYS = key, aux; ARGV[2] = lease, ARGV[3] = lease seconds.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local mode = ARGV[1]
if mode == 'release' then return conc_release(KEYS[1], KEYS[2], ARGV[2], now) end
if mode == 'renew' then
  return conc_renew(KEYS[1], KEYS[2], ARGV[2], tonumber(ARGV[3]), now)
end

local n = tonumber(ARGV[2])
local function run(i, cost, write)
  local b = 2 + (i - 1) * 5
  local f = ALG[ARGV[b + 1]]
  if cost == nil then cost = tonumber(ARGV[b + 4]) end
  return f(KEYS[2 * i - 1], KEYS[2 * i], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]),
    now, cost, ARGV[b + 5], write)
end

local results = {}
local all = true
for i = 1, n do
  local ok, remaining, reset, retry = run(i, nil, n == 1)
  results[i] = {ok, remaining, reset, retry}
  if not ok then all = false end
end
if n > 1 then
  for i = 1, n do
    if all then
      results[i] = {run(i, nil, true)}
    elseif results[i][1] then
      local _, remaining, reset = run(i, 0, false)
      results[i] = {true, remaining, reset, 0}
    end
  end
end
local out = {all and 1 or 0}
for i = 1, n do
  local r = results[i]
  out[#out + 1] = r[1] and 1 or 0
  out[#out + 1] = fmt(r[2])
  out[#out + 1] = fmt(r[3])
  out[#out + 1] = fmt(r[4])
end
return out
