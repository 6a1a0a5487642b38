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
#   ADMIT   CircuitBreaker.try_enter(): the closed admission, one attribute read
#   slot    Bulkhead.try_enter(): a token popped off its free list
#   COUNT   RetryBudget.deposit(): a credit taken without the lock while the
#           bucket lasts (protection/_tally.py)
#   RECORD  CircuitBreaker.settle(): a success's credit taken without the lock
#           while quiet; Bulkhead.settle() gives the slot back
#
# The gate looks at everything before it takes anything: a gate that finds
# something pending has taken nothing, and the adapter takes the general path,
# which waits, refuses or raises exactly as before. Of the takes, only the slot
# can fail; it comes after the breaker's (which takes nothing) and before the
# count, which cannot fail.
#
# The breaker's and the bulkhead's rules are theirs alone: the gate calls their
# public lock-free pairs (try_enter / settle) and copies neither. Every front end
# -- RetryTransport's and RetryAdapter's success paths, the general path's
# resume() -- enters and settles through QuickGuard.enter() and .settle().
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
    """

    __slots__ = (
        "admit",
        "breaker",
        "budget",
        "bulkhead",
        "deposits",
        "give",
        "guard",
        "monotonic",
        "paced",
        "pauses",
        "record",
        "ring",
        "take",
        "touch",
    )

    def __init__(self, guard: OriginGuard, touch: Callable[[], object] | None = None) -> None:
        self.guard = guard
        self.touch = touch
        breaker, budget, bulkhead = guard.breaker, guard.budget, guard.bulkhead
        self.breaker = breaker
        self.budget = budget
        self.bulkhead = bulkhead
        nothing: Any = None
        # The pairs' entries, bound once.
        self.admit: Callable[[], Any] | None = None if breaker is None else breaker.try_enter
        self.take: Callable[[], bool] | None = None if bulkhead is None else bulkhead.try_enter
        # ... and their settles (no bound method made per request).
        self.give: Callable[[], None] | None = None if bulkhead is None else bulkhead.settle
        self.record: Callable[..., None] | None = None if breaker is None else breaker.settle
        # The clock the breaker's settle() reads its `now` on (the adapter's).
        self.monotonic: Callable[[], float] = nothing if breaker is None else breaker._monotonic
        # The budget's newest bucket and its lock-free credits (protection/_budget.py).
        self.ring = nothing if budget is None else budget._core.ring
        self.deposits = nothing if budget is None else budget._deposits
        # Empty maps (no pause, no pacing anywhere) say "nothing pending" at one look.
        self.pauses = {} if guard._cooldown is None else guard._cooldown._pauses
        self.paced = {} if guard._pacer is None else guard._pacer._origins

    def enter(self, now: float) -> Any:
        """Take the first attempt's protection at ``now``; a ticket, or None."""
        if (self.pauses or self.paced or self.guard._episode is not None) and self.pending_at(now):
            return None
        ticket: Any = True
        admit = self.admit
        if admit is not None:
            ticket = admit()
            if ticket is None:
                return None
        take = self.take
        if take is not None and not take():
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
        give = self.give
        if give is not None:
            give()
        record = self.record
        if record is not None:
            record(ticket, started, self.monotonic(), failure)

    def deposit(self, now: float) -> None:
        """The budget's count of a first attempt, by its own method (its batch of
        credits is spent, or ``now`` is past the newest bucket); the registry
        hears the origin is in use."""
        budget: Any = self.budget
        budget.deposit(now)
        if self.touch is not None:
            self.touch()

    def abandon(self) -> None:
        """The attempt never ended (cancelled, interrupted): its slot goes back.

        A closed admission holds nothing to give back (only probes do).
        """
        if self.bulkhead is not None:
            self.bulkhead.settle()
