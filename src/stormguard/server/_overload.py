# OverloadControl: the "priority and overload control" step of a request, shared by
# the ASGI middlewares, the gRPC interceptors and (at merge) the gateway's stage.
#
#   1. admission control (optional): refuse a fraction that rises with the
#      failure rate -> 503 reason "admission_control";
#   2. the concurrency limit (a number, or an AdaptiveLimit that follows latency)
#      with a line of waiters in shedding order (core/_priority.py ShedLine):
#      a request that finds the limit full waits at most `max_wait`; a better-ranked
#      newcomer pushes the lowest waiter out of a full line. Refused because others
#      rank higher -> 503 "shed:<class>"; the wait ran out, or nobody may wait ->
#      503 "concurrency_limit". Every refusal carries Retry-After.
#      While the line stands -- it has not been empty for `standing_after`
#      seconds -- a newcomer waits at most `standing_wait` instead (controlled
#      delay, as CoDel and Facebook's queues do it: a line that drains now and then
#      absorbs a burst; a line that never drains is overload, and waiting in it only
#      adds latency to the requests it admits).
#   3. leave(): the slot goes to the best waiter; the latency feeds the adaptive
#      limit, the outcome the admission control. release(): a request that ended
#      without an outcome (it never ran, or its client left) gives its slot back
#      and teaches nothing -- a caller with a short deadline is no overload signal.
#
# Waiters are futures (asyncio callers) or events (threads, the sync gRPC server)
# woken under the lock, as in protection/_bulkhead.py: the line decides who goes
# next, the lock only guards it. A waiter re-checks its outcome under the lock when
# its wait ends, so a grant racing a timeout is used or passed on, never lost.
from __future__ import annotations

import asyncio
import math
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any, NamedTuple

from .._clock import SYSTEM_CLOCK, Clock, monotonic_of
from .._errors import ConfigError
from ..core._checks import check_count, check_number
from ..core._priority import (
    ADMITTED,
    EVICTED,
    QUEUED,
    ClientUsage,
    Priority,
    Rank,
    ShedLine,
    rank_of,
)
from ..protection._adaptive import AdaptiveLimit
from ..protection._admission_control import AdmissionControl
from ._refusal import Refusal

__all__ = ["OverloadControl", "Ticket"]

_POLL = 0.01  # seconds between readings of an injected clock by a waiting thread


class Ticket(NamedTuple):
    """An admitted request: when it was admitted (the control's clock) and its rank."""

    started: float
    rank: Rank


class _Waiter:
    __slots__ = ("event", "future", "loop", "outcome", "wait")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.wait = 0.0  # seconds it may wait (set when it joins the line)
        self.loop = loop
        self.future: asyncio.Future[None] | None = loop.create_future() if loop else None
        self.event: threading.Event | None = None if loop else threading.Event()
        self.outcome = QUEUED  # -> ADMITTED (granted) or EVICTED

    def wake(self) -> None:
        if self.event is not None:
            self.event.set()
            return
        assert self.loop is not None and self.future is not None
        try:
            self.loop.call_soon_threadsafe(_resolve, self.future)
        except RuntimeError:
            pass  # its loop is closed: the waiter is gone with it


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _admission(value: object) -> AdmissionControl | None:
    if value is None or value is False:
        return None
    if value is True:
        return AdmissionControl()
    if isinstance(value, Mapping):
        return AdmissionControl(**value)
    if isinstance(value, AdmissionControl):
        return value
    raise ConfigError("admission", "True, False, a mapping of settings or an AdmissionControl")


