-- Driver. ARGV[1] = mode.
--   "hit": ARGV[2] = number of groups; then per group: n, and per limit 5 values
--          (kind, p1, p2, cost, lease). KEYS = key, aux for every limit in order.
--          Each group is all or nothing: if one of its limits denies, nothing of
--          that group is written. A batch of groups shares one TIME reading.
--          Reply: the TIME stamp of the decision ("<seconds>.<microseconds>"),
--          then per group: all_allowed, then per limit: allowed, remaining,
--          reset_after, retry_after, the last three as integer micro-units
--          (remaining rounded down, waits rounded up; retry_after -1 = never).
--   "refund": as "hit" with one group, plus ARGV[#ARGV] = the stamp of the hit
--          being given back. Refunds every limit of the group, then answers as a
--          "hit" of cost 0 (the quotas as they are after the refund).
--   "release" / "renew": KEYS = key, aux; ARGV[2] = lease, ARGV[3] = lease seconds.
if redis.replicate_commands then redis.replicate_commands() end  -- TIME then writes (Redis < 5)
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local stamp = t[1] .. '.' .. t[2]
local mode = ARGV[1]
if mode == 'release' then return conc_release(KEYS[1], KEYS[2], ARGV[2], now) end
if mode == 'renew' then
  return conc_renew(KEYS[1], KEYS[2], ARGV[2], tonumber(ARGV[3]), now)
end
if mode ~= 'hit' and mode ~= 'refund' then
  return redis.error_reply('unknown mode ' .. tostring(mode))
end

local peek = nil  -- a refund answers with the quotas left: a hit of cost 0
if mode == 'refund' then
  local s, us = string.match(ARGV[#ARGV], '^(%d+)%.(%d+)$')
  local taken = tonumber(s) + tonumber(us) / 1000000
  for i = 1, tonumber(ARGV[3]) do
    local b = 4 + (i - 1) * 5
    REFUND[ARGV[b]](KEYS[2 * i - 1], KEYS[2 * i], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
      tonumber(ARGV[b + 3]), ARGV[b + 4], taken, now)
  end
  peek = 0
end

local out = {stamp}
local a, k = 3, 0  -- next ARGV index, KEYS consumed

local function run(base, i, cost, write)
  local b = base + (i - 1) * 5
  if cost == nil then cost = tonumber(ARGV[b + 3]) end
  return ALG[ARGV[b]](KEYS[k + 2 * i - 1], KEYS[k + 2 * i], tonumber(ARGV[b + 1]),
    tonumber(ARGV[b + 2]), now, cost, ARGV[b + 4], write, stamp)
end

for _ = 1, tonumber(ARGV[2]) do
  local n = tonumber(ARGV[a])
  local base = a + 1
  local results = {}
  local all = true
  for i = 1, n do
    local ok, remaining, reset, retry = run(base, i, peek, n == 1)
    results[i] = {ok, remaining, reset, retry}
    if not ok then all = false end
  end
  if n > 1 then
    for i = 1, n do
      if all then
        results[i] = {run(base, i, peek, true)}
      elseif results[i][1] then
        local _, remaining, reset = run(base, i, 0, false)
        results[i] = {true, remaining, reset, 0}
      end
    end
  end
  out[#out + 1] = all and 1 or 0
  for i = 1, n do
    local r = results[i]
    out[#out + 1] = r[1] and 1 or 0
    out[#out + 1] = math.floor(math.max(0, r[2]) * 1000000 + 1e-3)
    out[#out + 1] = math.ceil(math.max(0, r[3]) * 1000000 - 1e-3)
    if r[4] == INF then
      out[#out + 1] = -1
    else
      out[#out + 1] = math.ceil(math.max(0, r[4]) * 1000000 - 1e-3)
    end
  end
  a = base + 5 * n
  k = k + 2 * n
end
return out
