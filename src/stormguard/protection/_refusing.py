# What AdmissionControl and AdaptiveThrottle share: a pure core that refuses with a
# probability, behind a lock, read on the injected clock and drawn from the
# injected RNG, with a count of its refusals.
from __future__ import annotations

import random
import threading
from typing import Any

from .._clock import Clock, monotonic_of

__all__ = ["Refusing"]

_RNG = random.Random()


class Refusing:
    """Base of the runtime objects around a probabilistic-refusal core."""

    __slots__ = ("_core", "_lock", "_monotonic", "_rng", "name", "refused")

    def __init__(
        self, core: Any, *, name: str | None, clock: Clock | None, rng: random.Random | None
    ) -> None:
        self._core = core
        self._monotonic = monotonic_of(clock)
        self._rng = rng or _RNG
        self._lock = threading.Lock()
        self.name = name
        self.refused = 0

    def _draw(self, decide: Any) -> bool:
        # decide(now, rng) -> True (go on) / False (refused), under the lock; counted.
        with self._lock:
            allowed = bool(decide(self._monotonic(), self._rng))
            if not allowed:
                self.refused += 1
        return allowed

    def _read(self, read: Any) -> Any:
        # read(now) under the lock.
        with self._lock:
            return read(self._monotonic())
