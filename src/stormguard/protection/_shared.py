# Talking to a shared store (RedisStore or AsyncRedisStore) from the protection
# objects, and falling back to local state while it is unreachable.
#
# A store is used through `run_script(name, keys, args)`: sync for RedisStore,
# a coroutine for AsyncRedisStore. `Shared` hides which one it is: the sync path
# refuses an async-only store (a sync caller cannot await), the async path awaits
# an async store or runs a sync one in a worker thread so the event loop never
# blocks on the network.
#
# Outage policy: the first StoreError switches the object to its local state and
# says so once (logger "stormguard", WARNING, and the listeners); while degraded,
# the store is tried again at most every `retry_after` seconds, and the first
# success says so too and puts the object back on shared state.
from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .._clock import Clock

__all__ = ["Shared", "logger"]

logger = logging.getLogger("stormguard")


class Shared:
    """A store handle with outage tracking (thread-safe)."""

    __slots__ = (
        "_async",
        "_clock",
        "_lock",
        "_on_change",
        "_retry_at",
        "degraded",
        "label",
        "retry_after",
        "store",
    )

    def __init__(
        self,
        store: Any,
        *,
        label: str,
        clock: Clock,
        retry_after: float = 1.0,
        on_change: Callable[[bool, str], None] | None = None,
    ) -> None:
        if not callable(getattr(store, "run_script", None)) or not callable(
            getattr(store, "key", None)
        ):
            raise TypeError(f"store must be a RedisStore or AsyncRedisStore, got {store!r}")
        self.store = store
        self._async = inspect.iscoroutinefunction(store.run_script)
        self.label = label
        self._clock = clock
        self.retry_after = retry_after
        self._on_change = on_change
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self.degraded = False

    @property
    def is_async(self) -> bool:
        """True for an AsyncRedisStore (only the async forms can use it)."""
        return self._async

    def key(self, *parts: str) -> str:
        """The store's key for ``parts``."""
        key: str = self.store.key(*parts)
        return key

    def usable(self) -> bool:
        """Whether to try the store now: not degraded, or this caller probes it.

        While degraded, one caller per ``retry_after`` seconds gets True (and pays
        a timeout if the store is still gone); everyone else decides locally.
        """
        if not self.degraded:
            return True
        now = self._clock.monotonic()
        if now < self._retry_at:
            return False
        with self._lock:
            if now < self._retry_at:
                return False
            self._retry_at = now + self.retry_after
            return True

    def run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script from a sync caller; raises StoreError."""
        if self._async:
            raise TypeError(
                f"{self.label}: an AsyncRedisStore can only be used from the async forms "
                "(acall, aacquire, async with); use RedisStore for sync callers"
            )
        return self.store.run_script(name, keys, args)

    async def arun(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script from a coroutine; raises StoreError."""
        if self._async:
            return await self.store.run_script(name, keys, args)
        return await asyncio.to_thread(self.store.run_script, name, keys, args)

    def failed(self, exc: BaseException) -> None:
        """Note a store failure: switch to local state (says so once)."""
        with self._lock:
            self._retry_at = self._clock.monotonic() + self.retry_after
            if self.degraded:
                return
            self.degraded = True
        logger.warning(
            "%s: shared store unreachable, deciding locally until it is back (%s)",
            self.label,
            exc,
        )
        if self._on_change is not None:
            self._on_change(False, str(exc))

    def succeeded(self) -> None:
        """Note a store success: back on shared state (says so once)."""
        if self.degraded:
            self._rejoin()

    def _rejoin(self) -> None:
        with self._lock:
            # Re-checked under the lock: another thread may have said it already.
            was_degraded, self.degraded = self.degraded, False
        if not was_degraded:
            return
        logger.warning("%s: shared store is back, using shared state again", self.label)
        if self._on_change is not None:
            self._on_change(True, "")
