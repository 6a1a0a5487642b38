-- GCRA: string holding the theoretical arrival time; p1 = rate, p2 = burst.
ALG.gcra = function(key, aux, rate, burst, now, cost, lease, write)
  local tat = tonumber(redis.call('GET', key))
  if tat == nil or tat < now then tat = now end
  local tau = burst / rate
  if cost > burst then return false, (tau - (tat - now)) * rate, tat - now, INF end
  local new_tat = tat + cost / rate
  local allow_at = new_tat - tau
  if allow_at > now + EPS then
    return false, (tau - (tat - now)) * rate, tat - now, allow_at - now
  end
  if write and cost > 0 then
    redis.call('SET', key, fmt(new_tat))
    expire(key, new_tat - now)
  end
  return true, (tau - (new_tat - now)) * rate, new_tat - now, 0
end
