# The runtime retry budget: RetryBudgetCore (core/_budget.py) behind a lock, or
# the same counters in Redis (stores/lua/budget.lua) shared by every process.
#
# One budget per upstream, shared by every client object, thread and task that
# talks to it: the point is to bound the *total* extra load retries add. The lock
# is held only for the O(1) counter update. While the store is unreachable the
# budget counts locally (logged once), and rejoins when the store answers.
#
# Deposits without the lock: a first attempt made before the newest bucket of the
# window ends belongs to that bucket, so it can wait to be counted. It takes one
# of `_deposits`' credits (list.pop is one atomic step under the GIL; nothing is
# lost between threads: protection/_tally.py) and every locked operation counts
# the credits taken into that bucket first, before the window moves on: a
# withdrawal sees every deposit made before it, in the bucket it was made in. A
# spent batch is counted at once, with the deposit that found it spent.
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError
from ..core._budget import RetryBudgetCore
from ..stores._fallback import OutageStats, ScriptStore, StoreHealth
from ..stores._memory import MemoryStore
from ._memory_cells import memory_cell
from ._tally import credits, drained

__all__ = ["RetryBudget"]


class RetryBudget:
    """Allow retries while they stay within ``ratio`` of first attempts plus a reserve.

    Over the last ``window`` seconds, a retry is allowed while::

        retries + 1 <= ratio * first_attempts + min_per_second * window

    A new budget holds only the reserve (``min_per_second * window``), not a full
    window's worth. Call :meth:`record_request` for every first attempt and
    :meth:`try_retry` before every retry (``RetryPolicy(budget=...)`` and the HTTP
    adapters do both). Thread-safe; ``arecord_request``/``atry_retry`` are the
    async twins. With ``store=RedisStore(url)`` and a ``name`` the counters are
    shared by every process (``store=MemoryStore()``: by every budget of that name
    on that store, in this process).
    """

    __slots__ = (
        "_core",
        "_deposits",
        "_health",
        "_key",
        "_lock",
        "_monotonic",
        "_request_args",
        "_retry_args",
        "_scripts",
        "name",
    )

    def __init__(
        self,
        *,
        ratio: float = 0.1,
        min_per_second: float = 10,
        window: float = 10.0,
        store: object = None,
        name: str | None = None,
        clock: Clock | None = None,
        buckets: int = 10,
        store_retry: float = 1.0,
    ) -> None:
        self._core = RetryBudgetCore(
            ratio=ratio, min_per_second=min_per_second, window=window, buckets=buckets
        )
        the_clock = clock or SYSTEM_CLOCK
        self._monotonic: Callable[[], float] = (
            time.monotonic if the_clock is SYSTEM_CLOCK else the_clock.monotonic
        )
        self._lock = threading.Lock()
        self._deposits = credits()
        self.name = name
        self._scripts: ScriptStore | None = None
        self._health = StoreHealth(
            f"retry budget {name!r}", clock=the_clock, retry_after=store_retry
        )
        self._key = ""
        args = [repr(float(ratio)), repr(self._core.reserve), repr(float(window)), buckets]
        # One script (stores/lua/budget.lua), the operation as its last argument.
        self._request_args = [*args, "request"]
        self._retry_args = [*args, "retry"]
        if store is not None:
            if not name:
                raise ConfigError("name", "a budget shared through a store needs a name")
            if isinstance(store, MemoryStore):
                # Same name, same MemoryStore: one set of counters (first settings win).
                self._core, self._lock, self._deposits = memory_cell(
                    store, "budget", name, lambda: (self._core, self._lock, self._deposits)
                )
                return
            self._scripts = ScriptStore(store, self._health.label)
            self._key = self._scripts.key("budget", name)

    def __repr__(self) -> str:
        core = self._core
        return (
            f"RetryBudget(ratio={core.ratio}, min_per_second={core.min_per_second}, "
            f"window={core.window}, name={self.name!r})"
        )

    def record_request(self) -> None:
        """Count one first attempt (deposits ``ratio`` of a retry)."""
        if self._scripts is None:
            self.deposit(self._monotonic())
        else:
            self._health.call(self._remote_request, self._local_request)

    def try_retry(self) -> bool:
        """Withdraw one retry if the budget allows it; False means: do not retry."""
        if self._scripts is None:
            return self._local_retry()
        return self._health.call(self._remote_retry, self._local_retry)

    async def arecord_request(self) -> None:
        """Async twin of :meth:`record_request`."""
        if self._scripts is None:
            self.deposit(self._monotonic())
        else:
            await self._health.acall(self._aremote_request, self._local_request)

    async def atry_retry(self) -> bool:
        """Async twin of :meth:`try_retry`."""
        if self._scripts is None:
            return self._local_retry()
        return await self._health.acall(self._aremote_retry, self._local_retry)

    def _remote_request(self) -> None:
        assert self._scripts is not None
        self._scripts.run("budget", [self._key], self._request_args)

    def _remote_retry(self) -> bool:
        assert self._scripts is not None
        return bool(int(self._scripts.run("budget", [self._key], self._retry_args)))

    async def _aremote_request(self) -> None:
        assert self._scripts is not None
        await self._scripts.arun("budget", [self._key], self._request_args)

    async def _aremote_retry(self) -> bool:
        assert self._scripts is not None
        return bool(int(await self._scripts.arun("budget", [self._key], self._retry_args)))

    def deposit(self, now: float) -> None:
        """Count one first attempt made at ``now`` (on this budget's clock), locally.

        The success path's form of :meth:`record_request` for a budget without a
        store: no lock while ``now`` falls in the window's newest bucket.
        """
        if now < self._core.ring.bucket_end:
            try:
                self._deposits.pop()
                return
            except IndexError:  # the batch is spent: counted now, with this one
                pass
        lock = self._lock
        lock.acquire()  # (explicit: half the cost of `with` on CPython 3.11)
        try:
            self._count_deposits()
            self._core.record_request(now)
        finally:
            lock.release()

    def _count_deposits(self) -> None:
        # Lock held: count the queued deposits into the bucket they were made in.
        count = drained(self._deposits)
        if count:
            self._core.add_requests(count)

    def _local_request(self) -> None:
        now = self._monotonic()
        lock = self._lock
        lock.acquire()
        try:
            self._count_deposits()
            self._core.record_request(now)
        finally:
            lock.release()

    def _local_retry(self) -> bool:
        now = self._monotonic()
        with self._lock:
            self._count_deposits()
            return self._core.try_retry(now)

    def balance(self) -> float:
        """Retries this process's local budget still allows now."""
        now = self._monotonic()
        with self._lock:
            self._count_deposits()
            return self._core.balance(now)

    @property
    def degraded(self) -> bool:
        """True while a shared budget counts locally because its store failed."""
        return self._scripts is not None and self._health.degraded

    @property
    def stats(self) -> OutageStats:
        """What this budget saw of its store's outages."""
        return self._health.stats
