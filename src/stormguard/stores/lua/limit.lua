-- Driver. ARGV[1] = mode.
--   "b" (batch): groups follow one after the other until ARGV ends. A group is a
--          header h = 4 * n + flags (n limits; flags: 1 = quiet, 2 = decide only
--          if the group before it committed), then per limit 3 values: spec
--          ("<kind>:<p1>:<p2>"), cost, extra (concurrency: the lease; else a
--          reservation size >= cost, or ""). KEYS: per limit its key, plus its aux
--          key for concurrency. Each group is all or nothing: if one of its limits
--          denies, nothing of that group is written. A batch shares one TIME.
--          Reply: the TIME stamp ("<seconds>.<microseconds>"), then per group a
--          flag -- 0 refused, 1 committed, 2 committed and quiet (nothing more
--          follows), 3 skipped (its condition failed; nothing follows) -- and for
--          flags 0 and 1, per limit: allowed, remaining, reset_after, retry_after
--          (then `granted` for a reservation), as integer micro-units (remaining
--          and granted rounded down, waits rounded up; retry_after -1 = never).
--   "refund": ARGV[2] = the stamp of the hit being given back, then one group as
--          in "b" (header, limits). Refunds every limit of the group, then answers
--          as "b" with that group at cost 0 (the quotas as they are now).
--   "g" (give back reservations): per key (one-string kinds only) ARGV holds
--          spec, units, stamp of the reservation. Reply: the number given back.
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

local function stamp_time(s)
  local seconds, us = string.match(s, '^(%d+)%.(%d+)$')
  return tonumber(seconds) + tonumber(us) / 1000000
end

-- spec string -> {kind, p1, p2}, parsed once per script call.
local SPECS = {}
local function spec_of(s)
  local spec = SPECS[s]
  if spec == nil then
    local kind, p1, p2 = string.match(s, '^([%a_]+):([^:]+):([^:]+)$')
    spec = {kind, tonumber(p1), tonumber(p2)}
    SPECS[s] = spec
  end
  return spec
end

if mode == 'g' then
  local given = 0
  for i = 1, #KEYS do
    local b = 2 + (i - 1) * 3
    local spec = spec_of(ARGV[b])
    REFUND[spec[1]](KEYS[i], nil, spec[2], spec[3], tonumber(ARGV[b + 1]), '',
      stamp_time(ARGV[b + 2]), now)
    given = given + 1
  end
  return given
end

local peek = nil  -- a refund answers with the quotas left: a hit of cost 0
local a = 2  -- next ARGV index
if mode == 'refund' then
  local taken = stamp_time(ARGV[2])
  local h = tonumber(ARGV[3])
  local k = 0
  for i = 1, math.floor(h / 4) do
    local b = 4 + (i - 1) * 3
    local spec = spec_of(ARGV[b])
    local aux = nil
    if spec[1] == 'concurrency' then aux = KEYS[k + 2] end
    REFUND[spec[1]](KEYS[k + 1], aux, spec[2], spec[3], tonumber(ARGV[b + 1]), ARGV[b + 2],
      taken, now)
    k = k + (aux and 2 or 1)
  end
  peek = 0
  a = 3
elseif mode ~= 'b' then
  return redis.error_reply('unknown mode ' .. tostring(mode))
end

-- One-string states of this call: key -> parsed state (false: none), and the keys
-- to write at the end with their kind and time to live.
local CACHE = {}
local DIRTY = {}
local DIRTY_ORDER = {}

local function state_of(key, kind)
  local state = CACHE[key]
  if state == nil then
    local raw = redis.call('GET', key)
    state = raw and PARSE[kind](raw) or false
    CACHE[key] = state
  end
  return state or nil
end

