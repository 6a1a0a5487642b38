# Rate limiters: the adapters around core/_limiters.py.
#
# A limiter names a policy (algorithm + name) and asks a store to decide. The
# store does the arithmetic (MemoryStore in-process, RedisStore in one Lua call),
# so the sync and async limiters differ only in `await`; everything else -- the
# request, the outage bookkeeping, the fallback decisions -- is written once below.
#
# Hot path. On a MemoryStore (which cannot fail) a single hit skips all of that:
# the store hands each limiter, at construction, its own `hit(key, cost)` -- the
# store chooses it (an inlined TokenBucket/GCRA or the generic step), so the
# limiter never looks inside the store. On a sync Redis store a single hit is one
# `decide_one` EVALSHA while the store is healthy; everything else goes through
# `hit_many`.
#
# Store outages go through the one outage-aware store call (stores/_fallback.py):
# every limiter owns a StoreHealth, its own outage record, so `stats` counts what
# *this* limiter saw (three limiters sharing a store through two outages each
# count two outages). When a store raises StoreError, each limiter answers by its
# `on_store_error` mode:
#   "open"   -> allow (availability first);
#   "closed" -> deny, retry_after = retry_store_after (protection first);
#   "local"  -> decide in a process-local MemoryStore with the quota divided by
#               `instances`, so a fleet of N gateways keeps about the global limit.
# The first failure of an outage logs one warning on the `stormguard` logger; while
# the store is down, each limiter asks it again at most once per
# `retry_store_after` seconds (other calls go straight to the fallback, so a dead
# Redis costs one bounded timeout per limiter and interval, not one per request);
# the first success logs the recovery. The local fallback store belongs to the
# store, so limiters of one name on one store share their local quota too.
from __future__ import annotations

import logging
import math
import os
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeAlias, TypeVar

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError, RateLimited, StoreError
from ..core._limiters import (
    Algorithm,
    Concurrency,
    Decision,
    LimitRequest,
    check_cost,
    combine,
    default_name,
    outage_decision,
)
from ..stores._fallback import OutageStats, StoreHealth, acall_all, call_all
from ..stores._memory import MemoryStore

__all__ = ["AsyncRateLimiter", "LimiterStats", "OnStoreError", "RateLimiter"]

OnStoreError: TypeAlias = Literal["open", "closed", "local"]
_MODES = ("open", "closed", "local")
_log = logging.getLogger("stormguard")
_new = tuple.__new__


class SyncStore(Protocol):
    """What a sync limiter needs from a store."""

    def decide(self, requests: Sequence[LimitRequest]) -> list[Decision]: ...
    def release(self, request: LimitRequest) -> None: ...
    def renew(self, request: LimitRequest) -> bool: ...


class AsyncStore(Protocol):
    """What an async limiter needs from a store."""

    async def adecide(self, requests: Sequence[LimitRequest]) -> list[Decision]: ...
    async def arelease(self, request: LimitRequest) -> None: ...
    async def arenew(self, request: LimitRequest) -> bool: ...


# What `stats` returns: one limiter's outage counters (outages, store_errors,
# fallback_decisions, degraded).
LimiterStats: TypeAlias = OutageStats

_LOCAL: weakref.WeakKeyDictionary[object, MemoryStore] = weakref.WeakKeyDictionary()


def _local_store(store: object, clock: Clock) -> MemoryStore:
    # The "local" fallback state of one store, shared by every limiter on it.
    local = _LOCAL.get(store)
    if local is None:
        local = _LOCAL.setdefault(store, MemoryStore(clock=clock))
    return local


S = TypeVar("S", "SyncStore", "AsyncStore")


