# One upstream as the gateway sees it: its targets (round-robin with passive
# ejection), its own aiohttp connection pool (pinned: one upstream cannot take every
# connection), and the protection objects from stormguard.protection around it --
# a CircuitBreaker (shared through the store when the store is Redis), the server
# side's Admission (a Bulkhead with a per-client share), and a RetryBudget for the
# retries of safe failures.
#
# Nothing here speaks ASGI; the request chain (chain/) asks for admission, picks a
# target, and reports what happened.
#
# Time: the breaker's cooldown and window, the bulkhead's waits, the retry budget's
# window and a target's ejection are all read on the one clock the pool is given
# (the runtime's, so a test can run them on a FakeClock). The connection pool's
# deadlines (connect/read timeouts, idle sweeps) stay on the event loop's clock:
# they bound waits on real sockets.
from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._clock import SYSTEM_CLOCK, Clock, monotonic_of
from ..core._breaker import Admission as BreakerAdmission
from ..core._policy import RetryPolicy
from ..protection import CircuitBreaker, RetryBudget
from ..protection._breaker_store import CachedAdmission
from ..protection._bulkhead import Bulkhead
from ..protection._permit import BreakerEvent, Permit
from ..server._admission import Admission
from ..server._overload import OverloadControl
from ..server._refusal import Refusal
from ._config import Upstream as UpstreamSettings
from ._h1client import H1Pool
from ._retries import policy_of
from ._tls import client_context

if TYPE_CHECKING:
    import aiohttp

__all__ = ["Held", "Holder", "Target", "UpstreamPool"]


class Target:
    """One upstream address with its passive-ejection bookkeeping."""

    __slots__ = ("base", "ejected_until", "failures", "url")

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.base = self.url
        self.failures = 0
        self.ejected_until = 0.0


@dataclass(slots=True)
class Held:
    """What one admitted request holds: the breaker permit and its bulkhead slots.

    ``ticket`` instead of a permit: what :meth:`UpstreamPool.enter` admitted with
    (reported with :meth:`UpstreamPool.settle`). The callback path's exchange
    holds these fields itself (chain/_exchange.py).
    """

    permit: Permit | None
    client: str | None
    admitted: bool
    ticket: BreakerAdmission | bool | None = None


class Holder(Protocol):
    """Whatever holds an admission: a :class:`Held`, or an object with its fields."""

    permit: Permit | None
    admitted: bool
    ticket: BreakerAdmission | bool | None

    @property
    def client(self) -> str | None: ...


def overload_of(
    settings: UpstreamSettings, name: str, instances: int, clock: Clock | None = None
) -> OverloadControl | None:
    """The upstream's overload control (priority and overload stage), or None; its
    waits, latencies and admission-control window on ``clock`` (default: the system's).

    The limit is per process: an adaptive limit follows the latency this process
    measures, and with ``instances`` processes (the fleet's ``instances``, else
    the gateway's workers) its bounds are divided by them (docs/overload.md: why
    a fleet divides rather than shares). Admission control alone leaves the
    concurrency unbounded.
    """
    if not settings.overloaded:
        return None
    from ..protection._adaptive import AdaptiveLimit
    from ..protection._admission_control import AdmissionControl

    line = settings.overload
    limit: int | AdaptiveLimit
    if settings.adaptive is not None:
        limit = AdaptiveLimit(**{"instances": instances, **settings.adaptive}, clock=clock)
    elif line is not None and line.limit is not None:
        limit = line.limit
    else:
        limit = _UNBOUNDED
    admission = (
        AdmissionControl(**settings.admission, clock=clock)
        if settings.admission is not None
        else None
    )
    if line is None:
        return OverloadControl(limit, admission=admission, name=name, clock=clock)
    return OverloadControl(
        limit,
        max_queue=line.max_queue,
        max_wait=line.max_wait,
        admission=admission,
        retry_after=line.retry_after,
        name=name,
        standing_wait=line.standing_wait,
        standing_after=line.standing_after,
        clock=clock,
    )


# The shared breaker's failure reports in flight (a task is kept until it ends).
_REPORTS: set[asyncio.Task[None]] = set()

_UNBOUNDED = 1 << 30  # admission control alone: no concurrency bound