local out = {stamp}
local k = 0  -- KEYS consumed
local committed = true  -- the previous group's outcome (for conditional groups)
local argc = #ARGV
while a <= argc do
  local h = tonumber(ARGV[a])
  local n = math.floor(h / 4)
  local quiet = h % 2 == 1
  local conditional = h % 4 >= 2
  local base = a + 1
  if conditional and not committed then
    out[#out + 1] = 3
    for i = 1, n do
      if spec_of(ARGV[base + (i - 1) * 3])[1] == 'concurrency' then k = k + 2 else k = k + 1 end
    end
  else
    local rows = {}
    local all = true
    local kk = k
    for i = 1, n do
      local b = base + (i - 1) * 3
      local spec = spec_of(ARGV[b])
      local kind = spec[1]
      local cost = peek or tonumber(ARGV[b + 1])
      local extra = ARGV[b + 2]
      local row
      if STEP[kind] then
        local key = KEYS[kk + 1]
        kk = kk + 1
        local want = cost
        if extra ~= '' and peek == nil then want = tonumber(extra) end
        local state = state_of(key, kind)
        local ok, new, remaining, reset, retry, granted =
          STEP[kind](state, spec[2], spec[3], now, cost, want)
        row = {ok, remaining, reset, retry, granted, key, kind, new, state, want > cost}
      else
        local key, aux = KEYS[kk + 1], KEYS[kk + 2]
        if kind == 'sliding_window_log' then kk = kk + 1 else kk = kk + 2 end
        local ok, remaining, reset, retry =
          ALG[kind](key, aux, spec[2], spec[3], now, cost, extra, n == 1, stamp)
        row = {ok, remaining, reset, retry, 0, key, kind, nil, nil, false, aux, cost, extra}
      end
      rows[i] = row
      if not row[1] then all = false end
    end
    if all then
      for i = 1, n do
        local r = rows[i]
        if STEP[r[7]] then
          if r[8] ~= nil and r[5] > 0 then
            CACHE[r[6]] = r[8]
            if DIRTY[r[6]] == nil then DIRTY_ORDER[#DIRTY_ORDER + 1] = r[6] end
            DIRTY[r[6]] = {r[7], r[3]}
          end
        elseif n > 1 then
          local spec = spec_of(ARGV[base + (i - 1) * 3])
          rows[i] = {ALG[r[7]](r[6], r[11], spec[2], spec[3], now, r[12], r[13], true, stamp)}
        end
      end
    else  -- nothing taken: the admitting limits report their quota untouched
      for i = 1, n do
        local r = rows[i]
        if r[1] then
          local spec = spec_of(ARGV[base + (i - 1) * 3])
          local ignored, remaining, reset
          if STEP[r[7]] then
            ignored, ignored, remaining, reset = STEP[r[7]](r[9], spec[2], spec[3], now, 0, 0)
          else
            ignored, remaining, reset =
              ALG[r[7]](r[6], r[11], spec[2], spec[3], now, 0, '', false, stamp)
          end
          rows[i] = {true, remaining, reset, 0, 0, r[6], r[7], nil, nil, r[10]}
        end
      end
    end
    committed = all
    k = kk
    if all and quiet then
      out[#out + 1] = 2
    else
      out[#out + 1] = all and 1 or 0
      for i = 1, n do
        local r = rows[i]
        out[#out + 1] = r[1] and 1 or 0
        out[#out + 1] = math.floor(math.max(0, r[2]) * 1000000 + 1e-3)
        out[#out + 1] = math.ceil(math.max(0, r[3]) * 1000000 - 1e-3)
        if r[4] == INF then
          out[#out + 1] = -1
        else
          out[#out + 1] = math.ceil(math.max(0, r[4]) * 1000000 - 1e-3)
        end
        if r[10] then out[#out + 1] = math.floor(r[5] * 1000000 + 1e-3) end
      end
    end
  end
  a = base + 3 * n
end

for _, key in ipairs(DIRTY_ORDER) do
  local d = DIRTY[key]
  redis.call('SET', key, RENDER[d[1]](CACHE[key]), 'PX', px(d[2]))
end
return out