class _LimiterBase(Generic[S]):
    # Everything but the sync/async calls; RateLimiter and AsyncRateLimiter only say
    # which store method they call (`_decides`) and which twin fits the other kind.
    _decides: ClassVar[str]
    _kind: ClassVar[str]
    _twin: ClassVar[str]

    __slots__ = (
        "_decide_one",
        "_health",
        "_leases",
        "_local",
        "_memory_hit",
        "algorithm",
        "clock",
        "instances",
        "name",
        "on_store_error",
        "retry_store_after",
        "store",
    )

    def __init__(
        self,
        algorithm: Algorithm,
        store: S | None = None,
        *,
        name: str | None = None,
        on_store_error: OnStoreError = "open",
        instances: int | None = None,
        clock: Clock | None = None,
        retry_store_after: float = 1.0,
    ) -> None:
        if store is None:
            store = MemoryStore(clock=clock)  # both kinds
        if not callable(getattr(store, self._decides, None)):
            raise ConfigError("store", f"{store!r} is not {self._kind} store (use {self._twin})")
        if on_store_error not in _MODES:
            raise ConfigError("on_store_error", f"must be one of {_MODES}, got {on_store_error!r}")
        if instances is None:
            instances = getattr(store, "instances", 1)
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise ConfigError("instances", f"must be an integer >= 1, got {instances!r}")
        if not 0 < retry_store_after < math.inf:
            raise ConfigError("retry_store_after", f"must be > 0, got {retry_store_after!r}")
        self.algorithm = algorithm
        self.store: S = store  # not None: see above
        self.name = name or default_name(algorithm)
        self.on_store_error: OnStoreError = on_store_error
        self.instances = instances
        self.clock: Clock = clock or SYSTEM_CLOCK
        self.retry_store_after = float(retry_store_after)
        self._health = StoreHealth(
            f"rate limiter {self.name!r} on {store!r} (on_store_error={on_store_error})",
            clock=self.clock,
            retry_after=self.retry_store_after,
        )
        self._local = _local_store(store, self.clock)
        self._leases = isinstance(algorithm, Concurrency)
        # MemoryStore never fails: its hits skip the outage bookkeeping entirely, on
        # the path the store picks for this limiter (see the module notes).
        memory = store if type(store) is MemoryStore else None
        self._memory_hit = memory.hitter(algorithm, self.name) if memory is not None else None
        # A sync store's single-limit hot path (RedisStore.decide_one), if it has one.
        self._decide_one = getattr(store, "decide_one", None) if memory is None else None

    @property
    def store_down(self) -> bool:
        """Whether the store is in an outage (decisions follow ``on_store_error``)."""
        return self._health.degraded

    @property
    def stats(self) -> LimiterStats:
        """This limiter's outage counters: ``outages`` (outages it saw begin),
        ``store_errors`` (its store calls that failed), ``fallback_decisions`` (its
        hits decided by ``on_store_error``) and ``degraded`` (deciding locally now).
        """
        return self._health.stats

    def _request(self, key: str, cost: float, lease: str = "") -> LimitRequest:
        if self._leases and not lease:
            lease = os.urandom(9).hex()
        return LimitRequest(self.algorithm, key, self.name, check_cost(cost), lease)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.algorithm!r}, {self.store!r}, name={self.name!r}, "
            f"on_store_error={self.on_store_error!r})"
        )


def _check(items: Sequence[tuple[_LimiterBase[Any], str]]) -> list[_LimiterBase[Any]]:
    # The limiters of one call, checked: one store, each state at most once.
    if not items:
        raise ConfigError("items", "needs at least one (limiter, key) pair")
    limiters = [limiter for limiter, _ in items]
    store = limiters[0].store
    if any(limiter.store is not store for limiter in limiters):
        raise ConfigError("items", "every limiter of one call must share one store")
    if len(items) > 1 and len({(limiter.name, key) for limiter, key in items}) < len(items):
        # The same state twice could not be decided all or nothing.
        raise ConfigError("items", "the same (limiter name, key) appears twice")
    return limiters


def _group(
    items: Sequence[tuple[_LimiterBase[Any], str]], cost: float
) -> tuple[list[_LimiterBase[Any]], list[LimitRequest]]:
    # The limiters of one call and their requests, checked.
    limiters = _check(items)
    return limiters, [limiter._request(key, cost) for limiter, key in items]


