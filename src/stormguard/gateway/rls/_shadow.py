# Limits that are decided and counted but never refuse (shadow_mode), in one place.
#
# This is the rate-limit service's stand-in for the gateway's shadow limits, which
# are being built as one mechanism in the server side's Rule/RuleSet: same meaning,
# and the one function to switch over when that lands. The meaning:
#
# * every limit of a request is decided in ONE store call (hit_many: all or nothing,
#   one Lua round trip on Redis), shadow limits included;
# * a shadow limit's refusal never refuses the request and never stops the other
#   limits from counting: when only shadow limits refused, the call is made once more
#   without them (the all-or-nothing call took nothing), so the enforced limits count
#   the hit and the refusing shadow limits keep their refusal as the record of what
#   they would have done (reason `shadow:<name>` where the gateway names reasons);
# * an enforced limit's refusal refuses the request, and then nothing is taken from
#   any limit, shadow ones included (a refused request costs nothing).
#
# `soft` generalises "shadow" to any limit whose refusal must not block the others:
# envoyproxy/ratelimit's quota_mode descriptors use it too (the caller decides what a
# soft refusal means for the answer).
from __future__ import annotations

from collections.abc import Sequence, Set

from ...core._decision import Decision
from ...limiting._limiter import AsyncRateLimiter

__all__ = ["hit_all"]


async def hit_all(
    items: Sequence[tuple[AsyncRateLimiter, str]], cost: float, soft: Set[int] = frozenset()
) -> list[Decision]:
    """One decision per ``(limiter, key)`` of ``items``, ``cost`` each, all or nothing.

    ``soft`` holds the indexes whose refusal must not refuse the others (shadow
    limits): see the module notes. One store call when no soft limit refuses; one
    more per round of soft refusals (at most ``len(soft)``, usually one).
    """
    decisions: list[Decision | None] = [None] * len(items)
    left = list(range(len(items)))
    while left:
        decision = await AsyncRateLimiter.hit_many([items[i] for i in left], cost)
        parts = decision.parts or (decision,)
        refused = [i for i, part in zip(left, parts) if not part.allowed]
        if not refused or any(i not in soft for i in refused):
            for i, part in zip(left, parts):
                decisions[i] = part
            break
        # Only soft limits refused: they keep their refusal, the others go again.
        for i, part in zip(left, parts):
            if not part.allowed:
                decisions[i] = part
        left = [i for i in left if decisions[i] is None]
    return [d for d in decisions if d is not None]
