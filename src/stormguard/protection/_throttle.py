# The client's adaptive throttle (SRE "client-side throttling"): the pure counter
# of core/_throttle.py behind a lock, and its place in the retry conversation.
#
# The retry engine asks one object before each attempt and tells it each attempt's
# outcome: the breaker (ADMIT, RECORD in core/_engine.py). ThrottledBreaker is
# that object for an origin with a throttle: it asks the origin's breaker first
# (an open breaker refuses everything, as before), then the throttle, which
# refuses locally with probability p (Throttled, a CircuitOpen); the attempt's
# permit reports the outcome to both. An attempt the engine counts as failing the
# server (5xx, transport errors) is not accepted; every other answer is, and a
# 429 that the origin's guard observes afterwards is taken back (`retract`): the
# backend refused it, it did not accept it. So the throttle needs no new call in
# any front end: RetryPolicy(breaker=...) and OriginGuard.policy() carry it.
from __future__ import annotations

import random
from typing import Any

from .._clock import Clock
from .._errors import Throttled
from ..core._throttle import AdaptiveThrottleCore
from ._refusing import Refusing

__all__ = ["AdaptiveThrottle", "ThrottledBreaker"]


class AdaptiveThrottle(Refusing):
    """Refuse attempts locally while the backend accepts too few (SRE adaptive throttling).

    Over the last ``window`` seconds (default 120, the SRE book's two minutes) it
    counts ``requests`` (attempts asked for, including those it refused) and
    ``accepts`` (attempts the backend accepted), and refuses a new attempt with
    probability::

        p = min(max_reject, max(0, (requests - k * accepts) / (requests + 1)))

    ``k`` = 2 lets through twice what is accepted. Use it in a client with
    ``RetryTransport(throttle=True)`` (per origin) or ``RetryPolicy(breaker=
    AdaptiveThrottle().guarding(breaker))``; or by hand: :meth:`allow` before each
    attempt, :meth:`accept` when the backend accepted it. Thread-safe.
    """

    __slots__ = ()

    def __init__(
        self,
        *,
        k: float = 2.0,
        window: float = 120.0,
        max_reject: float = 1.0,
        name: str | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        core = AdaptiveThrottleCore(k=k, window=window, max_reject=max_reject)
        super().__init__(core, name=name, clock=clock, rng=rng)

    def __repr__(self) -> str:
        core = self._core
        return f"AdaptiveThrottle(k={core.k}, window={core.window}, name={self.name!r})"

    @property
    def probability(self) -> float:
        """The probability that the next attempt is refused locally."""
        return float(self._read(self._core.probability))

    def allow(self) -> bool:
        """Count one attempt; True: send it, False: it is refused locally."""
        return self._draw(self._core.request)

    def accept(self) -> None:
        """The backend accepted an attempt."""
        self._read(self._core.accept)

    def retract(self) -> None:
        """An attempt counted as accepted was refused by the backend (a 429 seen late)."""
        self._read(self._core.retract)

    def status(self) -> dict[str, Any]:
        """``{"probability", "requests", "accepts", "refused"}`` now."""
        core = self._core
        requests, accepts, probability = self._read(
            lambda now: (*core.counts(now), core.probability(now))
        )
        return {
            "probability": probability,
            "requests": requests,
            "accepts": accepts,
            "refused": self.refused,
        }

    def guarding(self, breaker: Any = None) -> ThrottledBreaker:
        """A breaker-shaped object for ``RetryPolicy(breaker=...)``: ``breaker``
        (if any) first, then this throttle (see :class:`ThrottledBreaker`)."""
        return ThrottledBreaker(self, breaker)


class _Permit:
    # One admitted attempt: reports its outcome to the throttle and the breaker's permit.
    __slots__ = ("_done", "inner", "throttle")

    def __init__(self, throttle: AdaptiveThrottle, inner: Any) -> None:
        self.throttle = throttle
        self.inner = inner
        self._done = False

    def _count(self, failure: bool) -> bool:
        if self._done:
            return False
        self._done = True
        if not failure:
            self.throttle.accept()
        return True

    def record(self, *, failure: bool) -> None:
        if self._count(failure) and self.inner is not None:
            self.inner.record(failure=failure)

    async def arecord(self, *, failure: bool) -> None:
        if self._count(failure) and self.inner is not None:
            arecord = getattr(self.inner, "arecord", None)
            if arecord is not None:
                await arecord(failure=failure)
            else:
                self.inner.record(failure=failure)

    def release(self) -> None:
        if not self._done:
            self._done = True
            release = getattr(self.inner, "release", None)
            if release is not None:
                release()

    async def arelease(self) -> None:
        if not self._done:
            self._done = True
            arelease = getattr(self.inner, "arelease", None)
            if arelease is not None:
                await arelease()
            elif self.inner is not None and hasattr(self.inner, "release"):
                self.inner.release()


class ThrottledBreaker:
    """The breaker protocol (``acquire`` -> a permit with ``record(failure=)``) over an
    optional breaker and an :class:`AdaptiveThrottle`.

    ``acquire()`` asks the breaker (its :class:`stormguard.CircuitOpen` passes
    through), then the throttle: refused locally -> :class:`stormguard.Throttled`
    (the breaker's permit is given back unused). The permit's report goes to both;
    an attempt that did not fail the server counts as accepted.
    """

    __slots__ = ("breaker", "name", "throttle")

    def __init__(self, throttle: AdaptiveThrottle, breaker: Any = None) -> None:
        self.throttle = throttle
        self.breaker = breaker
        self.name = throttle.name or getattr(breaker, "name", None)

    def __repr__(self) -> str:
        return f"ThrottledBreaker({self.throttle!r}, {self.breaker!r})"

    @property
    def last_state(self) -> str:
        """The breaker's last state (``"closed"`` without a breaker)."""
        return str(getattr(self.breaker, "last_state", "closed"))

    def _throttled(self, inner: Any) -> _Permit:
        throttle = self.throttle
        if throttle.allow():
            return _Permit(throttle, inner)
        release = getattr(inner, "release", None)
        if release is not None:
            release()
        raise Throttled(self.name, throttle.probability)

    def acquire(self) -> _Permit:
        """A permit for one attempt; raises CircuitOpen (breaker) or Throttled."""
        inner = None if self.breaker is None else self.breaker.acquire()
        return self._throttled(inner)

    async def aacquire(self) -> _Permit:
        """Async twin of :meth:`acquire` (awaits a shared breaker)."""
        inner = None
        if self.breaker is not None:
            aacquire = getattr(self.breaker, "aacquire", None)
            inner = await aacquire() if aacquire is not None else self.breaker.acquire()
        return self._throttled(inner)

    def open_remaining(self) -> float:
        """Seconds the breaker stays open (0 without a breaker)."""
        peek = getattr(self.breaker, "open_remaining", None)
        return 0.0 if peek is None else float(peek())

    async def aopen_remaining(self) -> float:
        """Async twin of :meth:`open_remaining`."""
        apeek = getattr(self.breaker, "aopen_remaining", None)
        if apeek is not None:
            return float(await apeek())
        return self.open_remaining()