def _in_memory(items: Sequence[tuple[_LimiterBase[Any], str]], cost: float) -> Decision | None:
    # A call on a MemoryStore (which cannot fail): no outage bookkeeping and no
    # LimitRequests -- one limit takes the limiter's own hit, several the store's
    # hit_many. None: not a MemoryStore call.
    if not items or items[0][0]._memory_hit is None:
        return None
    if len(items) == 1:
        limiter, key = items[0]
        return limiter._memory_hit(key, cost)  # type: ignore[misc]
    limiters = _check(items)
    store: Any = limiters[0].store
    limits = [(limiter.algorithm, limiter.name, key) for limiter, key in items]
    return combined(store.hit_many(limits, check_cost(cost)))


def combined(parts: list[Decision]) -> Decision:
    """``core.combine(parts)``, its common case (all allowed, no lease) built directly."""
    for part in parts:
        if not part.allowed or part.lease:
            return combine(parts)
    b = min(parts, key=_remaining)  # the limit with the least remaining binds
    return _new(
        Decision,
        (
            True,
            b.limit,
            b.remaining,
            b.reset_after,
            b.retry_after,
            b.name,
            b.window,
            None,
            tuple(parts),
        ),
    )


def _remaining(decision: Decision) -> float:
    return decision.remaining


def _admitted(decision: Decision) -> Decision:
    # A lease's decision, or RateLimited when it was refused.
    if not decision.allowed:
        raise RateLimited(decision.retry_after)
    return decision


def _fallback(limiters: Sequence[_LimiterBase[Any]], requests: Sequence[LimitRequest]) -> Decision:
    # The decision of a call the store could not answer: each limit by its mode. A
    # "closed" limit denies the whole call, so "local" limits then take nothing.
    modes = [limiter.on_store_error for limiter in limiters]
    decisions: list[Decision | None] = [None] * len(requests)
    local = [i for i, mode in enumerate(modes) if mode == "local"]
    if local and "closed" not in modes:
        scaled = [_scaled(limiters[i], requests[i]) for i in local]
        for i, decision in zip(local, limiters[0]._local.decide(scaled)):
            decisions[i] = decision
    for i, (limiter, request) in enumerate(zip(limiters, requests)):
        if decisions[i] is None:
            closed = limiter.on_store_error == "closed"
            decisions[i] = outage_decision(request, not closed, limiter.retry_store_after)
    return combine([d for d in decisions if d is not None])


def _scaled(limiter: _LimiterBase[Any], request: LimitRequest) -> LimitRequest:
    algorithm = request.algorithm.scaled(1 / limiter.instances)
    return LimitRequest(algorithm, request.key, request.name, request.cost, request.lease)


def _lease_of(lease: str | Decision) -> str:
    token = lease.lease if isinstance(lease, Decision) else lease
    if not token:
        raise ConfigError("lease", "no lease to release (was the hit allowed?)")
    return token


