-- GCRA: string holding the theoretical arrival time; p1 = rate, p2 = burst.
-- (tat_step is defined in token_bucket.lua: the two are one meter.)
STEP.gcra = tat_step
PARSE.gcra = tonumber
RENDER.gcra = RENDER.token_bucket

REFUND.gcra = function(key, aux, rate, burst, cost, lease, taken, now)
  tat_refund(key, rate, cost, taken, now)
end
