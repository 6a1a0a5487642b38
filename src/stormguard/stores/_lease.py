# Approximate shared limits: decided in this process from units reserved in Redis.
#
# A limit with `sync: {every: S}` is not asked of Redis on every request. Each
# process holds, per (limit, key), units it reserved from the exact limiter in
# Redis (the same script, a hit that takes up to `want` units: limit.lua's
# `granted`) and admits locally while they last. Reserved units are charged to the
# shared state when they are reserved, so Redis still counts every admission; what
# changes is *when*: a unit may be spent up to S seconds after it was reserved.
#
# Lifecycle of a key's lease in one process:
#   no units          -> the request waits for a reservation of `size` units (its own
#                        cost included); requests for the same key share it;
#   units left        -> taken locally, no I/O; below half of `size` the next
#                        reservation is asked for in the background;
#   refused by Redis  -> refused locally until the refusal's retry_after (as
#                        envoyproxy/ratelimit caches over-limit keys);
#   S seconds old     -> (window algorithms: also at the end of the window the units
#                        were counted in) the unused units are given back to Redis
#                        in the background ("g" mode, one call per sweep) and may no
#                        longer be spent.
# `size` starts at the request's cost (a key seen once costs what exact mode costs),
# doubles each time a lease runs out while valid, halves when most of one expires
# unused, and never exceeds max(cost, limit / (4 * instances)).
#
# The bound (documented in docs/gateway/fleet.md). Every admitted unit was reserved
# in Redis by the exact algorithm at most S seconds before it was spent:
#   fixed_window, sliding_window: units are spent in the window they were counted
#     in, so a window admits at most `limit`, as exact mode does (no over-admission);
#   token_bucket, gcra: over any T seconds the fleet admits at most
#     burst + rate * (T + S): over-admission <= rate * S, and never more than the
#     units held at the start of the interval, instances * lease <= limit / 4.
# The price is under-admission: units one process holds are not available to the
# others until spent or given back (at most instances * lease, for at most S s).
from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..core._limiters import Algorithm, Decision, FixedWindow, SlidingWindowCounter
from . import _lua
from ._pending import Pending

__all__ = ["APPROXIMATE", "LeaseTable"]

log = logging.getLogger("stormguard")
_new = tuple.__new__
# Algorithms whose state is one string (reservations are given back with "g").
APPROXIMATE = frozenset({"token_bucket", "gcra", "fixed_window", "sliding_window_counter"})
_MAX_LEASES = 100_000
_SWEEP = 0.05  # seconds between sweeps of expired reservations, at most


class _Lease:
    # One (limit name, key) in this process. `chunks`: [units, expires, stamp] per
    # reservation still valid, oldest first.
    __slots__ = (
        "algorithm",
        "chunks",
        "every",
        "key",
        "name",
        "refill",
        "refusal",
        "refused_until",
        "remaining",
        "reset_at",
        "size",
        "units",
    )

    def __init__(self, algorithm: Algorithm, name: str, key: str, every: float) -> None:
        self.algorithm, self.name, self.key, self.every = algorithm, name, key, every
        self.chunks: list[list[Any]] = []
        self.units = 0.0
        self.size = 0.0
        self.refill: Pending[None] | None = None
        self.refusal: Decision | None = None
        self.refused_until = 0.0
        self.remaining = 0.0  # what Redis said was left after the last reservation
        self.reset_at = 0.0


