# Client-side adaptive throttling (Google SRE book, "Handling Overload"), as a
# pure counter.
#
# Over the last `window` seconds the client counts
#
#     requests  attempts its application asked to send (including those this
#               throttle refused locally)
#     accepts   attempts the backend accepted (answered, not refused for overload)
#
# and refuses a new attempt locally with probability
#
#     p = min(max_reject, max(0, (requests - k * accepts) / (requests + 1)))
#
# While the backend accepts everything, p = 0. When it starts refusing, the
# client refuses locally the part of its traffic above k times what gets
# accepted, so the backend sees about k * accepts attempts instead of the whole
# storm; the locally refused attempts still count as requests, which is what
# keeps p up while the backend stays overloaded. k = 2 (the book's value) lets
# through twice what is accepted, so a recovering backend is noticed at once, and
# the traffic sent to it can grow k-fold each time the window turns over (after a
# deep throttle, recovery to full traffic takes several windows). Smaller k
# throttles harder.
#
# The window is a RingWindow (a = requests, b = accepts): O(1) per call. A
# refusal learnt after an accept was counted for the same attempt (a 429 seen
# after the answer was booked) is taken back with `retract()`. Pure: every method
# takes `now` (and an RNG where it draws).
from __future__ import annotations

import random

from ._checks import check_count, check_fraction, check_number, check_seconds
from ._window import RingWindow

__all__ = ["AdaptiveThrottleCore", "throttle_probability"]


def throttle_probability(
    requests: float, accepts: float, *, k: float = 2.0, max_reject: float = 1.0
) -> float:
    """``min(max_reject, max(0, (requests - k * accepts) / (requests + 1)))``."""
    return min(max_reject, max(0.0, (requests - k * accepts) / (requests + 1.0)))


class AdaptiveThrottleCore:
    """SRE client-side adaptive throttling over a sliding window (see the module notes)."""

    __slots__ = ("_ring", "k", "max_reject", "window")

    def __init__(
        self,
        *,
        k: float = 2.0,
        window: float = 120.0,
        max_reject: float = 1.0,
        buckets: int = 12,
    ) -> None:
        self.k = check_number(k, "k", least=1.0)
        self.window = check_seconds(window, "window")
        self.max_reject = check_fraction(max_reject, "max_reject")
        self._ring = RingWindow(self.window, check_count(buckets, "buckets"))

    def counts(self, now: float) -> tuple[int, int]:
        """(requests, accepts) in the window at ``now``."""
        ring = self._ring
        ring.roll(now)
        return ring.a_total, max(0, ring.b_total)

    def probability(self, now: float) -> float:
        """The probability that an attempt at ``now`` is refused locally."""
        requests, accepts = self.counts(now)
        return throttle_probability(requests, accepts, k=self.k, max_reject=self.max_reject)

    def request(self, now: float, rng: random.Random) -> bool:
        """Count one attempt the application asks to send at ``now``; True: send it,
        False: refuse it locally (it stays counted as a request)."""
        probability = self.probability(now)
        self._ring.add(now, 1, 0)
        return probability <= 0.0 or rng.random() >= probability

    def accept(self, now: float) -> None:
        """The backend accepted an attempt (answered it, did not refuse for overload)."""
        self._ring.add(now, 0, 1)

    def retract(self, now: float) -> None:
        """Take back one accept: the attempt counted as accepted was a refusal after all."""
        self._ring.add(now, 0, -1)
