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
# Never reads the clock: every method takes `now`.
from __future__ import annotations

import math

__all__ = ["RetryBudgetCore"]


class RetryBudgetCore:
    """Retry admission from first attempts and retries in a sliding window."""

    __slots__ = (
        "_bucket_end",
        "_idx",
        "_inv_width",
        "_j",
        "_n",
        "_requests",
        "_requests_total",
        "_retries",
        "_retries_total",
        "min_per_second",
        "ratio",
        "reserve",
        "window",
    )

    def __init__(
        self, *, ratio: float, min_per_second: float, window: float, buckets: int = 10
    ) -> None:
        if not (0.0 <= ratio <= 1000.0) or math.isnan(ratio):
            raise ValueError("ratio: must be in [0, 1000]")
        if not (min_per_second >= 0.0) or math.isinf(min_per_second):
            raise ValueError("min_per_second: must be >= 0")
        if not (window > 0.0) or math.isinf(window):
            raise ValueError("window: must be > 0")
        if buckets < 1:
            raise ValueError("buckets: must be >= 1")
        self.ratio = float(ratio)
        self.min_per_second = float(min_per_second)
        self.window = float(window)
        self.reserve = self.min_per_second * self.window
        self._n = buckets
        self._inv_width = buckets / self.window
        self._requests = [0] * buckets
        self._retries = [0] * buckets
        self._requests_total = 0
        self._retries_total = 0
        self._idx = -1
        self._j = 0
        self._bucket_end = -math.inf

    def _roll(self, now: float) -> int:
        if now < self._bucket_end:
            return self._j
        idx = int(now * self._inv_width)
        last = self._idx
        if idx > last:
            n = self._n
            requests, retries = self._requests, self._retries
            for i in range(max(last + 1, idx - n + 1), idx + 1):
                j = i % n
                self._requests_total -= requests[j]
                self._retries_total -= retries[j]
                requests[j] = 0
                retries[j] = 0
            self._idx = idx
            self._j = idx % n
            self._bucket_end = (idx + 1) / self._inv_width
        return self._j  # same bucket, or the clock went backwards

    def record_request(self, now: float) -> None:
        """Deposit: one first attempt was sent at ``now``."""
        if now < self._bucket_end:
            self._requests[self._j] += 1
        else:
            self._requests[self._roll(now)] += 1
        self._requests_total += 1

    def try_retry(self, now: float) -> bool:
        """Withdraw one retry if the budget allows it at ``now``; False otherwise."""
        j = self._roll(now)
        if self._retries_total + 1 > self.ratio * self._requests_total + self.reserve:
            return False
        self._retries[j] += 1
        self._retries_total += 1
        return True

    def balance(self, now: float) -> float:
        """Retries still allowed in the window at ``now`` (may be fractional)."""
        self._roll(now)
        return self.ratio * self._requests_total + self.reserve - self._retries_total

    def counts(self, now: float) -> tuple[int, int]:
        """(first attempts, retries) currently in the window."""
        self._roll(now)
        return self._requests_total, self._retries_total