class LeaseTable:
    """The reservations of one process on one store (shared by every rule set on it,
    so two routes naming one limit spend one lease)."""

    __slots__ = ("_expiry", "_leases", "_next_sweep", "_tasks", "clock", "instances", "store")

    def __init__(
        self, store: Any, *, instances: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.instances = max(1, instances)
        self.clock = clock
        self._leases: OrderedDict[tuple[str, str], _Lease] = OrderedDict()
        self._expiry: list[tuple[float, int, _Lease, list[Any]]] = []  # heap
        self._next_sweep = 0.0
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._leases)

    def take(
        self,
        algorithm: Algorithm,
        name: str,
        key: str,
        cost: float,
        every: float,
        reserve: bool = True,
    ) -> bool | Decision | Pending[None] | None:
        """Take ``cost`` units of ``name`` for ``key``: True (taken here), a Decision
        (refused: Redis said so, and its retry_after has not passed), a Pending that
        resolves when a reservation is in (take again then), or None when too few
        units are held and ``reserve`` is false (the store is down)."""
        now = self.clock()
        if now >= self._next_sweep:
            self._sweep(now)
        leases = self._leases
        lease = leases.get((name, key))
        if lease is None:
            lease = leases[(name, key)] = _Lease(algorithm, name, key, every)
            if len(leases) > _MAX_LEASES:
                leases.popitem(last=False)  # its chunks are still given back when due
        else:
            leases.move_to_end((name, key))
        if lease.refused_until > now and lease.refusal is not None:
            return _later(lease.refusal, lease.refused_until - now)
        if lease.units >= cost:
            lease.units -= cost
            chunks = lease.chunks
            if chunks and chunks[0][0] > cost + 1e-9:
                chunks[0][0] -= cost  # the oldest chunk holds it (the usual case)
            else:
                self._spend(lease, cost)
            if lease.units < lease.size / 2 and lease.refill is None and reserve:
                self._grow(lease, cost)
                self._reserve(lease, 0.0, lease.size)  # the next one, in the background
            return True
        if not reserve:
            return None
        if lease.refill is None:
            self._grow(lease, cost)
            self._reserve(lease, cost, lease.size)
        assert lease.refill is not None
        return lease.refill

    def give_back(self, name: str, key: str, cost: float) -> None:
        """Return ``cost`` taken by :meth:`take` (another limit refused the request)."""
        lease = self._leases.get((name, key))
        if lease is not None and lease.chunks:
            lease.chunks[-1][0] += cost
            lease.units += cost

    def decision(self, name: str, key: str) -> Decision:
        """An admitted decision for ``name`` of ``key`` as this process sees it: what
        Redis had left at the last reservation plus what is still held here."""
        lease = self._leases[(name, key)]
        algorithm = lease.algorithm
        now = self.clock()
        return _new(
            Decision,
            (
                True,
                algorithm.limit,
                lease.remaining + lease.units,
                max(0.0, lease.reset_at - now),
                0.0,
                name,
                algorithm.window,
                None,
                (),
            ),
        )

    def _grow(self, lease: _Lease, cost: float) -> None:
        # Half a lease spent while valid: the next one is twice as large (capped).
        cap = max(cost, lease.algorithm.limit / (4 * self.instances))
        lease.size = min(cap, max(cost, 2 * lease.size if lease.size else cost))

    def _spend(self, lease: _Lease, cost: float) -> None:
        # `cost` (already taken off lease.units) out of the oldest chunks first
        chunks = lease.chunks
        while cost > 0 and chunks:
            chunk = chunks[0]
            used = min(cost, chunk[0])
            chunk[0] -= used
            cost -= used
            if chunk[0] <= 1e-9:
                chunks.pop(0)

    def _reserve(self, lease: _Lease, cost: float, want: float) -> None:
        # A reservation of up to `want` units (at least `cost`), its reply handled
        # from the store's callbacks.
        pending: Pending[None] = Pending()
        lease.refill = pending
        store = self.store
        encoded = _lua.piece(
            store, lease.algorithm, lease.name, lease.key, cost, repr(max(want, cost))
        )
        group = _lua.Group((lease.algorithm,), (lease.name,), ("",), (want > cost,), False, False)
        item = _lua.item_of([[encoded]], [group], lease.key)
        sent = self.clock()

        def reserved(results: Any, stamp: Any) -> None:
            lease.refill = None
            if results is None:
                pending.set_exception(stamp)
                return
            _, decisions, granted = results[0]
            decision = decisions[0]
            self._filled(lease, decision, granted[0] if granted else cost, stamp, sent)
            pending.set_result(None)

        try:
            store.submit(item, reserved)
        except Exception as exc:  # no running loop, or a closed store
            lease.refill = None
            pending.set_exception(exc)

    def _filled(
        self, lease: _Lease, decision: Decision, granted: float, stamp: bytes, sent: float
    ) -> None:
        now = self.clock()
        lease.remaining = decision.remaining
        lease.reset_at = now + decision.reset_after
        if not decision.allowed:
            lease.refusal = decision
            lease.refused_until = now + decision.retry_after
            return
        lease.refused_until = 0.0
        if granted <= 0:
            return
        # Valid for `every` seconds from when it was asked (which is before Redis
        # took it), and for windows not past the window it was counted in.
        valid = lease.every
        algorithm = lease.algorithm
        if isinstance(algorithm, FixedWindow | SlidingWindowCounter):
            taken = _seconds(stamp)
            window = algorithm.window
            valid = min(valid, window - math.fmod(taken, window))
        expires = sent + valid
        chunk: list[Any] = [granted, expires, stamp]
        lease.chunks.append(chunk)
        lease.units += granted
        heapq.heappush(self._expiry, (expires, id(chunk), lease, chunk))

    def _sweep(self, now: float) -> None:
        # Expired reservations: their unused units leave the lease and go back to
        # Redis in one background call.
        self._next_sweep = now + _SWEEP
        expiry = self._expiry
        given: list[tuple[Algorithm, str, str, float, bytes]] = []
        while expiry and expiry[0][0] <= now:
            _, _, lease, chunk = heapq.heappop(expiry)
            units = chunk[0]
            held = lease.chunks
            for i, other in enumerate(held):
                if other is chunk:
                    del held[i]
                    lease.units = max(0.0, lease.units - units)
                    break
                if units > lease.size / 2:
                    lease.size = max(1.0, lease.size / 2)
            if units > 1e-9:
                given.append((lease.algorithm, lease.name, lease.key, units, chunk[2]))
                chunk[0] = 0.0
        if given:
            self._give(given)

    def _give(self, given: list[tuple[Algorithm, str, str, float, bytes]]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop to send from: the units expire with their keys
        task = loop.create_task(self._send_back(given))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_back(self, given: list[tuple[Algorithm, str, str, float, bytes]]) -> None:
        store = self.store
        cluster = getattr(store, "cluster", False)
        parts = [[one] for one in given] if cluster else [given]  # a script call per slot
        for part in parts:
            keys, args = _lua.encode_give_back(store, part)
            try:
                await store.run_script(_lua.LIMIT_SCRIPT, keys, args)
            except Exception as exc:  # the units then expire with their keys
                log.debug("giving back %d reservations failed: %s", len(part), exc)
                return

    def flush(self) -> None:
        """Give back every reservation now (a closing gateway)."""
        for lease in self._leases.values():
            for chunk in lease.chunks:
                chunk[1] = 0.0
        self._expiry = [(0.0, i, lease, chunk) for i, (*_, lease, chunk) in enumerate(self._expiry)]
        self._sweep(self.clock())


def _seconds(stamp: bytes | str) -> float:
    # A TIME stamp "<seconds>.<microseconds>" (the microseconds not zero-padded).
    raw = stamp.decode() if isinstance(stamp, bytes) else stamp
    seconds, _, micros = raw.partition(".")
    return int(seconds) + int(micros or 0) / 1e6


def _later(refusal: Decision, retry_after: float) -> Decision:
    return refusal._replace(retry_after=retry_after)
