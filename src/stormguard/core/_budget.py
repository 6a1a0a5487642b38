# The retry budget as a pure counter over a sliding window.
#
# A retry is allowed while, over the last `window` seconds,
#
#     retries + 1  <=  ratio * first_attempts  +  min_per_second * window
#
# i.e. every first attempt deposits `ratio` of a retry, every retry withdraws one,
# and deposits and withdrawals expire with the window (Finagle's RetryBudget). The
# reserve `min_per_second * window` lets a quiet client still retry; a fresh budget
# holds only the reserve, so a cold start cannot burst ratio-many retries it never
# earned. Under a 100% failing backend the extra load is bounded by `ratio` plus
# the reserve, whatever the number of attempts the policy allows.
#
# The window is `buckets` buckets in a ring with running totals: O(1) per call.
# Never reads the clock: every method takes `now`. Invalid settings raise ConfigError.
from __future__ import annotations

import math

from .._errors import ConfigError
from ._window import RingWindow

__all__ = ["RetryBudgetCore"]


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class RetryBudgetCore:
    """Retry admission from first attempts and retries in a sliding window."""

    __slots__ = ("_ring", "min_per_second", "ratio", "reserve", "ring", "window")

    def __init__(
        self, *, ratio: float, min_per_second: float, window: float, buckets: int = 10
    ) -> None:
        if not _real(ratio) or not 0.0 <= ratio <= 1000.0:
            raise ConfigError("ratio", f"must be in [0, 1000], got {ratio!r}")
        if not _real(min_per_second) or not 0.0 <= min_per_second < math.inf:
            raise ConfigError("min_per_second", f"must be >= 0 and finite, got {min_per_second!r}")
        if not _real(window) or not 0.0 < window < math.inf:
            raise ConfigError("window", f"must be > 0 seconds and finite, got {window!r}")
        if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
            raise ConfigError("buckets", "must be an integer >= 1")
        self.ratio = float(ratio)
        self.min_per_second = float(min_per_second)
        self.window = float(window)
        self.reserve = self.min_per_second * self.window
        self._ring = RingWindow(self.window, buckets)  # a = first attempts, b = retries
        # Read-only for hot paths: a first attempt made before ring.bucket_end may be
        # counted later with add_requests().
        self.ring = self._ring

    def record_request(self, now: float) -> None:
        """Deposit: one first attempt was sent at ``now``."""
        ring = self._ring
        if now >= ring.bucket_end:
            ring.roll(now)
        ring.a[ring.j] += 1
        ring.a_total += 1

    def add_requests(self, count: int) -> None:
        """Count ``count`` first attempts made before ``ring.bucket_end`` (in the newest bucket)."""
        ring = self._ring
        ring.a[ring.j] += count
        ring.a_total += count

    def try_retry(self, now: float) -> bool:
        """Withdraw one retry if the budget allows it at ``now``; False otherwise."""
        ring = self._ring
        ring.roll(now)
        if ring.b_total + 1 > self.ratio * ring.a_total + self.reserve:
            return False
        ring.b[ring.j] += 1
        ring.b_total += 1
        return True

    def balance(self, now: float) -> float:
        """Retries still allowed in the window at ``now`` (may be fractional)."""
        ring = self._ring
        ring.roll(now)
        return self.ratio * ring.a_total + self.reserve - ring.b_total

    def counts(self, now: float) -> tuple[int, int]:
        """(first attempts, retries) currently in the window."""
        ring = self._ring
        ring.roll(now)
        return ring.a_total, ring.b_total
