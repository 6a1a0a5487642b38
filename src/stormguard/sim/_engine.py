# Shared machinery of the simulator: seeding, the optional extras, progress, and
# the callers that retry (Callers).
#
# Reproducibility: every independent piece of work (one occ configuration, one
# storm strategy, one budget client ...) gets its own generator seeded from
# (seed, *keys). The result is then the same whatever the order in which pieces
# run, and whatever the number of worker processes.
from __future__ import annotations

import hashlib
import heapq
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._extras import require
from ..core._budget import RetryBudgetCore
from ..core._policy import GiveUp, RetryFailure, RetryPolicy, RetryState, decide

__all__ = ["Callers", "Ticker", "numpy", "progress", "py_rng", "seed_words"]


def numpy() -> Any:
    """The numpy module, or MissingExtra naming ``stormguard[sim]``."""
    return require("numpy", "sim")


def seed_words(seed: int, *keys: object) -> list[int]:
    """Four 32-bit words derived from ``seed`` and ``keys`` (stable across runs)."""
    text = repr((int(seed), *(str(k) for k in keys))).encode()
    digest = hashlib.blake2b(text, digest_size=16).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]


def py_rng(seed: int, *keys: object) -> random.Random:
    """A ``random.Random`` for one piece of work, seeded from ``seed`` and ``keys``."""
    words = seed_words(seed, *keys)
    return random.Random(sum(w << (32 * i) for i, w in enumerate(words)))


@dataclass(slots=True)
class Callers:
    """Callers that retry, in virtual time: a Poisson stream of calls (``rate`` per
    second until ``duration``) merged, in time order, with the retries scheduled
    into it.

    Iterating gives every attempt as ``(now, state)``: a new call's first attempt
    (``state.attempts == 1``; counted in ``calls`` and recorded in ``budget``) or a
    retry. After a failed attempt, :meth:`retry` decides as the library's driver
    does -- ``core._policy.decide()``, then the budget -- and schedules the retry.
    Every draw comes from ``rng``, in the order the scenarios always drew them.
    The stream ends at the first arrival past ``duration``: retries due after it
    are not simulated.
    """

    rate: float
    duration: float
    rng: random.Random
    policy: RetryPolicy = field(kw_only=True)
    failure: RetryFailure = field(kw_only=True)
    budget: RetryBudgetCore | None = field(default=None, kw_only=True)
    calls: int = field(default=0, init=False)
    _queue: list[tuple[float, int, RetryState]] = field(default_factory=list, init=False)
    _sequence: int = field(default=0, init=False)  # ties in _queue keep their order

    def __iter__(self) -> Iterator[tuple[float, RetryState]]:
        queue, rng = self._queue, self.rng
        next_call = rng.expovariate(self.rate)  # arrivals are drawn lazily
        while True:
            if queue and queue[0][0] <= next_call:
                now, _, state = heapq.heappop(queue)
            elif next_call < self.duration:
                now = next_call
                state = RetryState(started_at=now)
                next_call += rng.expovariate(self.rate)
                self.calls += 1
                if self.budget is not None:
                    self.budget.record_request(now)
            else:
                return
            yield now, state

    def retry(self, state: RetryState, reply: float) -> bool:
        """Schedule the retry of an attempt that failed, answered at ``reply``;
        False: the call gives up (the policy said so, or the budget refused)."""
        decision = decide(self.policy, state, self.failure, now=reply, rng=self.rng)
        if isinstance(decision, GiveUp):
            return False
        if self.budget is not None and not self.budget.try_retry(reply):
            return False
        retry = (reply + decision.wait, self._sequence, state.after_wait(decision.wait))
        heapq.heappush(self._queue, retry)
        self._sequence += 1
        return True


class Ticker(Protocol):
    """Advances a progress display by a number of units of work."""

    def __call__(self, units: float = 1.0) -> None: ...


@contextmanager
def progress(label: str, total: float, *, enabled: bool | None = None) -> Iterator[Ticker]:
    """A rich progress bar for long runs; silent when disabled or not on a terminal."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield _noop
        return
    rich_progress = require("rich.progress", "sim")
    rich_console = require("rich.console", "sim")
    bar = rich_progress.Progress(
        rich_progress.TextColumn("[bold]{task.description}"),
        rich_progress.BarColumn(),
        rich_progress.TaskProgressColumn(),
        rich_progress.TimeElapsedColumn(),
        console=rich_console.Console(stderr=True),
        transient=False,
        # No refresh thread: the bar redraws on each tick, so the process stays
        # single-threaded and the occ sweep can fork its workers safely.
        auto_refresh=False,
    )
    with bar:
        task = bar.add_task(label, total=total)

        def tick(units: float = 1.0) -> None:
            bar.advance(task, units)
            bar.refresh()

        yield tick


def _noop(units: float = 1.0) -> None:
    return None
