# Admission control (Envoy's admission_control filter), as a pure counter.
#
# Over the last `window` seconds, with n requests sent and s of them successful,
# a new request is refused with probability
#
#     P = min(max_reject, max(0, (n - s / success_rate) / (n + 1)) ** (1 / aggression))
#
# so nothing is refused while the success rate s/n stays at or above
# `success_rate`, and the refused fraction rises smoothly as it falls -- unlike a
# breaker, which refuses everything or nothing. `aggression` > 1 refuses more at
# a mild failure rate (the exponent 1/a < 1 lifts small probabilities); the cap
# `max_reject` keeps some requests going through, so the window learns when the
# upstream is healthy again. Below `min_rps` requests per second (n < min_rps *
# window) the filter is off: a handful of failures in a quiet window is no
# evidence of overload. Refused requests are not counted (they were never sent).
#
# The window is a RingWindow (a = requests, b = successes): O(1) per call. Pure:
# every method takes `now` (and an RNG where it draws); invalid settings raise
# ConfigError naming the field.
from __future__ import annotations

import math
import random

from ._checks import check_count, check_fraction, check_number, check_seconds
from ._window import RingWindow

__all__ = ["AdmissionControlCore", "admission_reject_probability"]


def admission_reject_probability(
    requests: float,
    successes: float,
    *,
    success_rate: float = 0.95,
    aggression: float = 1.0,
    max_reject: float = 0.8,
) -> float:
    """``min(max_reject, max(0, (n - s / success_rate) / (n + 1)) ** (1 / aggression))``."""
    base = (requests - successes / success_rate) / (requests + 1.0)
    if base <= 0.0:
        return 0.0
    return min(max_reject, math.pow(base, 1.0 / aggression))


class AdmissionControlCore:
    """Refuse a fraction of requests that rises as the success rate falls (Envoy's
    admission control; see the module notes for the formula)."""

    __slots__ = (
        "_ring",
        "aggression",
        "max_reject",
        "min_requests",
        "min_rps",
        "success_rate",
        "window",
    )

    def __init__(
        self,
        *,
        window: float = 30.0,
        success_rate: float = 0.95,
        aggression: float = 1.0,
        max_reject: float = 0.8,
        min_rps: float = 1.0,
        buckets: int = 10,
    ) -> None:
        self.window = check_seconds(window, "window")
        self.success_rate = check_fraction(success_rate, "success_rate", low_open=True)
        self.aggression = check_number(aggression, "aggression", least=1.0)
        self.max_reject = check_fraction(max_reject, "max_reject")
        self.min_rps = check_number(min_rps, "min_rps")
        self.min_requests = self.min_rps * self.window
        self._ring = RingWindow(self.window, check_count(buckets, "buckets"))

    def record(self, now: float, success: bool) -> None:
        """Count one request sent, and whether it succeeded, at ``now``."""
        self._ring.add(now, 1, 1 if success else 0)

    def counts(self, now: float) -> tuple[int, int]:
        """(requests, successes) in the window at ``now``."""
        ring = self._ring
        ring.roll(now)
        return ring.a_total, ring.b_total

    def reject_probability(self, now: float) -> float:
        """The probability that a request at ``now`` is refused (0 below ``min_rps``)."""
        requests, successes = self.counts(now)
        if requests == 0 or requests < self.min_requests:
            return 0.0
        return admission_reject_probability(
            requests,
            successes,
            success_rate=self.success_rate,
            aggression=self.aggression,
            max_reject=self.max_reject,
        )

    def admits(self, now: float, rng: random.Random) -> bool:
        """Draw whether a request at ``now`` may be sent (one draw only when P > 0)."""
        probability = self.reject_probability(now)
        return probability <= 0.0 or rng.random() >= probability
