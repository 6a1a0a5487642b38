# Proactive pacing per origin: PacerCore (core/_pacer.py) per origin, behind a
# lock. The adapters feed it each response's rate-limit headers and ask it, before
# each request, how long to wait; the wait is theirs to sleep (or to refuse when
# it would pass the deadline).
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable

from .._clock import SYSTEM_CLOCK, Clock
from ..core._pacer import PacerCore, QuotaLike

__all__ = ["Pacer"]

_MAX_ORIGINS = 4096


class Pacer:
    """Spread the last ``threshold`` share of each quota evenly over its reset.

    ``observe(origin, headers)`` reads a response's rate-limit headers (every
    format :func:`stormguard.parse_rate_limits` knows; each quota name is its own
    pool); ``reserve(origin)`` takes the next slot and returns the seconds to wait
    before sending (0.0 when not paced).
    """

    __slots__ = ("_clock", "_lock", "_monotonic", "_origins", "max_wait", "threshold")

    def __init__(
        self, *, threshold: float = 0.1, max_wait: float = 3600.0, clock: Clock | None = None
    ) -> None:
        PacerCore(threshold=threshold, max_wait=max_wait)  # validates (ConfigError)
        self.threshold = threshold
        self.max_wait = max_wait
        self._clock: Clock = clock or SYSTEM_CLOCK
        self._monotonic: Callable[[], float] = (
            time.monotonic if self._clock is SYSTEM_CLOCK else self._clock.monotonic
        )
        self._lock = threading.Lock()
        self._origins: dict[str, PacerCore] = {}

    def observe_quotas(self, origin: str, quotas: Iterable[QuotaLike]) -> None:
        """Take parsed quotas for ``origin``."""
        quotas = list(quotas)
        now = self._monotonic()
        with self._lock:
            core = self._origins.get(origin)
            if core is None:
                if not quotas:
                    return
                if len(self._origins) >= _MAX_ORIGINS:
                    self._prune(now)
                core = self._origins[origin] = PacerCore(
                    threshold=self.threshold, max_wait=self.max_wait
                )
            core.observe(quotas, now)

    def observe(self, origin: str, headers: object) -> None:
        """Read the rate-limit headers of a response from ``origin``."""
        from ..core._headers import parse_rate_limits

        try:
            quotas = parse_rate_limits(headers, now=self._clock.time())  # type: ignore[arg-type]
        except Exception:  # malformed headers never break a request
            return
        if quotas:
            self.observe_quotas(origin, quotas)

    def reserve(self, origin: str, *, limit: float = math.inf) -> float:
        """Take the next slot for ``origin``: seconds to wait before sending.

        A wait longer than ``limit`` takes no slot and is returned as it is.
        """
        core = self._origins.get(origin)
        if core is None:
            return 0.0
        now = self._monotonic()
        with self._lock:
            return core.reserve(now, limit)

    def quotas(self, origin: str) -> list[str]:
        """The names of the quotas pacing ``origin`` (``"default"`` for an unnamed one)."""
        core = self._origins.get(origin)
        if core is None:
            return []
        with self._lock:
            return list(core.pools)

    def delay(self, origin: str) -> float:
        """Seconds the next request to ``origin`` would wait (nothing reserved)."""
        core = self._origins.get(origin)
        if core is None:
            return 0.0
        now = self._monotonic()
        with self._lock:
            return core.delay(now)

    def _prune(self, now: float) -> None:
        for origin in [o for o, c in self._origins.items() if c.delay(now) == 0.0]:
            del self._origins[origin]
