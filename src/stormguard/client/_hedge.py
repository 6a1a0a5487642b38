# The hedging race, driven sync (worker threads) or async (tasks): the rules of
# core/_hedge.py (HedgePolicy) performed on copies a front end knows how to send.
#
# A front end hands the Hedger three things: `send(n)` makes copy n (1-based)
# and returns its answer (or raises), `final(answer)` says whether an answer ends
# the race (an answer to return: a success, a 404) or not (a 5xx, a 429, a
# transport error: the next copy goes at once), and `discard(value)` drops the
# answer of a copy that lost (closes its response). The Hedger counts requests
# and extra copies in its budget, records the latency of every copy that answers,
# and picks the delay.
#
# Cancelling: an async loser is cancelled (its task, and with it the HTTP request
# or the gRPC call). A sync copy runs in a worker thread, which cannot be
# interrupted: a loser not yet started is not sent, one in flight runs to its end
# (or its timeout) and its answer is discarded when it arrives.
from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple

from ..core._hedge import HedgePolicy, LatencyWindow
from ..protection._budget import RetryBudget

__all__ = ["Answer", "Hedger"]

_WORKERS = 32  # threads a sync Hedger keeps for its copies


class Answer(NamedTuple):
    """What one copy came back with: its value or its error, and its latency."""

    copy: int
    value: Any
    error: BaseException | None
    latency: float

    def unwrap(self) -> Any:
        """The value, or the error raised."""
        if self.error is not None:
            raise self.error
        return self.value


Send = Callable[[int], Any]
ASend = Callable[[int], Awaitable[Any]]
Final = Callable[[Answer], bool]
Discard = Callable[[Any], None]
ADiscard = Callable[[Any], Awaitable[None]]


