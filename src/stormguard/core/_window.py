# A sliding time window of two counters, as a ring of buckets with running totals.
#
# The window of `window` seconds is cut into `buckets` buckets of window/buckets
# seconds. Counting touches the newest bucket; moving to a later bucket clears the
# buckets skipped since (at most `buckets`, so O(1) per call) and subtracts them
# from the running totals. A reading at a time before the newest bucket (a clock
# that went backwards) counts in the newest bucket.
#
# Used by the circuit breaker (a = calls, b = failures) and the retry budget
# (a = first attempts, b = retries); stores/lua/_ring.lua is the same ring in Redis.
# Pure: never reads the clock, every method takes `now`.
from __future__ import annotations

import math

__all__ = ["RingWindow"]


class RingWindow:
    """Two counters (``a``, ``b``) over the last ``window`` seconds, in ``buckets`` buckets.

    ``a[j]``/``b[j]`` are the counts of bucket slot ``j``; ``a_total``/``b_total``
    the sums over the window; ``j`` the slot of the newest bucket and ``bucket_end``
    when it ends. Hot paths may add to ``a[j]``/``a_total`` directly while
    ``now < bucket_end``.
    """

    __slots__ = ("a", "a_total", "b", "b_total", "bucket_end", "idx", "inv_width", "j", "n")

    def __init__(self, window: float, buckets: int) -> None:
        self.n = buckets
        self.inv_width = buckets / window
        self.clear()

    def clear(self) -> None:
        """Forget every count."""
        self.a = [0] * self.n
        self.b = [0] * self.n
        self.a_total = 0
        self.b_total = 0
        self.idx = -1  # absolute bucket number of the newest bucket
        self.j = 0  # its slot in the ring
        self.bucket_end = -math.inf

    def roll(self, now: float) -> bool:
        """Make the bucket of ``now`` the newest; True when it moved."""
        if now < self.bucket_end:
            return False
        idx = int(now * self.inv_width)
        last = self.idx
        if idx <= last:
            return False  # the clock went backwards: the newest bucket counts it
        n, a, b = self.n, self.a, self.b
        for i in range(max(last + 1, idx - n + 1), idx + 1):
            j = i % n
            self.a_total -= a[j]
            self.b_total -= b[j]
            a[j] = 0
            b[j] = 0
        self.idx = idx
        self.j = idx % n
        self.bucket_end = (idx + 1) / self.inv_width
        return True

    def add(self, now: float, a: int, b: int) -> None:
        """Count ``a`` and ``b`` at ``now``."""
        self.roll(now)
        j = self.j
        self.a[j] += a
        self.b[j] += b
        self.a_total += a
        self.b_total += b
