# The bulkhead: at most `limit` calls in flight, for threads and asyncio tasks
# alike, with a bounded wait for a slot.
#
# The free slots are tokens in a list (`_free`, `limit` of them at first). Taking
# one is `_free.pop()` and giving one back `_free.append(...)`: each a single
# atomic step under the GIL, so an uncontended acquire and release take no lock
# (the adapters' success path; see issue 17). A slot is never over-taken: a pop
# either gets a token or raises IndexError, so `limit - len(_free)` is exactly
# the number of holders, whatever the interleaving.
#
# The lock guards the FIFO of waiters (a threading.Event for sync callers, a
# future on its own loop for async ones) and every hand-off to them. Two rules
# keep a freed slot from missing a waiter that is about to sleep:
#   * whoever frees a slot appends the token *first* and looks at the queue
#     *after*; if anyone waits, it hands free tokens out under the lock;
#   * a waiter joins the queue *first* and, in the same hold of the lock, hands
#     free tokens out (to the queue's head) *after*.
# Of the two pairs of steps one always sees the other's first step (the GIL runs
# them in one order), so either the releaser finds the waiter or the waiter finds
# the token. A newcomer takes a token lock-free only while nobody is queued, so it
# never overtakes a waiter that queued before it looked. A waiter re-checks
# `granted` under the lock after waking, timing out or being cancelled, which
# settles the race between a grant and a timeout: a granted slot is either used
# or passed on, never lost.
from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import BulkheadFull, ConfigError
from .._scope import AsyncScope, Decorator, Scope

__all__ = ["Bulkhead"]

_POLL = 0.01  # seconds between clock readings of a waiter on an injected clock
P = ParamSpec("P")
T = TypeVar("T")


def _async_waiter() -> _Waiter:
    # The running loop is looked up only for a caller that must queue (on Python
    # 3.11 asyncio.get_running_loop() is a getpid() syscall).
    loop = asyncio.get_running_loop()
    return _Waiter(loop=loop, future=loop.create_future())


