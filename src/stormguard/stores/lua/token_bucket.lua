-- Token bucket, stored as its theoretical arrival time (one number): the bucket
-- is full at `tat`, and holds burst - (tat - now) * rate tokens at `now`. This is
-- the same meter as GCRA (see gcra.lua), so both admit exactly the same hits.
-- p1 = rate, p2 = burst.
local function tat_step(tat, rate, burst, now, cost, want)
  if tat == nil or tat < now then tat = now end
  local tau = burst / rate
  local remaining = (tau - (tat - now)) * rate
  if cost > burst then return false, nil, remaining, tat - now, INF, 0 end
  local allow_at = tat + cost / rate - tau
  if allow_at > now + EPS then return false, nil, remaining, tat - now, allow_at - now, 0 end
  local granted = grant(cost, want, remaining)
  local new_tat = tat + granted / rate
  return true, new_tat, (tau - (new_tat - now)) * rate, new_tat - now, 0, granted
end

STEP.token_bucket = tat_step
PARSE.token_bucket = tonumber
RENDER.token_bucket = function(tat) return tat end

-- A hit's cost / rate stays in the meter until the meter drains past it (taken +
-- cost / rate); after that a full bucket may have absorbed it, so give back only
-- what is left of it.
local function tat_refund(key, rate, cost, taken, now)
  local tat = tonumber(redis.call('GET', key))
  if tat == nil then return end
  tat = tat - math.min(cost / rate, math.max(0, taken + cost / rate - now))
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, tat, 'PX', px(tat - now))
  end
end

REFUND.token_bucket = function(key, aux, rate, burst, cost, lease, taken, now)
  tat_refund(key, rate, cost, taken, now)
end
