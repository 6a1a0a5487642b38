# An origin's protection on the success path: the first attempt without a lock.
#
# An adapter's first attempt takes, in the engine's order (core/_engine.py), COUNT
# (the retry budget), PACE (cooldown, then pacing), ADMIT (the breaker) and a
# bulkhead slot; after the send it gives the slot back and RECORDs the outcome.
# The general path (client/_front.py's first_attempt) performs them through each
# object's own methods. When every part of an origin's guard is local (no store),
# all read one clock, and nothing is pending -- no running pause, no pacing of the
# origin, the breaker closed, a slot free -- each step is an attribute read or one
# atomic list operation:
#
#   PACE    no running pause in the cooldown's map and no pacer for the origin:
#           the wait is 0 (what OriginGuard.wait_before answers then)
#   ADMIT   the breaker's closed admission, one attribute replaced atomically
#           (what CircuitBreaker.acquire hands out while closed)
#   slot    Bulkhead.try_acquire(): a token popped off its free list
#   COUNT   RetryBudget.deposit(): a credit taken without the lock while the
#           bucket lasts (protection/_tally.py)
#   RECORD  CircuitBreaker.settle(): a success's credit taken without the lock
#           while quiet
#
# The gate looks at everything before it takes anything: a gate that finds
# something pending has taken nothing, and the adapter takes the general path,
# which waits, refuses or raises exactly as before. Of the takes, only the slot
# can fail; it comes before the count, which cannot.
#
# QuickGuard.enter() and .settle() below are the gate. RetryTransport's success
# path (client/_httpx.py: _enter and _passed, shared by its sync and async front
# ends) writes them out inline for a gate with every part (the call would cost as
# much as the gate): a change to the rules here is made there too, and
# tests/client/test_success_path_fronts.py runs each through both. The gateway's
# upstream pool keeps the same gate for its breaker and bulkhead
# (gateway/_upstream.py: UpstreamPool.enter and settle).
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._breaker import CircuitBreaker
from ._budget import RetryBudget
from ._bulkhead import Bulkhead
from ._cooldown import Cooldown
from ._origin import OriginGuard
from ._pacer import Pacer

__all__ = ["QuickGuard", "quick_guard"]


def quick_guard(
    guard: OriginGuard,
    monotonic: Callable[[], float],
    touch: Callable[[], object] | None = None,
) -> QuickGuard | None:
    """``guard``'s lock-free gate when every part is local and reads ``monotonic``
    (the adapter's clock), else None (the adapter always takes the general path).
    ``touch`` tells the registry the origin is in use; the gate calls it whenever
    it counts its budget's batch of deposits (at least every 256 requests)."""
    breaker, budget = guard.breaker, guard.budget
    cooldown, pacer = guard._cooldown, guard._pacer
    if guard.bulkhead is not None and type(guard.bulkhead) is not Bulkhead:
        return None
    if type(breaker) is CircuitBreaker and breaker._slow is not None:
        return None  # a slow_call breaker judges each duration: its own methods do
    # The parts that read a clock on the way: each local and on the adapter's clock.
    timed: list[tuple[Any, bool]] = [
        (breaker, type(breaker) is CircuitBreaker and breaker._store is None),
        (budget, type(budget) is RetryBudget and budget._scripts is None),
        (cooldown, type(cooldown) is Cooldown and cooldown._scripts is None),
        (pacer, type(pacer) is Pacer),
    ]
    for part, local in timed:
        if part is not None and not (local and part._monotonic == monotonic):
            return None
    return QuickGuard(guard, touch)


