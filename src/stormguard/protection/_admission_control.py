# Admission control at run time: core/_admission_control.py's window behind a
# lock, on the injected clock and RNG. One object per protected upstream (the
# server side: per app or route group; the gateway: per upstream).
from __future__ import annotations

import random
from typing import Any

from .._clock import Clock
from ..core._admission_control import AdmissionControlCore
from ._refusing import Refusing

__all__ = ["AdmissionControl"]


class AdmissionControl(Refusing):
    """Refuse a fraction of requests that rises with the failure rate (Envoy's
    admission control) -- instead of a breaker's all or nothing.

    Over the last ``window`` seconds, with ``n`` requests admitted and ``s`` of
    them successful, a new request is refused with probability::

        P = min(max_reject, max(0, (n - s / success_rate) / (n + 1)) ** (1 / aggression))

    Nothing is refused while the success rate stays at or above ``success_rate``;
    at most ``max_reject`` of requests are; below ``min_rps`` requests per second in
    the window it refuses nothing. Call :meth:`admits` before a request and
    :meth:`record` with its outcome after (refused requests are not recorded).
    Thread-safe.
    """

    __slots__ = ()

    def __init__(
        self,
        *,
        window: float = 30.0,
        success_rate: float = 0.95,
        aggression: float = 1.0,
        max_reject: float = 0.8,
        min_rps: float = 1.0,
        name: str | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        core = AdmissionControlCore(
            window=window,
            success_rate=success_rate,
            aggression=aggression,
            max_reject=max_reject,
            min_rps=min_rps,
        )
        super().__init__(core, name=name, clock=clock, rng=rng)

    def __repr__(self) -> str:
        core = self._core
        return (
            f"AdmissionControl(window={core.window}, success_rate={core.success_rate}, "
            f"max_reject={core.max_reject}, name={self.name!r})"
        )

    @property
    def reject_probability(self) -> float:
        """The probability that a request now is refused."""
        return float(self._read(self._core.reject_probability))

    def admits(self) -> bool:
        """Draw whether the next request may go on (False: refuse it)."""
        return self._draw(self._core.admits)

    def record(self, success: bool) -> None:
        """An admitted request ended; ``success``: the upstream served it."""
        self._read(lambda now: self._core.record(now, success))

    def status(self) -> dict[str, Any]:
        """``{"reject_probability", "requests", "successes", "refused"}`` now."""
        core = self._core
        requests, successes, probability = self._read(
            lambda now: (*core.counts(now), core.reject_probability(now))
        )
        return {
            "reject_probability": probability,
            "requests": requests,
            "successes": successes,
            "refused": self.refused,
        }
