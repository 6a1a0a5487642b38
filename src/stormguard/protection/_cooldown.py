# Per-origin cooldown: when a server answers 429 or 503 with a wait hint, every
# request to that origin pauses until the hinted time, in every thread and task
# of the process (and, with a store, every process), instead of each caller
# discovering the outage for itself.
#
# Local state: an OrderedDict origin -> pause end (monotonic), least recently
# paused first, under a lock for writes (reads are one atomic dict lookup). Each
# pause() looks at the two oldest entries: an ended pause is dropped, a running one
# goes to the back. So the map holds about the running pauses, and pause() costs
# O(1) amortised whatever its size. At `max_origins` the least recently paused
# entry is forgotten to make room (the bound is a memory guarantee, far above any
# real client's count of paused origins).
#
# Shared state: stores/lua/cooldown.lua keeps the pause end on Redis' clock and only
# ever extends it; one script call per pause() or remaining(). Outages go through the
# one outage-aware store call (stores/_fallback.py): while the store is unreachable
# the local pauses decide.
from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError
from ..stores._fallback import OutageStats, ScriptStore, StoreHealth
from ..stores._memory import MemoryStore
from ._memory_cells import memory_cell

__all__ = ["Cooldown"]

_SWEEP = 2  # oldest entries looked at per pause()


class Cooldown:
    """Shared pauses per origin (``"https://api.example.com"``).

    ``pause(origin, seconds)`` pauses every request to ``origin`` for ``seconds``
    (a longer pause already in place is kept; capped at ``max_pause``);
    ``remaining(origin)`` is the time left (0.0 when not paused). At most
    ``max_origins`` pauses are kept (the least recently paused one is forgotten
    first; ended pauses are dropped as new ones arrive). With
    ``store=RedisStore(url)`` the pauses are shared by every process (with
    ``store=MemoryStore()``, by every cooldown on that store).
    """

    __slots__ = (
        "_health",
        "_lock",
        "_monotonic",
        "_pauses",
        "_scripts",
        "max_origins",
        "max_pause",
    )

    def __init__(
        self,
        *,
        store: Any = None,
        clock: Clock | None = None,
        max_pause: float = 3600.0,
        store_retry: float = 1.0,
        max_origins: int = 65536,
    ) -> None:
        if not max_pause > 0:
            raise ConfigError("max_pause", f"must be > 0 seconds, got {max_pause!r}")
        if isinstance(max_origins, bool) or not isinstance(max_origins, int) or max_origins < 1:
            raise ConfigError("max_origins", f"must be an integer >= 1, got {max_origins!r}")
        the_clock = clock or SYSTEM_CLOCK
        self._monotonic: Callable[[], float] = (
            time.monotonic if the_clock is SYSTEM_CLOCK else the_clock.monotonic
        )
        self.max_pause = float(max_pause)
        self.max_origins = max_origins
        self._lock = threading.Lock()
        self._pauses: OrderedDict[str, float] = OrderedDict()
        self._scripts: ScriptStore | None = None
        self._health = StoreHealth("cooldown", clock=the_clock, retry_after=store_retry)
        if isinstance(store, MemoryStore):
            # Every cooldown on one MemoryStore shares its pauses, as on Redis.
            self._pauses, self._lock = memory_cell(
                store, "cooldown", "", lambda: (self._pauses, self._lock)
            )
        elif store is not None:
            self._scripts = ScriptStore(store, "cooldown")

    def __len__(self) -> int:
        """Pauses held locally (running ones, plus ended ones not yet dropped)."""
        return len(self._pauses)

    @property
    def stats(self) -> OutageStats:
        """What this cooldown saw of its store's outages."""
        return self._health.stats

    def _clamp(self, seconds: float) -> float:
        if math.isnan(seconds) or seconds <= 0:
            return 0.0
        return min(float(seconds), self.max_pause)

    def _pause_local(self, origin: str, seconds: float) -> None:
        now = self._monotonic()
        until = now + seconds
        pauses = self._pauses
        with self._lock:
            current = pauses.get(origin)
            if current is not None:
                if current >= until:
                    return
                pauses.move_to_end(origin)
            pauses[origin] = until
            for _ in range(_SWEEP):
                oldest, ends = next(iter(pauses.items()))
                if oldest == origin:
                    break
                if ends <= now or len(pauses) > self.max_origins:
                    del pauses[oldest]  # ended, or over the bound: forgotten
                else:
                    pauses.move_to_end(oldest)  # still running: look again later

    def _remaining_local(self, origin: str) -> float:
        until = self._pauses.get(origin)  # one atomic read: no lock needed
        if until is None:
            return 0.0
        return max(0.0, until - self._monotonic())

    def running(self, origin: str) -> bool:
        """Whether ``origin`` is paused in this process now."""
        return self._remaining_local(origin) > 0.0

    def _args(self, origin: str, op: str, seconds: float) -> tuple[list[str], list[Any]]:
        assert self._scripts is not None
        return [self._scripts.key("cooldown", origin)], [op, repr(seconds)]

    def _remote(self, origin: str, op: str, seconds: float) -> float:
        assert self._scripts is not None
        if self._scripts.is_async:
            return 0.0  # sync caller, async-only store: the local pause stands
        return float(self._scripts.run("cooldown", *self._args(origin, op, seconds)))

    async def _aremote(self, origin: str, op: str, seconds: float) -> float:
        assert self._scripts is not None
        return float(await self._scripts.arun("cooldown", *self._args(origin, op, seconds)))

    def pause(self, origin: str, seconds: float) -> None:
        """Pause ``origin`` for ``seconds`` (never shortens a longer pause)."""
        seconds = self._clamp(seconds)
        if not seconds:
            return
        self._pause_local(origin, seconds)
        if self._scripts is not None:
            self._health.call(lambda: self._remote(origin, "pause", seconds), float)

    def remaining(self, origin: str) -> float:
        """Seconds until ``origin`` may be called again (0.0 when not paused)."""
        local = self._remaining_local(origin)
        if self._scripts is None:
            return local
        remote = self._health.call(lambda: self._remote(origin, "remaining", 0.0), float)
        return max(local, remote)

    async def apause(self, origin: str, seconds: float) -> None:
        """Async twin of :meth:`pause`."""
        seconds = self._clamp(seconds)
        if not seconds:
            return
        self._pause_local(origin, seconds)
        if self._scripts is not None:
            await self._health.acall(lambda: self._aremote(origin, "pause", seconds), float)

    async def aremaining(self, origin: str) -> float:
        """Async twin of :meth:`remaining`."""
        local = self._remaining_local(origin)
        if self._scripts is None:
            return local
        remote = await self._health.acall(lambda: self._aremote(origin, "remaining", 0.0), float)
        return max(local, remote)

    @property
    def degraded(self) -> bool:
        """True while a shared cooldown decides locally because its store failed."""
        return self._scripts is not None and self._health.degraded