class Hedger:
    """One hedging policy at run time: its latencies, its budget, its threads.

    ``budget`` bounds the extra copies (default: a :class:`RetryBudget` with the
    policy's ``ratio`` and ``min_per_second``); a first copy is counted as a
    request, each extra one must be allowed by ``budget.try_retry()``.
    """

    __slots__ = ("_lock", "_pool", "budget", "latencies", "policy")

    def __init__(self, policy: HedgePolicy, *, budget: Any = None) -> None:
        self.policy = policy
        self.budget = budget or RetryBudget(
            ratio=policy.ratio, min_per_second=policy.min_per_second
        )
        self.latencies = LatencyWindow(policy.window)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def delay(self) -> float:
        """Seconds to wait for an answer before the next copy."""
        with self._lock:
            return self.policy.delay_for(self.latencies)

    def _seen(self, answer: Answer) -> None:
        with self._lock:
            self.latencies.record(answer.latency)

    def _extra(self) -> bool:
        # One more copy, if the budget allows it.
        return bool(self.budget.try_retry())

    def close(self) -> None:
        """Stop the worker threads (copies in flight finish first)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    # -- sync: copies in worker threads ---------------------------------------------

    @staticmethod
    def _timed(send: Send, copy: int) -> Answer:
        started = time.monotonic()
        try:
            value = send(copy)
        except Exception as exc:
            return Answer(copy, None, exc, time.monotonic() - started)
        return Answer(copy, value, None, time.monotonic() - started)

    def run(self, send: Send, final: Final, discard: Discard) -> Any:
        """Race copies of one request (see the module comment); the first final
        answer's value is returned (or its error raised), else the last one's."""
        pool = self._pool
        if pool is None:
            pool = self._pool = ThreadPoolExecutor(_WORKERS, "stormguard-hedge")
        race = _Race(self, final, time.monotonic)
        running: dict[Future[Answer], int] = {}

        def launch(copy: int) -> None:
            context = contextvars.copy_context()  # (the caller's, in the worker)
            running[pool.submit(context.run, self._timed, send, copy)] = copy

        launch(1)
        try:
            while running and race.winner is None:
                done, _ = wait(running, timeout=race.timeout(), return_when=FIRST_COMPLETED)
                for copy in race.next_copies([future.result() for future in done]):
                    launch(copy)
                for future in done:
                    del running[future]
        finally:
            for future in running:  # losers: unsent ones stay unsent, the rest dropped
                if not future.cancel():
                    future.add_done_callback(lambda done: _drop(done.result(), discard))
        for dropped in race.dropped:
            _drop(dropped, discard)
        return race.answer()

    # -- async: copies as tasks -------------------------------------------------------

    @staticmethod
    async def _atimed(asend: ASend, copy: int) -> Answer:
        started = time.monotonic()
        try:
            value = await asend(copy)
        except Exception as exc:
            return Answer(copy, None, exc, time.monotonic() - started)
        return Answer(copy, value, None, time.monotonic() - started)

    async def arun(self, asend: ASend, final: Final, adiscard: ADiscard) -> Any:
        """Async twin of :meth:`run`: the losers are cancelled."""
        race = _Race(self, final, asyncio.get_running_loop().time)
        running: dict[asyncio.Task[Answer], int] = {}

        def launch(copy: int) -> None:
            running[asyncio.ensure_future(self._atimed(asend, copy))] = copy

        launch(1)
        try:
            while running and race.winner is None:
                done, _ = await asyncio.wait(
                    running, timeout=race.timeout(), return_when=FIRST_COMPLETED
                )
                for copy in race.next_copies([task.result() for task in done]):
                    launch(copy)
                for task in done:
                    del running[task]
        finally:
            for task in running:
                task.cancel()
            for result in await asyncio.gather(*running, return_exceptions=True):
                if isinstance(result, Answer):  # it answered before the cancel reached it
                    race.dropped.append(result)
        for dropped in race.dropped:
            await _adrop(dropped, adiscard)
        return race.answer()


class _Race:
    """One request's race, the same for both drivers: which copies go when, which
    answer wins, which answers are dropped (HedgePolicy's rules, module comment)."""

    __slots__ = (
        "_clock",
        "_final",
        "delay",
        "dropped",
        "hedger",
        "hedging",
        "last",
        "next_at",
        "sent",
        "winner",
    )

    def __init__(self, hedger: Hedger, final: Final, clock: Callable[[], float]) -> None:
        self.hedger = hedger
        self._final = final
        self._clock = clock
        hedger.budget.record_request()
        self.delay = hedger.delay()
        self.next_at = clock() + self.delay
        self.sent = 1
        self.hedging = True
        self.last: Answer | None = None
        self.winner: Answer | None = None
        self.dropped: list[Answer] = []

    def timeout(self) -> float | None:
        """How long to wait for an answer before the next copy (None: for ever)."""
        if self.hedging and self.sent < self.hedger.policy.attempts:
            return max(0.0, self.next_at - self._clock())
        return None

    def _another(self) -> list[int]:
        # One more copy if the policy and the budget allow it.
        if not (self.hedging and self.sent < self.hedger.policy.attempts):
            return []
        self.hedging = self.hedger._extra()
        if not self.hedging:
            return []
        self.sent += 1
        self.next_at = self._clock() + self.delay
        return [self.sent]

    def next_copies(self, answers: list[Answer]) -> list[int]:
        """The copies to send after a wait that ended with ``answers`` (none: the
        delay passed); a final answer sets ``winner``."""
        if not answers:
            return self._another()
        launch: list[int] = []
        for answer in sorted(answers):
            self.hedger._seen(answer)
            if self.winner is not None:
                self.dropped.append(answer)
            elif self._final(answer):
                self.winner = answer
            else:
                if self.last is not None:
                    self.dropped.append(self.last)
                self.last = answer
                launch += self._another()  # a failure: the next copy at once
        if self.winner is not None and self.last is not None:
            self.dropped.append(self.last)
            self.last = None
        return [] if self.winner is not None else launch

    def answer(self) -> Any:
        """The winner's value (or its error raised), else the last failure's."""
        answer = self.winner or self.last
        assert answer is not None
        return answer.unwrap()


def _drop(answer: Answer, discard: Discard) -> None:
    if answer.error is None and answer.value is not None:
        discard(answer.value)


async def _adrop(answer: Answer, adiscard: ADiscard) -> None:
    if answer.error is None and answer.value is not None:
        await adiscard(answer.value)
