# The runtime circuit breaker: BreakerCore (core/_breaker.py) behind a lock, or
# the same rules in Redis (stores/lua/breaker_*.lua) shared by every process.
#
# Locking: one threading.Lock guards the core and is held only for its O(1)
# bookkeeping (try_acquire, record), never across the protected call, never
# across an await, never re-entered (no read lock upgraded to a write lock).
# asyncio tasks use the same lock: it is never held across a suspension point, so
# it cannot block a loop for longer than the bookkeeping itself.
#
# Every form (call, acall, decorator, `with`, `async with`, acquire) asks for a
# permit first and raises CircuitOpen when refused; the permit measures the
# call's duration on the injected clock and reports the outcome exactly once.
# A call cancelled or interrupted (BaseException that is not an Exception) gives
# its permit back without an outcome, so a cancelled probe cannot wedge half-open.
#
# Shared state: with `store=RedisStore(url)` (or AsyncRedisStore for async-only
# use) and a `name`, admission and outcomes run as Lua scripts on Redis' clock.
# If the store fails, the breaker decides with its local core, logs it, tells the
# listeners (kind "store_unavailable"), and goes back to Redis when it answers
# again ("store_available"). The script encoding is in _breaker_store.py, the
# Permit and BreakerEvent in _permit.py; the rest stays here as one machine.
from __future__ import annotations

import inspect
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from types import CoroutineType
from typing import Any, ParamSpec, TypeVar

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import CircuitOpen, ConfigError
from .._scope import AsyncScope, Decorator, Scope
from ..core._breaker import Admission, BreakerConfig, BreakerCore, BreakerState, WindowKind
from ..stores._fallback import OutageStats, ScriptStore, StoreHealth, logger
from ..stores._memory import MemoryStore
from ._breaker_store import BreakerStore, CachedAdmission, RemoteAdmission
from ._memory_cells import memory_cell
from ._permit import AReport, BreakerEvent, EventKind, Listener, Outcome, Permit, Report
from ._tally import credits, drained

__all__ = ["CircuitBreaker"]

P = ParamSpec("P")
T = TypeVar("T")


def default_is_failure(exc: BaseException) -> bool:
    """Every Exception counts as a failure."""
    return isinstance(exc, Exception)


_RNG = random.Random()
_CM_PERMITS: ContextVar[tuple[tuple[CircuitBreaker, Permit], ...]] = ContextVar(
    "stormguard_breaker_permits", default=()
)


