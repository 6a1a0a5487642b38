# Proactive pacing from rate-limit headers.
#
# A client that reads `remaining` and `reset` can see a 429 coming. Rule: when a
# quota's remaining falls under `threshold` (10 %) of its limit, the requests it
# has left are spread evenly over the time to its reset instead of being spent at
# once:
#
#     interval = reset_after / remaining         (remaining >= 1)
#     wait until reset                           (remaining == 0)
#
# Each quota name is its own pool (GitHub `core` and `search` are separate): a
# request waits for the latest slot among the paced pools it may draw on. Slots
# are handed out one by one (reserve), so concurrent callers queue behind each
# other instead of all waking at the same instant. A pool stops pacing at its
# reset time; a later observation above the threshold ends it early.
#
# Pure: takes quotas (anything with name/limit/remaining/reset_after, such as
# stormguard.Quota) and `now`; returns how long to wait.
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from .._errors import ConfigError

__all__ = ["PaceSlot", "PacerCore", "QuotaLike"]


class QuotaLike(Protocol):
    """The fields of stormguard.Quota that pacing reads."""

    @property
    def name(self) -> str | None: ...

    @property
    def limit(self) -> float | None: ...

    @property
    def remaining(self) -> float | None: ...

    @property
    def reset_after(self) -> float | None: ...


@dataclass(slots=True)
class PaceSlot:
    """Pacing state of one quota pool."""

    interval: float  # seconds between requests while paced
    next_at: float  # earliest time of the next request
    reset_at: float  # pacing ends here: the quota refills


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class PacerCore:
    """Per-quota-name pacing decisions. Not thread-safe; never reads time."""

    __slots__ = ("max_wait", "pools", "threshold")

    def __init__(self, *, threshold: float = 0.1, max_wait: float = 3600.0) -> None:
        if not _real(threshold) or not 0.0 < threshold <= 1.0:
            raise ConfigError("threshold", f"must be in (0, 1], got {threshold!r}")
        if not _real(max_wait) or not max_wait >= 0.0:
            raise ConfigError("max_wait", f"must be >= 0 seconds, got {max_wait!r}")
        self.threshold = threshold
        self.max_wait = max_wait
        self.pools: dict[str, PaceSlot] = {}

    def observe(self, quotas: Iterable[QuotaLike], now: float) -> None:
        """Take the quotas a response reported at ``now``."""
        for quota in quotas:
            name = quota.name or "default"
            limit, remaining, reset_after = quota.limit, quota.remaining, quota.reset_after
            if remaining is None or reset_after is None:
                continue
            reset_after = min(max(0.0, reset_after), self.max_wait)
            if limit is not None and limit > 0 and remaining >= self.threshold * limit:
                self.pools.pop(name, None)  # plenty left: not paced
                continue
            if limit is None and remaining > 0:
                continue  # no limit to compare against: only an empty quota paces
            reset_at = now + reset_after
            slot = self.pools.get(name)
            if remaining < 1:
                # Empty: nothing may go before the reset.
                next_at = reset_at if slot is None else max(slot.next_at, reset_at)
                self.pools[name] = PaceSlot(0.0, next_at, reset_at)
                continue
            interval = reset_after / remaining
            if slot is None or slot.reset_at <= now:
                self.pools[name] = PaceSlot(interval, now, reset_at)
            else:
                # Keep the slots already handed out; re-space the rest.
                slot.interval = interval
                slot.reset_at = reset_at
                slot.next_at = min(slot.next_at, reset_at)

    def delay(self, now: float) -> float:
        """Seconds the next request would wait at ``now``, without reserving."""
        wait = 0.0
        for slot in self.pools.values():
            if slot.reset_at > now or slot.next_at > now:
                wait = max(wait, slot.next_at - now)
        return wait

    def reserve(self, now: float, limit: float = math.inf) -> float:
        """Take the next slot: seconds to wait from ``now`` before sending.

        When the wait would exceed ``limit`` nothing is taken and the wait is
        returned as it is (the caller fails fast instead of waiting).
        """
        if not self.pools:
            return 0.0
        wait = 0.0
        for name, slot in list(self.pools.items()):
            if slot.reset_at <= now and slot.next_at <= now:
                del self.pools[name]  # refilled: pacing over
                continue
            wait = max(wait, slot.next_at - now)
        if wait > limit:
            return wait
        at = now + wait
        for slot in self.pools.values():
            slot.next_at = max(slot.next_at, at + slot.interval)
        return wait