class OverloadControl:
    """Shed load in priority order in front of a concurrency limit.

    ``limit``: requests in flight at most, a number or an :class:`stormguard.
    AdaptiveLimit` (the limit then follows latency). A request that finds it full
    waits up to ``max_wait`` seconds in a line of at most ``max_queue`` (default:
    the limit's initial value) ordered by rank -- class first (critical, default,
    sheddable), then first attempts before retries, then light clients before
    heavy ones (each client's usage decays with ``usage_half_life``). A better
    newcomer pushes the lowest waiter out of a full line. While the line stands
    (it has not been empty for ``standing_after`` seconds) a newcomer waits at
    most ``standing_wait`` (default 5 ms, CoDel's target; never more than
    ``max_wait``; ``None``: always ``max_wait``): a line that never drains is
    overload, and a long wait in it only adds latency to what it admits.
    ``admission``: an
    :class:`stormguard.AdmissionControl` (or ``True`` / its settings) refusing a
    fraction of requests as the failure rate rises. Refusals are 503 +
    ``Retry-After: retry_after`` with reason ``shed:<class>``, ``concurrency_limit``
    or ``admission_control``. :meth:`status` and :meth:`metrics_text` show the state.
    """

    __slots__ = (
        "_adaptive",
        "_clock",
        "_empty_at",
        "_fixed",
        "_line",
        "_lock",
        "_monotonic",
        "_poll",
        "_usage",
        "admission",
        "admitted",
        "max_wait",
        "name",
        "refused",
        "retry_after",
        "standing_after",
        "standing_wait",
    )

    def __init__(
        self,
        limit: int | AdaptiveLimit = 100,
        *,
        max_queue: int | None = None,
        max_wait: float = 0.05,
        admission: AdmissionControl | bool | Mapping[str, Any] | None = None,
        usage_half_life: float = 10.0,
        retry_after: float = 1.0,
        name: str | None = None,
        clock: Clock | None = None,
        standing_wait: float | None = 0.005,
        standing_after: float = 0.1,
    ) -> None:
        if isinstance(limit, AdaptiveLimit):
            self._adaptive: AdaptiveLimit | None = limit
            self._fixed = 0
            initial = limit.limit
        else:
            self._adaptive = None
            self._fixed = initial = check_count(limit, "limit")
        self.max_wait = check_number(max_wait, "max_wait")
        if standing_wait is not None:
            standing_wait = min(self.max_wait, check_number(standing_wait, "standing_wait"))
        self.standing_wait: float | None = standing_wait
        self.standing_after = check_number(standing_after, "standing_after")
        self._empty_at = -math.inf  # when the line last went from empty to waited in
        if max_queue is None:
            max_queue = initial if self.max_wait > 0 else 0
        self._line = ShedLine(max_queue=max_queue if self.max_wait > 0 else 0)
        self.admission = _admission(admission)
        self._usage = ClientUsage(half_life=usage_half_life)
        if not isinstance(retry_after, int | float) or not retry_after > 0:
            raise ConfigError("retry_after", f"must be > 0 seconds, got {retry_after!r}")
        self.retry_after = float(retry_after)
        self.name = name
        self._clock = clock or SYSTEM_CLOCK
        self._monotonic = monotonic_of(self._clock)
        self._poll = math.inf if self._clock is SYSTEM_CLOCK else _POLL
        self._lock = threading.Lock()
        self.admitted = 0
        self.refused: Counter[str] = Counter()

    @property
    def limit(self) -> int:
        """Requests that may be in flight now."""
        return self._adaptive.limit if self._adaptive is not None else self._fixed

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet finished."""
        return self._line.in_flight

    @property
    def waiting(self) -> int:
        """Requests waiting in line now."""
        return self._line.waiting

    def rank(self, priority: Priority | int, attempt: int = 1, client: str | None = None) -> Rank:
        """The rank of a request (counts it in its client's usage)."""
        band = 0
        if client is not None:
            with self._lock:
                band = self._usage.band(client, self._monotonic())
        return rank_of(priority, attempt, band=band)

    # -- entering ---------------------------------------------------------------

    def _refusal(self, reason: str, detail: str) -> Refusal:
        self.refused[reason] += 1
        return Refusal.of(503, detail, reason=reason, retry_after=self.retry_after)

    def _shed(self, rank: Rank) -> Refusal:
        return self._refusal(f"shed:{rank.label}", "overloaded: requests that rank higher go first")

    def _full(self) -> Refusal:
        return self._refusal("concurrency_limit", "overloaded: too many requests in flight")

    def _arrive(
        self, rank: Rank, loop: asyncio.AbstractEventLoop | None
    ) -> Ticket | Refusal | _Waiter:
        # Admission control, then the line: a Ticket, a Refusal, or a waiter to wait on.
        admission = self.admission
        if admission is not None and not admission.admits():
            self.refused["admission_control"] += 1
            return Refusal.of(
                503,
                "overloaded: refusing a share of requests while the failure rate is high",
                reason="admission_control",
                retry_after=self.retry_after,
            )
        waiter = _Waiter(loop) if self.max_wait > 0 else None
        with self._lock:
            empty = self._line.waiting == 0
            verdict, evicted = self._line.arrive(waiter, rank, self.limit)
            if verdict is ADMITTED:
                self.admitted += 1
                return Ticket(self._monotonic(), rank)
            if verdict is EVICTED:
                evicted.outcome = EVICTED
                evicted.wake()
            elif verdict is not QUEUED:
                return self._full() if waiter is None else self._shed(rank)
            assert waiter is not None
            waiter.wait = self._wait_of(empty)
        return waiter

    def _wait_of(self, empty: bool) -> float:
        # How long a newcomer joining the line may wait (under the lock): max_wait,
        # or standing_wait once the line has stood for standing_after seconds.
        standing = self.standing_wait
        if standing is None:
            return self.max_wait
        now = self._monotonic()
        if empty:
            self._empty_at = now
            return self.max_wait
        return standing if now - self._empty_at >= self.standing_after else self.max_wait

    def _settle(self, waiter: _Waiter, rank: Rank) -> Ticket | Refusal:
        # The wait ended (woken or timed out): granted, evicted, or out of line.
        with self._lock:
            if waiter.outcome is QUEUED:
                self._line.withdraw(waiter)
                return self._full()
            if waiter.outcome is EVICTED:
                return self._shed(rank)
            self.admitted += 1
            return Ticket(self._monotonic(), rank)

    def _abandon(self, waiter: _Waiter) -> None:
        # The waiter's caller is gone (cancelled): out of line, or its slot passed on.
        with self._lock:
            if waiter.outcome is QUEUED:
                self._line.withdraw(waiter)
                return
            granted = waiter.outcome is ADMITTED
        if granted:
            self._give_back()

    async def aenter(
        self,
        priority: Priority | int = Priority.DEFAULT,
        attempt: int = 1,
        client: str | None = None,
    ) -> Ticket | Refusal:
        """Admit a request (waiting up to ``max_wait``, or ``standing_wait`` while the
        line stands): its Ticket, or a Refusal (503)."""
        rank = self.rank(priority, attempt, client)
        arrived = self._arrive(rank, asyncio.get_running_loop() if self.max_wait > 0 else None)
        if not isinstance(arrived, _Waiter):
            return arrived
        future = arrived.future
        assert future is not None
        start = self._monotonic()
        left = wait = arrived.wait
        try:
            while left > 0 and not future.done():
                try:
                    await asyncio.wait_for(asyncio.shield(future), min(left, self._poll))
                except TimeoutError:
                    left = start + wait - self._monotonic()
        except BaseException:
            self._abandon(arrived)
            raise
        return self._settle(arrived, rank)

    def enter(
        self,
        priority: Priority | int = Priority.DEFAULT,
        attempt: int = 1,
        client: str | None = None,
    ) -> Ticket | Refusal:
        """Sync twin of :meth:`aenter` (blocks the thread up to ``max_wait``)."""
        rank = self.rank(priority, attempt, client)
        arrived = self._arrive(rank, None)
        if not isinstance(arrived, _Waiter):
            return arrived
        event = arrived.event
        assert event is not None
        start = self._monotonic()
        left = wait = arrived.wait
        while left > 0 and not event.wait(min(left, self._poll)):
            left = start + wait - self._monotonic()
        return self._settle(arrived, rank)

    # -- leaving ----------------------------------------------------------------

    def _give_back(self) -> None:
        with self._lock:
            self._line.leave()
            granted = self._line.grant(self.limit)
        for waiter in granted:
            waiter.outcome = ADMITTED
            waiter.wake()

    def release(self, ticket: Ticket) -> None:
        """Give back the slot of an admitted request that never ran (nothing is learnt)."""
        self._give_back()

    def abandon(self, ticket: Ticket) -> None:
        """An admitted request whose caller left before the answer while its work may
        go on where nobody can stop it (an upstream behind a proxy keeps serving a
        request whose client hung up). The time it was admitted is a lower bound of
        its latency: above the unloaded latency (``AdaptiveLimit.queued_after``) it
        is a timeout, as the caller saw it -- the limit may not grow and falls by the
        limit's ``backoff`` (callers giving up on a slow service are the overload
        signal, and the work they left still loads the service) -- and below it,
        nothing is learnt (a short deadline of the caller's own). Either way the slot
        is given back; admission control learns nothing."""
        adaptive = self._adaptive
        if adaptive is not None:
            bound = adaptive.queued_after
            elapsed = self._monotonic() - ticket.started
            if bound is not None and elapsed > bound:
                adaptive.record(elapsed, in_flight=self._line.in_flight, dropped=True)
        self._give_back()

    def leave(
        self, ticket: Ticket, *, failed: bool = False, dropped: bool = False, measured: bool = True
    ) -> None:
        """An admitted request ended. ``failed``: the app or upstream failed it (5xx,
        an error); ``dropped``: it answered "overloaded" or timed out upstream (the
        adaptive limit learns "too much" from it, not a latency); ``measured=False``:
        its latency means nothing (it raised)."""
        if self._adaptive is not None and (measured or dropped):
            self._adaptive.record(
                self._monotonic() - ticket.started, in_flight=self._line.in_flight, dropped=dropped
            )
        if self.admission is not None:
            self.admission.record(not (failed or dropped))
        self._give_back()

    # -- state ------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The state for ``/status``: ``{"limit", "in_flight", "waiting", "admitted",
        "refused": {reason: N}, "adaptive": {...} | None, "admission": {...} | None}``."""
        return {
            "limit": self.limit,
            "in_flight": self._line.in_flight,
            "waiting": self._line.waiting,
            "admitted": self.admitted,
            "refused": dict(self.refused),
            "adaptive": None if self._adaptive is None else self._adaptive.status(),
            "admission": None if self.admission is None else self.admission.status(),
        }

    def metrics_text(self, prefix: str = "stormguard_overload") -> str:
        """The state as Prometheus text exposition (gauges and counters)."""
        status = self.status()
        label = f'{{name="{self.name}"}}' if self.name else ""
        lines = [
            f"# TYPE {prefix}_limit gauge",
            f"{prefix}_limit{label} {status['limit']}",
            f"# TYPE {prefix}_in_flight gauge",
            f"{prefix}_in_flight{label} {status['in_flight']}",
            f"# TYPE {prefix}_waiting gauge",
            f"{prefix}_waiting{label} {status['waiting']}",
            f"# TYPE {prefix}_admitted_total counter",
            f"{prefix}_admitted_total{label} {status['admitted']}",
            f"# TYPE {prefix}_refused_total counter",
        ]
        name = f'name="{self.name}",' if self.name else ""
        for reason, count in sorted(status["refused"].items()):
            lines.append(f'{prefix}_refused_total{{{name}reason="{reason}"}} {count}')
        adaptive = status["adaptive"]
        if adaptive is not None:
            for key in ("min_rtt", "sample_rtt"):
                if adaptive[key] is not None:
                    lines.append(f"# TYPE {prefix}_{key}_seconds gauge")
                    lines.append(f"{prefix}_{key}_seconds{label} {adaptive[key]:.6f}")
            lines.append(f"# TYPE {prefix}_gradient gauge")
            lines.append(f"{prefix}_gradient{label} {adaptive['gradient']:.4f}")
        admission = status["admission"]
        if admission is not None:
            lines.append(f"# TYPE {prefix}_reject_probability gauge")
            lines.append(
                f"{prefix}_reject_probability{label} {admission['reject_probability']:.4f}"
            )
        return "\n".join(lines) + "\n"