class CircuitBreaker(Scope, AsyncScope, Decorator):
    """Closed / open / half-open circuit breaker, thread- and asyncio-safe.

    Opens when, within the last ``window`` seconds (or calls, with
    ``window_kind="count"``), at least ``min_calls`` calls completed and the share of
    failures is ``>= failure_rate``. A call slower than ``slow_call`` seconds counts
    as a failure. Stays open ``open_for * 2**k`` seconds after the k-th consecutive
    re-open, capped at ``open_for_max`` and shortened by up to ``jitter`` (a share);
    then half-opens and admits at most ``half_open_probes`` probes (each holding a
    lease of ``probe_lease`` seconds); all succeeding closes it, one failing
    re-opens it. ``is_failure(exc)`` decides which exceptions count (default: every
    ``Exception``).

    Forms: ``call(fn, ...)``, ``await acall(fn, ...)``, ``@breaker`` on sync and
    async functions, ``with breaker:`` and ``async with breaker:``, and the
    low-level ``acquire() -> Permit`` / ``permit.record(failure=...)``. Each checks
    the state first and raises :class:`CircuitOpen` (with ``remaining`` seconds)
    when refused. The protected call never runs under a lock.

    With ``store=RedisStore(url)`` and a ``name``, every process using that name
    shares one breaker (Redis server time, one Lua script per transition); while
    the store is unreachable the breaker decides locally, logs it and tells the
    ``listeners``, and rejoins when the store answers (``stats`` counts it). A
    shared breaker keeps a near cache of the shared state: for ``staleness``
    seconds (default 0.1) after reading it, a closed breaker admits calls and
    counts their successes without a round trip (sent as one batch; a failure is
    sent at once) and an open one refuses locally; half-open probes are always
    handed out by the store, so ``half_open_probes`` holds across the fleet.
    Another process sees a trip at most ``staleness`` seconds late;
    ``staleness=0`` asks the store on every call. With
    ``store=MemoryStore()`` the breakers of one name on that store share one state
    in this process.
    """

    __slots__ = (
        "__weakref__",
        "_clock",
        "_config",
        "_core",
        "_health",
        "_is_failure",
        "_last_gen",
        "_last_state",
        "_listeners",
        "_lock",
        "_monotonic",
        "_pending",
        "_reports",
        "_rng",
        "_slow",
        "_store",
        "name",
    )

    def __init__(
        self,
        *,
        failure_rate: float = 0.5,
        min_calls: int = 10,
        window: float = 30.0,
        open_for: float = 5.0,
        open_for_max: float = 300.0,
        half_open_probes: int = 1,
        slow_call: float | None = None,
        is_failure: Callable[[BaseException], bool] = default_is_failure,
        store: Any = None,
        name: str | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        listeners: Sequence[Listener] = (),
        window_kind: WindowKind = "time",
        buckets: int = 10,
        probe_lease: float = 30.0,
        jitter: float = 0.1,
        store_retry: float = 1.0,
        staleness: float = 0.1,
    ) -> None:
        config = BreakerConfig(
            failure_rate=failure_rate,
            min_calls=min_calls,
            window=window,
            window_kind=window_kind,
            buckets=buckets,
            open_for=open_for,
            open_for_max=open_for_max,
            half_open_probes=half_open_probes,
            probe_lease=probe_lease,
            slow_call=slow_call,
            jitter=jitter,
        )
        if (
            isinstance(staleness, bool)
            or not isinstance(staleness, int | float)
            or not (0.0 <= staleness < math.inf)
        ):
            raise ConfigError("staleness", f"must be >= 0 seconds, got {staleness!r}")
        if not callable(is_failure):
            raise ConfigError("is_failure", "must be a callable(exception) -> bool")
        self._config = config
        self._core = BreakerCore.from_config(config)
        self._lock = threading.Lock()
        self._pending = credits()  # lock-free successes (protection/_tally.py)
        # What a Permit reports back through (bound once, not per permit).
        self._reports: tuple[Report, AReport] = (self._record, self._arecord)
        self._clock: Clock = clock or SYSTEM_CLOCK
        self._monotonic: Callable[[], float] = (
            time.monotonic if self._clock is SYSTEM_CLOCK else self._clock.monotonic
        )
        self._rng = rng or _RNG
        self._is_failure = is_failure
        self._slow = config.slow_call
        self._listeners = tuple(listeners)
        self.name = name
        self._last_state: BreakerState = "closed"
        self._last_gen = 0
        self._health = StoreHealth(
            f"circuit breaker {name!r}",
            clock=self._clock,
            retry_after=store_retry,
            on_change=self._store_changed,
        )
        self._store: BreakerStore | None = None
        if store is not None:
            if not name:
                raise ConfigError("name", "a breaker shared through a store needs a name")
            if isinstance(store, MemoryStore):
                # Same name, same MemoryStore: one core, as on Redis (first settings win).
                self._core, self._lock, self._pending = memory_cell(
                    store, "breaker", name, lambda: (self._core, self._lock, self._pending)
                )
            else:
                scripts = ScriptStore(store, self._health.label)
                self._store = BreakerStore(scripts, name, config, self._rng, float(staleness))

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self.name or hex(id(self))} {self._last_state}>"

    @property
    def config(self) -> BreakerConfig:
        """The validated settings."""
        return self._config

    # -- admission -------------------------------------------------------------------

    def acquire(self) -> Permit:
        """Ask to run one call; raises :class:`CircuitOpen` when refused."""
        store = self._store
        if store is None:
            admission = self._core.closed_admission
            if admission is not None:
                return Permit(admission, self._monotonic(), self._reports)
            return self._local_acquire()
        now = self._monotonic()
        reply = self._health.call(lambda: store.admit(now), _no_reply)
        return self._local_acquire() if reply is None else self._remote_permit(reply, now)

    async def aacquire(self) -> Permit:
        """Async twin of :meth:`acquire` (awaits the store when it is shared)."""
        store = self._store
        if store is None:
            return self.acquire()
        now = self._monotonic()
        reply = await self._health.acall(lambda: store.aadmit(now), _no_reply)
        return self._local_acquire() if reply is None else self._remote_permit(reply, now)

    def _local_acquire(self) -> Permit:
        now = self._monotonic()
        core, lock = self._core, self._lock
        lock.acquire()
        try:
            self._drain()
            admission = core.try_acquire(now, self._rng)
            changed = core.generation != self._last_gen
        finally:
            lock.release()
        if changed:
            self._note_local_change()
        if not admission.allowed:
            raise CircuitOpen(self.name, admission.remaining)
        return Permit(admission, now, self._reports)

    def _remote_permit(self, reply: RemoteAdmission, now: float) -> Permit:
        if reply.state != self._last_state:
            self._observe_remote(reply.state)
        if not reply.allowed:
            raise CircuitOpen(self.name, reply.remaining)
        admission = Admission(True, reply.probe, reply.generation)
        return Permit(admission, now, self._reports, True, reply.lease_id)

    # -- outcomes --------------------------------------------------------------------

    def _record(self, permit: Permit, outcome: Outcome) -> None:
        now = self._monotonic()
        if permit.remote:
            store = self._store
            assert store is not None
            verdict = self._judged(permit, now, outcome)
            # On a store failure the outcome is lost; the local core decides from now.
            state = self._health.call(lambda: store.report(permit, verdict, now), _no_reply)
            if state is not None:
                self._observe_remote(state)
            return
        admission = permit.admission
        if outcome == "release":
            with self._lock:
                self._drain()
                self._core.release(now, admission)
            return
        self.settle(admission, permit.started, now, outcome == "fail")

    async def _arecord(self, permit: Permit, outcome: Outcome) -> None:
        if not permit.remote:
            self._record(permit, outcome)
            return
        store = self._store
        assert store is not None
        now = self._monotonic()
        verdict = self._judged(permit, now, outcome)
        state = await self._health.acall(lambda: store.areport(permit, verdict, now), _no_reply)
        if state is not None:
            self._observe_remote(state)

    def _judged(self, permit: Permit, now: float, outcome: Outcome) -> Outcome:
        # The store's scripts get the verdict; slow_call is judged here, on our clock.
        slow = self._slow
        if outcome == "ok" and slow is not None and now - permit.started >= slow:
            return "fail"
        return outcome

    # -- the forms -------------------------------------------------------------------

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` if the breaker admits it; raises CircuitOpen."""
        core = self._core
        admission = core.closed_admission if self._store is None else None
        if admission is None:
            return self._call_permit(fn, *args, **kwargs)
        # Fast path, local and closed: admission is one atomic read (no lock).
        started = self._monotonic() if self._slow is not None else 0.0
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            self._outcome(admission, started, self._is_failure(exc))
            raise
        if type(result) is CoroutineType:
            result.close()  # type: ignore[attr-defined]
            raise _coroutine_error(fn)
        self.settle(admission, started, self._monotonic())
        return result

    # -- the lock-free pair: try_enter() / settle() ---------------------------------

    def try_enter(self) -> Admission | None:
        """Admit one call at once, without a lock, when nothing has to be decided.

        It admits while the breaker lives in this process (no ``store``) and is
        closed, and returns the closed admission: the ticket to hand to
        :meth:`settle` when the call ends. It takes nothing -- a closed breaker
        hands out no probe slot -- so a ticket whose call never ends (cancelled)
        needs no giving back. ``None`` when the breaker is shared, open or
        half-open: ask :meth:`acquire` / :meth:`aacquire`; nothing was taken.
        """
        return self._core.closed_admission if self._store is None else None

    def try_enter_cached(self) -> Admission | None:
        """:meth:`try_enter`, and also for a shared breaker while its near cache is
        fresh and says closed (no round trip, no lock).

        A shared ticket settles like a local one: :meth:`settle` counts a success
        for the next batch without a round trip (the batch goes with the next
        reading of the store, at most ``staleness`` seconds later while calls
        come); a failure is sent at once with the batch so far -- from a
        coroutine use :meth:`asettle`, which awaits the store. ``None`` when the
        cache is stale, says open or half-open, or the store is unreachable: ask
        :meth:`acquire` / :meth:`aacquire`; nothing was taken.
        """
        store = self._store
        if store is None:
            return self._core.closed_admission
        if self._health.degraded:
            return None
        return store.ticket(self._monotonic())

    async def asettle(
        self, admission: Admission, started: float, now: float, failure: bool = False
    ) -> None:
        """Async twin of :meth:`settle`: a shared ticket's failure (or slow call)
        awaits the store; everything else is :meth:`settle` (no I/O)."""
        store = self._store
        if store is None or admission.__class__ is not CachedAdmission:
            self.settle(admission, started, now, failure)
            return
        if not self._cached_failure(store, admission, started, now, failure):
            return
        state = await self._health.acall(lambda: store.arefresh(now), _no_reply)
        if state is not None:
            self._observe_remote(state.state)

    def _cached_failure(
        self, store: BreakerStore, admission: Admission, started: float, now: float, failure: bool
    ) -> bool:
        # A shared ticket's outcome joins the batch; True when it must be sent now
        # (a failure or slow call of the ticket's generation: it may trip).
        slow = self._slow
        failure = failure or (slow is not None and now - started >= slow)
        due = store.batched(admission.generation, failure, now)
        return failure and due

    def settle(
        self, admission: Admission, started: float, now: float, failure: bool = False
    ) -> None:
        """Record the outcome of a local ``admission`` (a :meth:`try_enter` ticket, or
        a local permit's) granted at ``started``, ended at ``now`` (both on this
        breaker's clock): ``Permit.record()`` for callers that hold the admission.

        Lock-free while it cannot change the state: a success (faster than
        ``slow_call``) of a closed breaker that is not about to judge its window
        takes one credit of a batch; the lock is taken when the batch is spent,
        for a failure, a slow call or a probe, which may change the state. A
        shared ticket (:meth:`try_enter_cached`) counts a success for the store's
        next batch and sends a failure at once (a round trip: from a coroutine,
        :meth:`asettle`).
        """
        core = self._core
        if (
            not failure
            and now < core.quiet_until
            and admission is core.closed_admission
            and (self._slow is None or now - started < self._slow)
        ):
            # A success that cannot change the state: counted without the lock by
            # taking a credit; the next locked operation counts what was taken.
            try:
                self._pending.pop()
                return
            except IndexError:  # the batch is spent: counted now, with this one
                pass
        store = self._store
        if store is not None and admission.__class__ is CachedAdmission:
            self._settle_cached(store, admission, started, now, failure)
            return
        self._outcome(admission, started, failure, now)

    def _settle_cached(
        self, store: BreakerStore, admission: Admission, started: float, now: float, failure: bool
    ) -> None:
        # settle() of a shared ticket. (Apart, so that settle() itself closes over
        # nothing: a closure's cells would be made on every call of it.)
        if failure:
            store.shared.check_sync()  # before the batch is taken: nothing lost
        if self._cached_failure(store, admission, started, now, failure):
            state = self._health.call(lambda: store.refresh(now), _no_reply)
            if state is not None:
                self._observe_remote(state.state)

    def _drain(self) -> None:
        # Lock held: count the successes queued by the lock-free fast path.
        count = drained(self._pending)
        if count:
            self._core.add_successes(count)

    def _outcome(
        self, admission: Admission, started: float, failure: bool, now: float | None = None
    ) -> None:
        if now is None:
            now = self._monotonic()
        core, lock = self._core, self._lock
        lock.acquire()  # (explicit: half the cost of `with` on CPython 3.11)
        try:
            self._drain()
            core.outcome(now, admission, failure, now - started)
            changed = core.generation != self._last_gen
        finally:
            lock.release()
        if changed:
            self._note_local_change()

    def _call_permit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        permit = self.acquire()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            permit.record(failure=self._is_failure(exc))
            raise
        except BaseException:
            permit.release()
            raise
        if type(result) is CoroutineType:
            # An async function called through the sync form would run unprotected
            # (and be judged a success before it even started): refuse loudly.
            permit.release()
            result.close()  # type: ignore[attr-defined]
            raise _coroutine_error(fn)
        permit.record(failure=False)
        return result

    async def acall(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Await ``fn(*args, **kwargs)`` if the breaker admits it; raises CircuitOpen."""
        permit = await self.aacquire()
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            await permit.arecord(failure=self._is_failure(exc))
            raise
        except BaseException:
            await permit.arelease()
            raise
        await permit.arecord(failure=False)
        return result

    def _is_async(self, fn: Callable[..., Any]) -> bool:
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - an object with async __call__
        ):
            return True
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            raise TypeError("a circuit breaker cannot protect a generator; wrap its consumer")
        return False

    def _enter(self) -> None:
        _CM_PERMITS.set((*_CM_PERMITS.get(), (self, self.acquire())))

    def _exit(self, exc: BaseException | None) -> None:
        permit = self._pop_permit()
        if exc is None:
            permit.record(failure=False)
        elif isinstance(exc, Exception):
            permit.record(failure=self._is_failure(exc))
        else:
            permit.release()

    async def _aenter(self) -> None:
        _CM_PERMITS.set((*_CM_PERMITS.get(), (self, await self.aacquire())))

    async def _aexit(self, exc: BaseException | None) -> None:
        permit = self._pop_permit()
        if exc is None:
            await permit.arecord(failure=False)
        elif isinstance(exc, Exception):
            await permit.arecord(failure=self._is_failure(exc))
        else:
            await permit.arelease()

    def _pop_permit(self) -> Permit:
        stack = _CM_PERMITS.get()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is self:
                _CM_PERMITS.set(stack[:i] + stack[i + 1 :])
                return stack[i][1]
        raise RuntimeError("circuit breaker exited without a matching enter")

    # -- state -----------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """``"closed"``, ``"open"`` or ``"half_open"`` now (from the store if shared)."""
        reply = self._peek()
        return self.local_state() if reply is None else self._observe_remote(reply.state)

    async def astate(self) -> BreakerState:
        """Async twin of :attr:`state`."""
        reply = await self._apeek()
        return self.local_state() if reply is None else self._observe_remote(reply.state)

    def open_remaining(self) -> float:
        """Seconds until an open breaker half-opens (0.0 when closed or half-open).

        A retry loop asks this before sleeping: when the breaker stays open longer
        than the wait, the call ends now ("circuit open") instead of sleeping into
        a refusal.
        """
        if self._store is None and self._core.closed_admission is not None:
            return 0.0  # closed: one atomic read, no lock
        reply = self._peek()
        return self._local_remaining() if reply is None else self._remote_remaining(reply)

    async def aopen_remaining(self) -> float:
        """Async twin of :meth:`open_remaining`."""
        reply = await self._apeek()
        return self._local_remaining() if reply is None else self._remote_remaining(reply)

    def _remote_remaining(self, reply: Any) -> float:
        return reply.remaining if self._observe_remote(reply.state) == "open" else 0.0

    def _peek(self) -> RemoteAdmission | None:
        """The shared state without taking a slot; None when not shared (from sync
        code) or when the store failed (the breaker then decides locally)."""
        store = self._store
        if store is None or store.shared.is_async:
            return None
        now = self._monotonic()
        return self._health.call(lambda: store.peek(now), _no_reply)

    async def _apeek(self) -> RemoteAdmission | None:
        """Async twin of :meth:`_peek` (works with sync and async stores)."""
        store = self._store
        if store is None:
            return None
        now = self._monotonic()
        return await self._health.acall(lambda: store.apeek(now), _no_reply)

    def _locally(self, read: Callable[[float], T]) -> T:
        # Read this process's own core under the lock; announce a state change after.
        now = self._monotonic()
        with self._lock:
            self._drain()
            value = read(now)
            changed = self._core.generation != self._last_gen
        if changed:
            self._note_local_change()
        return value

    def _local_remaining(self) -> float:
        return self._locally(self._core.remaining)

    @property
    def last_state(self) -> BreakerState:
        """The state as this object last knew it, without asking a store.

        Its own core's state when it is not shared (or its store is down); else
        the state the store last answered.
        """
        if self._store is None or self._health.degraded:
            return self.local_state()
        return self._last_state

    def local_state(self) -> BreakerState:
        """The state of this process's own core (what it decides by when degraded)."""
        return self._locally(self._core.state)

    @property
    def degraded(self) -> bool:
        """True while a shared breaker decides locally because its store failed."""
        return self._store is not None and self._health.degraded

    @property
    def stats(self) -> OutageStats:
        """What this breaker saw of its store's outages."""
        return self._health.stats

    def force_open(self) -> None:
        """Refuse every call until :meth:`reset` (in every process when shared)."""
        self._admin("breaker_force_open", self._core.force_open)

    def reset(self) -> None:
        """Close and forget the window and re-opens (in every process when shared)."""
        self._admin("breaker_reset", self._core.reset)

    async def aforce_open(self) -> None:
        """Async twin of :meth:`force_open`."""
        await self._aadmin("breaker_force_open", self._core.force_open)

    async def areset(self) -> None:
        """Async twin of :meth:`reset`."""
        await self._aadmin("breaker_reset", self._core.reset)

    def _admin(self, script: str, local: Callable[[float], None]) -> None:
        self._admin_local(local)
        store = self._store
        if store is not None and not store.shared.is_async:
            state, _ = self._health.require(lambda: store.admin(script))
            self._observe_remote(state)

    async def _aadmin(self, script: str, local: Callable[[float], None]) -> None:
        self._admin_local(local)
        store = self._store
        if store is not None:
            state, _ = await self._health.arequire(lambda: store.aadmin(script))
            self._observe_remote(state)

    def _admin_local(self, local: Callable[[float], None]) -> None:
        now = self._clock.monotonic()
        with self._lock:
            self._drain()
            local(now)
        self._note_local_change()

    # -- events ----------------------------------------------------------------------

    def _note_local_change(self) -> None:
        with self._lock:
            generation = self._core.generation
            if generation == self._last_gen:
                return
            self._last_gen = generation
            new = self._core._state
            old, self._last_state = self._last_state, new
        if old != new:
            self._emit(BreakerEvent(self.name, "state_change", old, new))

    def _observe_remote(self, state: str) -> BreakerState:
        new: BreakerState = state  # type: ignore[assignment]
        with self._lock:
            old = self._last_state
            self._last_state = new
        if old != new:
            self._emit(BreakerEvent(self.name, "state_change", old, new, "shared"))
        return new

    def _store_changed(self, available: bool, detail: str) -> None:
        state = self._last_state
        kind: EventKind = "store_available" if available else "store_unavailable"
        self._emit(BreakerEvent(self.name, kind, state, state, detail))

    def _emit(self, event: BreakerEvent) -> None:
        if event.kind == "state_change":
            log = logger.warning if event.new_state == "open" else logger.info
            log(
                "circuit breaker %s: %s -> %s",
                self.name or hex(id(self)),
                event.old_state,
                event.new_state,
            )
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("circuit breaker listener %r failed", listener)


def _no_reply() -> None:
    # The local answer of a store call: "no shared reply, decide with the local core".
    return None


def _coroutine_error(fn: Callable[..., Any]) -> TypeError:
    return TypeError(
        f"{fn!r} returned a coroutine: use `await breaker.acall(...)` or decorate the "
        "async function (an async call through the sync form would run unprotected)"
    )
