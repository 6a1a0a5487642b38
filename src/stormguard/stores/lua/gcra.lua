-- GCRA: string holding the theoretical arrival time; p1 = rate, p2 = burst.
-- (tat_meter is defined in token_bucket.lua: the two are one meter.)
ALG.gcra = function(key, aux, rate, burst, now, cost, lease, write)
  return tat_meter(key, rate, burst, now, cost, write)
end

REFUND.gcra = function(key, aux, rate, burst, cost, lease, taken, now)
  tat_refund(key, rate, cost, taken, now)
end