class _Waiter:
    __slots__ = ("event", "future", "granted", "loop")

    def __init__(
        self,
        event: threading.Event | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        future: asyncio.Future[None] | None = None,
    ) -> None:
        self.event = event
        self.loop = loop
        self.future = future
        self.granted = False


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Bulkhead(Scope, AsyncScope, Decorator):
    """At most ``limit`` calls at once; a caller waits up to ``max_wait`` seconds.

    Sync and async callers share the same slots. When no slot frees up within
    ``max_wait`` (0: do not wait), :class:`stormguard.BulkheadFull` is raised.
    Forms: ``with bulkhead:``, ``async with bulkhead:``, ``call(fn, ...)``,
    ``await acall(fn, ...)`` and ``@bulkhead`` on sync or async functions.
    ``clock`` measures the waits (default: the system clock).
    """

    __slots__ = ("_clock", "_free", "_lock", "_poll", "_waiters", "limit", "max_wait", "name")

    def __init__(
        self,
        limit: int,
        *,
        max_wait: float = 0.0,
        name: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError("limit", f"must be an integer >= 1, got {limit!r}")
        if not isinstance(max_wait, int | float) or not max_wait >= 0:
            raise ConfigError("max_wait", f"must be >= 0 seconds, got {max_wait!r}")
        self.limit = limit
        self.max_wait = float(max_wait)
        self.name = name
        self._clock: Clock = clock or SYSTEM_CLOCK
        # A waiter sleeps on its event until its deadline on the real clock; on an
        # injected clock it wakes every _POLL seconds to read that clock, so a test
        # that advances it sees the wait end.
        self._poll = math.inf if self._clock is SYSTEM_CLOCK else _POLL
        self._lock = threading.Lock()
        self._free: list[None] = [None] * limit
        self._waiters: deque[_Waiter] = deque()

    def __repr__(self) -> str:
        return f"Bulkhead({self.limit}, max_wait={self.max_wait}, in_flight={self.in_flight})"

    @property
    def in_flight(self) -> int:
        """Calls holding a slot now."""
        return self.limit - len(self._free)

    @property
    def waiting(self) -> int:
        """Callers waiting for a slot now."""
        return len(self._waiters)

    # -- the lock-free pair: try_enter() / settle() ---------------------------------

    def try_enter(self) -> bool:
        """Take a slot at once, without a lock, when nothing has to wait.

        True when a slot was free and nobody is queued for one: the slot is taken
        (one token popped off the free list) and :meth:`settle` gives it back.
        False when every slot is taken or callers wait in line: ask
        :meth:`acquire` / :meth:`aacquire` (which queue behind them); nothing
        was taken.
        """
        if self._waiters:
            return False
        try:
            self._free.pop()
        except IndexError:
            return False
        return True

    # (the name it had before the pair; the same method)
    try_acquire = try_enter

    def settle(self) -> None:
        """Give back a slot taken by :meth:`try_enter` (or :meth:`acquire`).

        Lock-free unless callers wait: the token goes back first, then, if anyone
        is queued, the lock is taken and the first in line gets it.
        """
        free = self._free
        free.append(None)
        if len(free) > self.limit:
            free.pop()
            raise RuntimeError("Bulkhead.release() without a matching acquire")
        if self._waiters:  # after freeing the slot: see the rules at the top
            self._hand_out_locked()

    def _hand_out(self) -> None:
        # Lock held: free tokens go to the queue's head, in order.
        waiters, free = self._waiters, self._free
        while waiters:
            try:
                free.pop()
            except IndexError:
                return
            waiter = waiters.popleft()
            waiter.granted = True
            if waiter.event is not None:
                waiter.event.set()
            else:
                assert waiter.loop is not None and waiter.future is not None
                try:
                    waiter.loop.call_soon_threadsafe(_wake, waiter.future)
                except RuntimeError:
                    # Its loop is closed: the waiter is gone with it; the slot is not.
                    free.append(None)

    def _wait_for(self, max_wait: float | None) -> float:
        return self.max_wait if max_wait is None else max(0.0, min(self.max_wait, max_wait))

    def _queue(self, max_wait: float, waiter: Callable[[], _Waiter]) -> _Waiter | None:
        # A free slot: taken, None. Else a new waiter in the queue, or BulkheadFull at once
        # when the caller will not wait.
        if self.try_enter():
            return None
        with self._lock:
            queued = waiter()
            self._waiters.append(queued)
            self._hand_out()  # after joining the queue: see the rules at the top
            if queued.granted:
                return None
            if max_wait <= 0:
                self._waiters.remove(queued)
                raise BulkheadFull(self.limit, 0.0)
            return queued

    def _settle(self, waiter: _Waiter, start: float) -> None:
        # The wait is over: return if the waiter was granted a slot, else leave the queue.
        with self._lock:
            if waiter.granted:
                return
            self._waiters.remove(waiter)
        raise BulkheadFull(self.limit, self._clock.monotonic() - start)

    def acquire(self, max_wait: float | None = None) -> None:
        """Take a slot, waiting up to the bulkhead's ``max_wait`` (or this one if shorter).

        Raises :class:`stormguard.BulkheadFull` when no slot frees up in time.
        """
        max_wait = self._wait_for(max_wait)
        waiter = self._queue(max_wait, lambda: _Waiter(event=threading.Event()))
        if waiter is None:
            return
        start = self._clock.monotonic()
        assert waiter.event is not None
        left = max_wait
        while not waiter.event.wait(min(left, self._poll)):
            left = start + max_wait - self._clock.monotonic()
            if left <= 0:
                break
        self._settle(waiter, start)

    async def aacquire(self, max_wait: float | None = None) -> None:
        """Async twin of :meth:`acquire`."""
        max_wait = self._wait_for(max_wait)
        waiter = self._queue(max_wait, _async_waiter)
        if waiter is None:
            return
        start = self._clock.monotonic()
        assert waiter.future is not None
        try:
            left = max_wait
            while left > 0 and not waiter.future.done():
                try:
                    await asyncio.wait_for(asyncio.shield(waiter.future), min(left, self._poll))
                except TimeoutError:
                    left = start + max_wait - self._clock.monotonic()
        except BaseException:
            # Cancelled while waiting: pass on a slot granted meanwhile.
            with self._lock:
                granted = waiter.granted
                if not granted:
                    self._waiters.remove(waiter)
            if granted:
                self.release()
            raise
        self._settle(waiter, start)

    def release(self) -> None:
        """Give a slot back (to the first waiter, if any): :meth:`settle`."""
        self.settle()

    def _hand_out_locked(self) -> None:
        with self._lock:
            self._hand_out()

    def _enter(self) -> None:
        self.acquire()

    def _exit(self, exc: BaseException | None) -> None:
        self.release()

    async def _aenter(self) -> None:
        await self.aacquire()

    async def _aexit(self, exc: BaseException | None) -> None:
        self.release()

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` holding a slot."""
        self.acquire()
        try:
            return fn(*args, **kwargs)
        finally:
            self.release()

    async def acall(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Await ``fn(*args, **kwargs)`` holding a slot."""
        await self.aacquire()
        try:
            return await fn(*args, **kwargs)
        finally:
            self.release()
