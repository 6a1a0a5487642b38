# One outage-aware store call: "ask the store, or decide locally", written once.
#
# Every object that keeps its state in a shared store (circuit breaker, retry
# budget, cooldown, rate limiter) owns one `StoreHealth`: its own outage record,
# so its statistics say what *it* saw, whichever other objects share the store.
# `health.call(ask, local)` (and `await health.acall(ask, local)`) is the only
# place that decides between the two:
#
#   healthy   -> run `ask()`; a StoreError marks the record degraded (logged once,
#                on the `stormguard` logger, and told to `on_change`) and the
#                answer comes from `local()` instead;
#   degraded  -> `local()` answers, except one caller per `retry_after` seconds who
#                asks the store again (paying one bounded timeout if it is still
#                gone); the first success logs the recovery and rejoins.
#
# `call_all(healths, ...)` is the same for one store call made on behalf of several
# objects (a grouped limiter decision): each record counts the error, the outage and
# the fallback decision for itself.
#
# Thread-safe: a lock guards the transitions and the counters; the healthy path
# reads one attribute and takes no lock.
#
# `ScriptStore` is the other half: running a Lua script of a RedisStore (sync) or an
# AsyncRedisStore (a coroutine) from a sync or an async caller. The async path awaits
# an async store or runs a sync one in a worker thread, so a loop never blocks on
# the network; the sync path refuses an async-only store (it cannot await).
from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError, StoreError

__all__ = ["OutageStats", "ScriptStore", "StoreHealth", "acall_all", "call_all", "logger"]

logger = logging.getLogger("stormguard")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class OutageStats:
    """What one object saw of its store's outages (a snapshot).

    ``outages``: outages that began (each logged once); ``store_errors``: store
    calls that failed; ``fallback_decisions``: answers decided locally instead of
    by the store; ``degraded``: whether it is deciding locally now.
    """

    outages: int = 0
    store_errors: int = 0
    fallback_decisions: int = 0
    degraded: bool = False


class StoreHealth:
    """The outage record of one object that keeps its state in a shared store."""

    __slots__ = (
        "_clock",
        "_down_since",
        "_errors",
        "_fallbacks",
        "_lock",
        "_on_change",
        "_outages",
        "_retry_at",
        "degraded",
        "label",
        "retry_after",
    )

    def __init__(
        self,
        label: str,
        *,
        clock: Clock | None = None,
        retry_after: float = 1.0,
        on_change: Callable[[bool, str], None] | None = None,
    ) -> None:
        if isinstance(retry_after, bool) or not 0 < retry_after < float("inf"):
            raise ConfigError("store_retry", f"must be > 0 seconds, got {retry_after!r}")
        self.label = label
        self._clock = clock or SYSTEM_CLOCK
        self.retry_after = float(retry_after)
        self._on_change = on_change
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self._down_since = 0.0
        self._outages = 0
        self._errors = 0
        self._fallbacks = 0
        self.degraded = False

    def __repr__(self) -> str:
        return f"<StoreHealth {self.label} {'degraded' if self.degraded else 'ok'}>"

    @property
    def stats(self) -> OutageStats:
        """Counters so far (a consistent snapshot)."""
        with self._lock:
            return OutageStats(self._outages, self._errors, self._fallbacks, self.degraded)

    def usable(self) -> bool:
        """Whether to ask the store now: healthy, or this caller's turn to probe it."""
        if not self.degraded:
            return True
        now = self._clock.monotonic()
        if now < self._retry_at:
            return False
        with self._lock:
            if now < self._retry_at or not self.degraded:
                return not self.degraded
            self._retry_at = now + self.retry_after
            return True

    def failed(self, exc: BaseException) -> None:
        """Count a failed store call; the first of an outage is logged and told."""
        now = self._clock.monotonic()
        with self._lock:
            self._errors += 1
            self._retry_at = now + self.retry_after
            if self.degraded:
                return
            self.degraded = True
            self._outages += 1
            self._down_since = now
        logger.warning("%s: shared store unreachable, deciding locally (%s)", self.label, exc)
        if self._on_change is not None:
            self._on_change(False, str(exc))

    def succeeded(self) -> None:
        """Note a store answer: the first after an outage logs the recovery."""
        if self.degraded:
            self._rejoin()

    def _rejoin(self) -> None:
        with self._lock:
            was_degraded, self.degraded = self.degraded, False
            if not was_degraded:
                return  # another thread said it already
            down_for = self._clock.monotonic() - self._down_since
        logger.warning(
            "%s: shared store is back after %.1fs, using shared state again", self.label, down_for
        )
        if self._on_change is not None:
            self._on_change(True, "")

    def fell_back(self) -> None:
        """Count one answer decided locally because of the store."""
        with self._lock:
            self._fallbacks += 1

    def call(self, ask: Callable[[], T], local: Callable[[], T]) -> T:
        """``ask()`` the store, or answer with ``local()`` while it is unreachable."""
        return call_all((self,), ask, local)

    async def acall(self, ask: Callable[[], Awaitable[T]], local: Callable[[], T]) -> T:
        """Async twin of :meth:`call` (``ask`` returns an awaitable)."""
        return await acall_all((self,), ask, local)

    def require(self, ask: Callable[[], T]) -> T:
        """``ask()`` the store even while degraded; a StoreError is counted and raised.

        For operations that must reach every process or fail loudly (an operator's
        force-open or reset), not for decisions that can be made locally.
        """
        try:
            answer = ask()
        except StoreError as exc:
            self.failed(exc)
            raise
        self.succeeded()
        return answer

    async def arequire(self, ask: Callable[[], Awaitable[T]]) -> T:
        """Async twin of :meth:`require`."""
        try:
            answer = await ask()
        except StoreError as exc:
            self.failed(exc)
            raise
        self.succeeded()
        return answer