class UpstreamPool:
    """An upstream's targets, connection pool and protection (built from its settings).

    ``clock`` (default: the system clock) is the breaker's, the bulkhead's, the retry
    budget's and the targets' ejection clock.
    """

    def __init__(
        self,
        name: str,
        settings: UpstreamSettings,
        *,
        store: Any = None,
        on_breaker_event: Callable[[BreakerEvent], None] | None = None,
        instances: int = 1,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self.clock: Clock = clock or SYSTEM_CLOCK
        self._monotonic = monotonic_of(clock)
        self.settings = settings
        self._shared = store is not None  # the breaker's state is in the store
        self.targets = [Target(url) for url in settings.all_targets]
        self._next = 0
        self.in_flight = 0
        b = settings.breaker
        self.breaker: CircuitBreaker | None = None
        if b is not None:  # the settings' fields are CircuitBreaker's own keywords
            self.breaker = CircuitBreaker(
                **b.model_dump(),
                store=store,
                name=f"gateway:{name}" if store is not None else name,
                listeners=(on_breaker_event,) if on_breaker_event else (),
                probe_lease=max(settings.timeout.connect + settings.timeout.read, 1.0),
                clock=clock,
            )
        h = settings.bulkhead
        # The server side's Admission: the pool's bulkhead plus a per-client share.
        self.bulkhead = (
            Admission(
                h.limit,
                per_client=h.per_client,
                max_wait=h.max_wait,
                retry_after=max(1.0, h.max_wait),
                name=name,
                clock=clock,
            )
            if h
            else None
        )
        r = settings.retries
        self.attempts = r.attempts if r is not None else 1
        self.budget: RetryBudget | None = None
        if r is not None and r.attempts > 1:
            # Per process on purpose: a ratio of retries to requests holds for the
            # fleet when it holds in each process, and a shared budget would cost a
            # store round trip on every request (only the small reserve scales with
            # the number of processes).
            self.budget = RetryBudget(ratio=r.budget, min_per_second=1.0, clock=clock)
        # The attempts' retry policy (_retries.py), and the one for a request whose
        # body streams (it cannot be replayed: one attempt).
        self.policy = policy_of(self.attempts, self.budget, self.breaker)
        self.single = policy_of(1, self.budget, self.breaker)
        self._grpc_policy = policy_of(self.attempts, self.budget, None)
        # The proxy leg's keep-alive connections (_h1client.py); aiohttp's session is
        # made only for the WebSocket leg.
        limit = settings.bulkhead.limit if settings.bulkhead else 100
        self.tls: ssl.SSLContext | None = None  # https:// / wss:// targets (upstreams.NAME.tls)
        self.server_name = settings.tls.server_name if settings.tls is not None else None
        if settings.secure:
            self.tls = client_context(settings.tls, f"upstreams.{name}.tls")
        self.client = H1Pool(limit, settings.timeout, tls=self.tls, server_name=self.server_name)
        self._session: aiohttp.ClientSession | None = None
        self._gate = self._quick_gate()
        self.overload = overload_of(settings, name, instances, clock)
        # a request whose client left keeps its slot until the upstream answers
        self.holds = self.overload is not None and (
            settings.overload is None or settings.overload.hold_abandoned
        )

    # -- admission -----------------------------------------------------------------

    # The lock-free gate (enter / settle / done), on the public pairs protection/
    # gives for it (CircuitBreaker.try_enter/settle, Bulkhead.try_enter/settle, as
    # protection/_quick.py uses them on the client side): when the breaker is in
    # this process without slow_call and the bulkhead has no per-client share,
    # admitting a request that nothing has to decide -- the breaker closed, a slot
    # free, nobody waiting -- is the breaker's closed admission and a slot taken;
    # its end settles both. Anything else is admit_now's, which has taken nothing.
    # A breaker shared through the store (fleet mode) admits on the gate while its
    # near cache is fresh and closed (CircuitBreaker.try_enter_cached), which is
    # what admit() would decide without a round trip too.

    @property
    def grpc_policy(self) -> RetryPolicy:
        """The gRPC leg's policy: one breaker permit covers a whole call (taken and
        recorded around it), so its conversation asks no breaker. Made again when
        the budget was replaced."""
        policy = self._grpc_policy
        if policy.budget is not self.budget:
            policy = self._grpc_policy = policy_of(self.attempts, self.budget, None)
        return policy

    def _quick_gate(self) -> tuple[Any, Any, Any, Any] | None:
        # (breaker.try_enter, breaker.settle, bulkhead.try_enter, bulkhead.settle),
        # bound once; None for a part the pool does not have.
        breaker, admission = self.breaker, self.bulkhead
        admit = record = take = give = None
        if breaker is not None:
            if type(breaker) is not CircuitBreaker or breaker.config.slow_call is not None:
                return None  # a slow_call breaker judges each duration: its own methods do
            # shared (fleet): admitted from the breaker's near cache while it is fresh
            # and closed; a success joins its next batch, a failure goes in a task
            admit = breaker.try_enter_cached if self._shared else breaker.try_enter
            record = breaker.settle
        if admission is not None:
            bulkhead = admission.bulkhead
            if admission.per_client is not None or type(bulkhead) is not Bulkhead:
                return None
            take, give = bulkhead.try_enter, bulkhead.settle
        return admit, record, take, give

    def enter(self) -> Any:
        """Admit at once through the lock-free gate: the ticket to report with
        (:meth:`settle`; the breaker's closed admission, True without a breaker),
        the bulkhead slot taken. None when the gate cannot decide; nothing taken."""
        gate = self._gate
        if gate is None:
            return None
        admit, _, take, _ = gate
        ticket = True
        if admit is not None:
            ticket = admit()
            if ticket is None:
                return None
        if take is not None and not take():
            return None
        self.in_flight += 1
        return ticket

    def settle(self, held: Holder, failure: bool | None) -> None:
        """Tell the breaker how a call admitted by :meth:`enter` went (None: it never
        reached the upstream; a closed admission has nothing to give back), once."""
        ticket = held.ticket
        if ticket is None:
            return
        held.ticket = None
        if failure is None or ticket is True:
            return
        # `now` on the breaker's clock (the pool's); no slow_call, so `started` is unused.
        now = self._monotonic()
        if failure and ticket.__class__ is CachedAdmission:  # to the store: a task
            assert self.breaker is not None
            task = asyncio.get_running_loop().create_task(
                self.breaker.asettle(ticket, 0.0, now, True)
            )
            _REPORTS.add(task)
            task.add_done_callback(_REPORTS.discard)
            return
        self._gate[1](ticket, 0.0, now, failure)  # type: ignore[index]

    def admit_now(self, client: str) -> Held | Refusal | None:
        """:meth:`admit` when nothing has to be awaited: a breaker in this process and
        a free bulkhead slot (the common case). None: ask :meth:`admit`."""
        if self._shared:
            return None
        permit = self.breaker.acquire() if self.breaker is not None else None
        if self.bulkhead is not None:
            entered = self.bulkhead.try_enter(client)
            if entered is not True:
                if permit is not None:
                    permit.release()
                return None if entered is False else entered
        self.in_flight += 1
        return Held(permit, client, True)

    async def admit(self, client: str) -> Held | Refusal:
        """Ask the breaker, then the bulkhead (client share, then pool) for a slot.

        Raises :class:`CircuitOpen`; returns the bulkhead's Refusal (503) when full.
        Holds nothing when it does not admit.
        """
        permit = await self.breaker.aacquire() if self.breaker is not None else None
        if self.bulkhead is not None:
            try:
                refusal = await self.bulkhead.aenter(client)
            except BaseException:
                if permit is not None:
                    await permit.arelease()
                raise
            if refusal is not None:
                if permit is not None:
                    await permit.arelease()
                return refusal
        self.in_flight += 1
        return Held(permit, client, True)

    def done(self, held: Holder) -> None:
        """The request no longer holds the upstream."""
        if held.admitted:
            held.admitted = False
            self.in_flight -= 1
            gate = self._gate
            if gate is not None:  # no client share: the slot goes straight back
                give = gate[3]
                if give is not None:
                    give()  # Bulkhead.settle()
            elif self.bulkhead is not None:
                self.bulkhead.leave(held.client)

    # -- targets -------------------------------------------------------------------

    def pick(self, avoid: Target | None = None) -> Target:
        """The next target in round-robin order, skipping ejected ones while any is up."""
        targets = self.targets
        n = len(targets)
        if n == 1:
            return targets[0]
        now = self._monotonic()
        for _ in range(n):
            target = targets[self._next % n]
            self._next += 1
            if target.ejected_until <= now and target is not avoid:
                return target
        target = targets[self._next % n]  # all ejected: spread anyway
        self._next += 1
        return target

    @property
    def turn(self) -> int:
        """Whose turn it is (round robin); set it back to undo a pick."""
        return self._next

    @turn.setter
    def turn(self, value: int) -> None:
        self._next = value

    def pick_ready(self) -> tuple[Target, Any, int] | None:
        """The next target with an idle connection taken, and the turn before the
        pick (:attr:`turn`, to undo it); None (nothing taken, the turn not used) when
        that target has none idle."""
        turn = self._next
        targets = self.targets
        target = targets[0] if len(targets) == 1 else self.pick()  # pick(), its one-target case
        conn = self.client.take_idle(target.base)
        if conn is None:
            self._next = turn
            self.client.prepare(target.base)  # one idle next time
            return None
        return target, conn, turn

    def report(self, target: Target, failed: bool) -> None:
        """Count a target's consecutive failures; eject it for a while at the threshold."""
        if not failed:
            target.failures = 0
            return
        target.failures += 1
        if target.failures >= self.settings.eject.failures and len(self.targets) > 1:
            target.ejected_until = self._monotonic() + self.settings.eject.duration
            target.failures = 0

    # -- the connection pool -----------------------------------------------------------

    def session(self) -> aiohttp.ClientSession:
        """The WebSocket leg's aiohttp session (created on first use, on the running loop)."""
        session = self._session
        if session is None or session.closed:
            import aiohttp

            t = self.settings.timeout
            limit = self.settings.bulkhead.limit if self.settings.bulkhead else 100
            connector = aiohttp.TCPConnector(
                limit=limit,
                limit_per_host=0,
                ttl_dns_cache=300,
                enable_cleanup_closed=True,
                ssl=self.tls if self.tls is not None else True,
            )
            session = self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=t.total, connect=t.connect, sock_connect=t.connect, sock_read=t.read
                ),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return session

    async def close(self) -> None:
        """Close the connection pools."""
        await self.client.close()
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    # -- reporting -----------------------------------------------------------------

    async def breaker_state(self) -> str:
        """``closed``, ``open`` or ``half_open`` (``closed`` without a breaker)."""
        if self.breaker is None:
            return "closed"
        return str(await self.breaker.astate())

    async def open_remaining(self) -> float:
        """Seconds until the breaker half-opens (0 when it is not open)."""
        if self.breaker is None:
            return 0.0
        return float(await self.breaker.aopen_remaining())