class RateLimiter(_LimiterBase["SyncStore"]):
    """Decide hits against ``algorithm`` with state in ``store`` (default: a MemoryStore).

    ``hit(key, cost=1)`` returns a :class:`Decision`. ``name`` is the policy name in
    headers and keys (default: derived from the algorithm and its parameters).
    ``on_store_error`` is ``"open"``, ``"closed"`` or ``"local"`` (see the module
    notes); ``instances`` is the fleet size that ``"local"`` divides the quota by
    (default: the store's ``instances``, else 1).
    """

    __slots__ = ()
    _decides, _kind, _twin = "decide", "a sync", "AsyncRateLimiter"

    def hit(self, key: str, cost: float = 1.0) -> Decision:
        """Take ``cost`` from ``key``'s quota if it fits; never raises on store errors."""
        memory_hit = self._memory_hit
        if memory_hit is not None:
            return memory_hit(key, cost)
        decide_one = self._decide_one
        if decide_one is None:
            return RateLimiter.hit_many(((self, key),), cost)
        # A sync Redis store's single-limit path: one EVALSHA.
        request = self._request(key, cost)
        decision: Decision = self._health.call(
            lambda: decide_one(self.algorithm, self.name, key, request.cost, request.lease),
            lambda: _fallback((self,), (request,)),
        )
        return decision

    @staticmethod
    def hit_many(items: Sequence[tuple[RateLimiter, str]], cost: float = 1.0) -> Decision:
        """Decide several limits for one request, all or nothing, in one store call.

        ``items`` pairs each limiter (all on one store) with its key, e.g. per
        client, per route and global; each (limiter name, key) at most once. A
        denial by one consumes nothing from the others. The result is allowed only
        if every limit allowed; ``parts`` holds each limit's decision and
        ``headers()`` renders all of them. One round trip on Redis; on a Redis
        Cluster, one per hash slot when the keys differ (per client + global), still
        all or nothing.
        """
        decision = _in_memory(items, cost)
        if decision is not None:
            return decision
        limiters, requests = _group(items, cost)
        store: SyncStore = limiters[0].store
        return call_all(
            [limiter._health for limiter in limiters],
            lambda: combine(store.decide(requests)),
            lambda: _fallback(limiters, requests),
        )

    def release(self, key: str, lease: str | Decision) -> None:
        """Give back a :class:`Concurrency` slot (a no-op if it expired already)."""
        request = self._request(key, 0.0, _lease_of(lease))
        store: SyncStore = self.store
        try:
            store.release(request)
        except StoreError:
            _log.debug("release of %r on %r failed; the lease will expire", key, self.store)
        if self._health.degraded or self.on_store_error == "local":
            self._local.release(request)

    def renew(self, key: str, lease: str | Decision) -> bool:
        """Extend a :class:`Concurrency` lease; ``False`` if it had expired (or store down)."""
        request = self._request(key, 0.0, _lease_of(lease))
        store: SyncStore = self.store
        try:
            return store.renew(request)
        except StoreError:
            return self._local.renew(request)

    @contextmanager
    def lease(self, key: str, cost: float = 1.0) -> Iterator[Decision]:
        """Hold ``cost`` slots for the block; raise :class:`RateLimited` when refused."""
        decision = _admitted(self.hit(key, cost))
        try:
            yield decision
        finally:
            if decision.lease:
                self.release(key, decision)


class AsyncRateLimiter(_LimiterBase["AsyncStore"]):
    """The asyncio twin of :class:`RateLimiter` (``await limiter.hit(key)``)."""

    __slots__ = ()
    _decides, _kind, _twin = "adecide", "an async", "RateLimiter"

    async def hit(self, key: str, cost: float = 1.0) -> Decision:
        """Take ``cost`` from ``key``'s quota if it fits; never raises on store errors."""
        memory_hit = self._memory_hit
        if memory_hit is not None:
            return memory_hit(key, cost)
        return await AsyncRateLimiter.hit_many(((self, key),), cost)

    @staticmethod
    async def hit_many(
        items: Sequence[tuple[AsyncRateLimiter, str]], cost: float = 1.0
    ) -> Decision:
        """Decide several limits for one request, all or nothing, in one store call."""
        decision = _in_memory(items, cost)
        if decision is not None:
            return decision
        limiters, requests = _group(items, cost)
        store: AsyncStore = limiters[0].store

        async def ask() -> Decision:
            return combine(await store.adecide(requests))

        return await acall_all(
            [limiter._health for limiter in limiters], ask, lambda: _fallback(limiters, requests)
        )

    async def release(self, key: str, lease: str | Decision) -> None:
        """Give back a :class:`Concurrency` slot (a no-op if it expired already)."""
        request = self._request(key, 0.0, _lease_of(lease))
        store: AsyncStore = self.store
        try:
            await store.arelease(request)
        except StoreError:
            _log.debug("release of %r on %r failed; the lease will expire", key, self.store)
        if self._health.degraded or self.on_store_error == "local":
            self._local.release(request)

    async def renew(self, key: str, lease: str | Decision) -> bool:
        """Extend a :class:`Concurrency` lease; ``False`` if it had expired (or store down)."""
        request = self._request(key, 0.0, _lease_of(lease))
        store: AsyncStore = self.store
        try:
            return await store.arenew(request)
        except StoreError:
            return self._local.renew(request)

    @asynccontextmanager
    async def lease(self, key: str, cost: float = 1.0) -> AsyncIterator[Decision]:
        """Hold ``cost`` slots for the block; raise :class:`RateLimited` when refused."""
        decision = _admitted(await self.hit(key, cost))
        try:
            yield decision
        finally:
            if decision.lease:
                await self.release(key, decision)