def _try_all(healths: Sequence[StoreHealth]) -> bool:
    # Healthy (one attribute each, no lock), or every record's turn to probe.
    return all(not health.degraded for health in healths) or all(
        health.usable() for health in healths
    )


def _answered(healths: Sequence[StoreHealth], answer: T) -> T:
    for health in healths:
        if health.degraded:
            health.succeeded()
    return answer


def _fall_back(healths: Sequence[StoreHealth], exc: StoreError | None, local: Callable[[], T]) -> T:
    for health in healths:
        if exc is not None:
            health.failed(exc)
        health.fell_back()
    return local()


def call_all(healths: Sequence[StoreHealth], ask: Callable[[], T], local: Callable[[], T]) -> T:
    """:meth:`StoreHealth.call` for one store call made on behalf of several objects."""
    if not _try_all(healths):
        return _fall_back(healths, None, local)
    try:
        answer = ask()
    except StoreError as exc:
        return _fall_back(healths, exc, local)
    return _answered(healths, answer)


async def acall_all(
    healths: Sequence[StoreHealth], ask: Callable[[], Awaitable[T]], local: Callable[[], T]
) -> T:
    """Async twin of :func:`call_all`."""
    if not _try_all(healths):
        return _fall_back(healths, None, local)
    try:
        answer = await ask()
    except StoreError as exc:
        return _fall_back(healths, exc, local)
    return _answered(healths, answer)


class ScriptStore:
    """Runs the Lua scripts of a RedisStore or an AsyncRedisStore from either kind of caller."""

    __slots__ = ("is_async", "label", "store")

    def __init__(self, store: Any, label: str) -> None:
        if not callable(getattr(store, "run_script", None)) or not callable(
            getattr(store, "key", None)
        ):
            raise ConfigError("store", f"must be a RedisStore or AsyncRedisStore, got {store!r}")
        self.store = store
        self.label = label
        self.is_async = inspect.iscoroutinefunction(store.run_script)

    def key(self, *parts: str) -> str:
        """The store's key for ``parts``."""
        key: str = self.store.key(*parts)
        return key

    def check_sync(self) -> None:
        """Raise TypeError when the store cannot serve a sync caller."""
        if self.is_async:
            raise TypeError(
                f"{self.label}: an AsyncRedisStore can only be used from the async forms "
                "(acall, aacquire, async with); use RedisStore for sync callers"
            )

    def run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script from a sync caller; raises StoreError."""
        self.check_sync()
        return self.store.run_script(name, keys, args)

    async def arun(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script from a coroutine; raises StoreError."""
        if self.is_async:
            return await self.store.run_script(name, keys, args)
        return await asyncio.to_thread(self.store.run_script, name, keys, args)
