-- Token bucket, stored as its theoretical arrival time (one number): the bucket
-- is full at `tat`, and holds burst - (tat - now) * rate tokens at `now`. This is
-- the same meter as GCRA (see gcra.lua), so both admit exactly the same hits.
-- p1 = rate, p2 = burst.
local function tat_meter(key, rate, burst, now, cost, write)
  local tat = tonumber(redis.call('GET', key))
  if tat == nil or tat < now then tat = now end
  local tau = burst / rate
  local remaining = (tau - (tat - now)) * rate
  if cost > burst then return false, remaining, tat - now, INF end
  local new_tat = tat + cost / rate
  local allow_at = new_tat - tau
  if allow_at > now + EPS then return false, remaining, tat - now, allow_at - now end
  if write and cost > 0 then
    redis.call('SET', key, new_tat, 'PX', px(new_tat - now))
  end
  return true, (tau - (new_tat - now)) * rate, new_tat - now, 0
end

ALG.token_bucket = function(key, aux, rate, burst, now, cost, lease, write)
  return tat_meter(key, rate, burst, now, cost, write)
end

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