class QuickGuard:
    """The lock-free gate of one origin's first attempt (see the module comment).

    ``enter(now)`` returns a ticket (the breaker's admission, or True without a
    breaker) when the attempt may go at once, with its slot taken and its count
    made; None when the general path must decide (nothing was taken). After the
    attempt, ``settle(ticket, started, failure)`` gives the slot back and records
    the outcome; ``abandon()`` ends an attempt that never ended (cancelled).

    For a gate with every part (``parts``: breaker core, bulkhead free list and
    waiters, budget ring and deposits, breaker queue), RetryTransport's success
    path writes ``enter()`` and ``settle()``'s success case out inline
    (client/_httpx.py: a call costs as much as the whole gate); ``deposit()``,
    ``hand_out()`` and ``record()`` are their slow branches, ``pending_at()``
    their look at pauses and pacing.
    """

    # The parts' own lists and maps, read directly: each method is one frame.
    breaker: Any
    budget: Any
    bulkhead: Any
    core: Any
    deposits: Any
    free: Any
    pending: Any
    ring: Any
    waiters: Any

    __slots__ = (
        "breaker",
        "budget",
        "bulkhead",
        "core",
        "deposits",
        "free",
        "guard",
        "monotonic",
        "paced",
        "parts",
        "pauses",
        "pending",
        "ring",
        "touch",
        "waiters",
    )

    def __init__(self, guard: OriginGuard, touch: Callable[[], object] | None = None) -> None:
        self.guard = guard
        self.touch = touch
        breaker, budget, bulkhead = guard.breaker, guard.budget, guard.bulkhead
        self.breaker = breaker
        self.budget = budget
        self.bulkhead = bulkhead
        nothing: Any = None
        # The breaker's closed admission and quiet_until, and its queue of
        # lock-free successes (with the clock it reads them on).
        self.core = nothing if breaker is None else breaker._core
        self.pending = nothing if breaker is None else breaker._pending
        self.monotonic: Callable[[], float] = nothing if breaker is None else breaker._monotonic
        self.ring = nothing if budget is None else budget._core.ring
        self.deposits = nothing if budget is None else budget._deposits
        # The bulkhead's free tokens and its queue of waiters.
        self.free = nothing if bulkhead is None else bulkhead._free
        self.waiters = nothing if bulkhead is None else bulkhead._waiters
        # With every part, the ones a success path reads, for one unpacking.
        self.parts: tuple[Any, ...] = ()
        if breaker is not None and budget is not None and bulkhead is not None:
            self.parts = (
                self.core,
                self.free,
                self.waiters,
                self.ring,
                self.deposits,
                self.pending,
            )
        # Empty maps (no pause, no pacing anywhere) say "nothing pending" at one look.
        self.pauses = {} if guard._cooldown is None else guard._cooldown._pauses
        self.paced = {} if guard._pacer is None else guard._pacer._origins

    def enter(self, now: float) -> Any:
        """Take the first attempt's protection at ``now``; a ticket, or None."""
        if (self.pauses or self.paced or self.guard._episode is not None) and self.pending_at(now):
            return None
        ticket: Any = True
        core = self.core
        if core is not None:
            ticket = core.closed_admission
            if ticket is None:
                return None
        free = self.free
        if free is not None:  # Bulkhead.try_acquire(), inline
            if self.waiters:
                return None
            try:
                free.pop()
            except IndexError:
                return None
        ring = self.ring
        if ring is not None:  # RetryBudget.deposit(now), its lock-free case inline
            if now < ring.bucket_end:
                try:
                    self.deposits.pop()
                except IndexError:
                    self.deposit(now)
            else:
                self.deposit(now)
        return ticket

    def pending_at(self, now: float) -> bool:
        # Whether OriginGuard.wait_before could ask for a wait: a running pause, a
        # pacer for the origin, or a delay episode the general path has to close.
        guard = self.guard
        until = self.pauses.get(guard.origin)
        return (
            (until is not None and until > now)
            or guard.origin in self.paced
            or guard._episode is not None
        )

    def settle(self, ticket: Any, started: float, failure: bool = False) -> None:
        """The attempt entered at ``started`` ended: slot back, outcome recorded."""
        free = self.free
        if free is not None:  # Bulkhead.release(), its lock-free case inline
            free.append(None)
            if self.waiters:
                self.hand_out()
        core = self.core
        if core is None:
            return
        # CircuitBreaker.settle(), its lock-free case inline: a success that cannot
        # change the state is queued (no slow_call here: see quick_guard()).
        now = self.monotonic()
        if not failure and now < core.quiet_until and ticket is core.closed_admission:
            try:
                self.pending.pop()
                return
            except IndexError:
                pass
        self.record(ticket, started, now, failure)

    def deposit(self, now: float) -> None:
        """The budget's count of a first attempt, by its own method (its batch of
        credits is spent, or ``now`` is past the newest bucket); the registry
        hears the origin is in use."""
        self.budget.deposit(now)
        if self.touch is not None:
            self.touch()

    def hand_out(self) -> None:
        """A slot given back while callers wait for one: the first in line gets it."""
        self.bulkhead._hand_out_locked()

    def record(self, ticket: Any, started: float, now: float, failure: bool = False) -> None:
        """The outcome of an attempt admitted with ``ticket``, by the breaker's own
        method (the queue is full, or the outcome may change the state)."""
        self.breaker.settle(ticket, started, now, failure)

    def abandon(self) -> None:
        """The attempt never ended (cancelled, interrupted): its slot goes back.

        A closed admission holds nothing to give back (only probes do).
        """
        if self.bulkhead is not None:
            self.bulkhead.release()
