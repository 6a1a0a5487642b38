# Per-origin cooldown: when a server answers 429 or 503 with a wait hint, every
# request to that origin pauses until the hinted time, in every thread and task
# of the process (and, with a store, every process), instead of each caller
# discovering the outage for itself.
#
# Local state is a dict origin -> pause end (monotonic), under a lock, pruned of
# expired entries as it grows. In Redis a pause is a key whose TTL is the time
# left (Redis' own clock): SET NX PX creates it, PEXPIRE GT only ever extends it,
# PTTL reads it. While the store is unreachable the local state decides (logged
# once) and the store is tried again later.
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError, StoreError
from ._shared import Shared

__all__ = ["Cooldown"]

_PRUNE_AT = 1024


def _store_error(exc: Exception) -> StoreError:
    err = StoreError(f"redis: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


class Cooldown:
    """Shared pauses per origin (``"https://api.example.com"``).

    ``pause(origin, seconds)`` pauses every request to ``origin`` for ``seconds``
    (a longer pause already in place is kept; capped at ``max_pause``);
    ``remaining(origin)`` is the time left (0.0 when not paused). With
    ``store=RedisStore(url)`` the pauses are shared by every process.
    """

    __slots__ = ("_lock", "_monotonic", "_pauses", "_shared", "max_pause")

    def __init__(
        self,
        *,
        store: Any = None,
        clock: Clock | None = None,
        max_pause: float = 3600.0,
        store_retry: float = 1.0,
    ) -> None:
        if not max_pause > 0:
            raise ConfigError("max_pause", f"must be > 0 seconds, got {max_pause!r}")
        the_clock = clock or SYSTEM_CLOCK
        self._monotonic: Callable[[], float] = (
            time.monotonic if the_clock is SYSTEM_CLOCK else the_clock.monotonic
        )
        self.max_pause = float(max_pause)
        self._lock = threading.Lock()
        self._pauses: dict[str, float] = {}
        self._shared: Shared | None = None
        if store is not None:
            self._shared = Shared(store, label="cooldown", clock=the_clock, retry_after=store_retry)

    def _clamp(self, seconds: float) -> float:
        if math.isnan(seconds) or seconds <= 0:
            return 0.0
        return min(float(seconds), self.max_pause)

    def _pause_local(self, origin: str, seconds: float) -> None:
        now = self._monotonic()
        with self._lock:
            until = now + seconds
            if until > self._pauses.get(origin, 0.0):
                self._pauses[origin] = until
            if len(self._pauses) > _PRUNE_AT:
                for key in [k for k, v in self._pauses.items() if v <= now]:
                    del self._pauses[key]

    def _remaining_local(self, origin: str) -> float:
        until = self._pauses.get(origin)  # one atomic read: no lock needed
        if until is None:
            return 0.0
        return max(0.0, until - self._monotonic())

    def pause(self, origin: str, seconds: float) -> None:
        """Pause ``origin`` for ``seconds`` (never shortens a longer pause)."""
        seconds = self._clamp(seconds)
        if not seconds:
            return
        self._pause_local(origin, seconds)
        shared = self._shared
        if shared is not None and shared.usable():
            try:
                self._pause_remote(shared, origin, seconds)
            except StoreError as exc:
                shared.failed(exc)
            else:
                shared.succeeded()

    def remaining(self, origin: str) -> float:
        """Seconds until ``origin`` may be called again (0.0 when not paused)."""
        local = self._remaining_local(origin)
        shared = self._shared
        if shared is None or not shared.usable():
            return local
        try:
            remote = self._remaining_remote(shared, origin)
        except StoreError as exc:
            shared.failed(exc)
            return local
        shared.succeeded()
        return max(local, remote)

    async def apause(self, origin: str, seconds: float) -> None:
        """Async twin of :meth:`pause`."""
        seconds = self._clamp(seconds)
        if not seconds:
            return
        self._pause_local(origin, seconds)
        shared = self._shared
        if shared is not None and shared.usable():
            try:
                await self._apause_remote(shared, origin, seconds)
            except StoreError as exc:
                shared.failed(exc)
            else:
                shared.succeeded()

    async def aremaining(self, origin: str) -> float:
        """Async twin of :meth:`remaining`."""
        local = self._remaining_local(origin)
        shared = self._shared
        if shared is None or not shared.usable():
            return local
        try:
            remote = await self._aremaining_remote(shared, origin)
        except StoreError as exc:
            shared.failed(exc)
            return local
        shared.succeeded()
        return max(local, remote)

    # -- Redis -----------------------------------------------------------------------

    @staticmethod
    def _pause_remote(shared: Shared, origin: str, seconds: float) -> None:
        if shared.is_async:
            return  # sync caller, async-only store: the local pause stands
        key, ms = shared.key("cooldown", origin), max(1, math.ceil(seconds * 1000))
        try:
            pipe = shared.store.client.pipeline(transaction=False)
            pipe.set(key, "1", px=ms, nx=True)
            pipe.pexpire(key, ms, gt=True)
            pipe.execute()
        except Exception as exc:
            raise _store_error(exc) from exc

    @staticmethod
    def _remaining_remote(shared: Shared, origin: str) -> float:
        if shared.is_async:
            return 0.0
        try:
            ms = shared.store.client.pttl(shared.key("cooldown", origin))
        except Exception as exc:
            raise _store_error(exc) from exc
        return max(0.0, int(ms) / 1000.0)

    @staticmethod
    async def _apause_remote(shared: Shared, origin: str, seconds: float) -> None:
        key, ms = shared.key("cooldown", origin), max(1, math.ceil(seconds * 1000))
        try:
            pipe = shared.store.client.pipeline(transaction=False)
            pipe.set(key, "1", px=ms, nx=True)
            pipe.pexpire(key, ms, gt=True)
            result = pipe.execute()
            if not shared.is_async:
                return
            await result
        except Exception as exc:
            raise _store_error(exc) from exc

    @staticmethod
    async def _aremaining_remote(shared: Shared, origin: str) -> float:
        try:
            reply = shared.store.client.pttl(shared.key("cooldown", origin))
            ms = await reply if shared.is_async else reply
        except Exception as exc:
            raise _store_error(exc) from exc
        return max(0.0, int(ms) / 1000.0)
