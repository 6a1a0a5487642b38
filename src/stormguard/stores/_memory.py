# In-process store: a dict of per-key states behind one lock.
#
# Bounded memory: at most `max_keys` keys. Each write refreshes the key's LRU
# position and its expiry (the algorithm's reset_after: past it the state equals a
# fresh one, so dropping it changes no decision). Reads treat an expired key as
# fresh, writes also drop expired keys from the cold end (two per write, faster than
# distinct keys arrive, so the table holds the live keys, not the bound), and when
# the store is full the least recently used key is evicted. Evicting a live key
# forgets that client's usage (it starts fresh): the documented cost of the cap,
# counted in `evictions` (a key that was live: its bucket or window not yet back
# to full) so that an operator can see the bound is too small.
#
# The lock is a threading.Lock held only for dict work and the pure step (never
# across I/O or an await), so the same store is safe for threads and for asyncio
# tasks, including async limiters running in several event loops at once.
from __future__ import annotations

import os
import threading
import time as _time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError
from ..core._limiters import (
    Algorithm,
    Concurrency,
    Decision,
    LimitRequest,
    check_cost,
    decide_group,
)
from ._memory_fast import Table, group_hitter, inlined_hitter, keyed_hitter

__all__ = ["MemoryStore"]

_new = tuple.__new__
T = TypeVar("T")


class MemoryStore:
    """Limiter state in this process: thread- and asyncio-safe, bounded, clock-injected.

    ``max_keys`` (default 100 000) caps the number of keys; beyond it the least
    recently used key is evicted (``evictions`` counts those whose limit was not
    yet back to full: their clients start afresh). Expired keys are dropped as
    they are met. A key takes about 400 bytes (``python -m bench store-scale``).
    ``clock`` supplies ``monotonic()`` (default: the system clock).
    """

    __slots__ = (
        "__weakref__",
        "_data",
        "_lock",
        "_monotonic",
        "_writes",
        "clock",
        "evictions",
        "instances",
        "max_keys",
    )

    def __init__(
        self, *, max_keys: int = 100_000, clock: Clock | None = None, instances: int = 1
    ) -> None:
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ConfigError("max_keys", f"must be an integer >= 1, got {max_keys!r}")
        self.max_keys = max_keys
        self.clock: Clock = clock or SYSTEM_CLOCK
        self.instances = instances
        # The system clock's bound method costs a Python call per hit; time.monotonic
        # is the same reading without it.
        self._monotonic = _time.monotonic if self.clock is SYSTEM_CLOCK else self.clock.monotonic
        self._data: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._writes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"MemoryStore(max_keys={self.max_keys}, keys={len(self._data)})"

    def key(self, *parts: str) -> str:
        """The internal key of ``parts`` (``"name\\x00key"``)."""
        return "\x00".join(parts)

    def _get(self, key: str, now: float) -> Any:
        entry = self._data.get(key)
        if entry is None:
            return None
        if entry[0] <= now:
            del self._data[key]
            return None
        return entry[1]

    def _put(self, key: str, state: Any, ttl: float, now: float) -> None:
        data = self._data
        if ttl <= 0:
            data.pop(key, None)
            return
        data[key] = (now + ttl, state)
        data.move_to_end(key)
        self._writes += 1
        if not self._writes & 7:  # every 8th write: drop expired keys at the cold end,
            for _ in range(16):  # two per write: faster than new keys come
                oldest = next(iter(data))
                if data[oldest][0] > now:
                    break
                del data[oldest]
        while len(data) > self.max_keys:  # (a lowered bound: trimmed as keys come)
            if data.popitem(last=False)[1][0] > now:
                self.evictions += 1

    def hitter(
        self, algorithm: Algorithm, name: str, *, inline: bool = True
    ) -> Callable[..., Decision]:
        """``hit(key, cost=1.0)`` of one limiter on this store: its hot path, chosen once.

        TokenBucket and GCRA get a hand-inlined step (stores/_memory_fast.py; the
        same decisions, bit for bit) unless ``inline`` is false; other algorithms,
        and odd costs, take the generic step. Everything that does not change per
        hit is bound once. A negative or non-finite cost raises ConfigError.
        """
        generic = self._generic_hitter(algorithm, name)
        if inline:
            table = Table(self._data, self._lock, self._put, self._monotonic, self.max_keys)
            fast = inlined_hitter(table, algorithm, name, generic)
            if fast is not None:
                return fast
        return generic

    def _generic_hitter(self, algorithm: Algorithm, name: str) -> Callable[..., Decision]:
        data, lock, put = self._data, self._lock, self._put
        monotonic, advance = self._monotonic, algorithm.advance
        limit, window, prefix = algorithm.limit, algorithm.window, name + "\x00"
        leases = isinstance(algorithm, Concurrency)

        def hit(key: str, cost: float = 1.0) -> Decision:
            cost = check_cost(cost)
            lease = os.urandom(9).hex() if leases else ""
            skey = prefix + key
            with lock:
                now = monotonic()
                entry = data.get(skey)
                state = None if entry is None or entry[0] <= now else entry[1]
                new, allowed, remaining, reset, retry = advance(state, now, cost, lease)
                if allowed and cost > 0:
                    if entry is not None and reset > 0:  # _put, inlined for the hot path
                        data[skey] = (now + reset, new)
                        data.move_to_end(skey)
                    else:
                        put(skey, new, reset, now)
            held = (lease or None) if allowed and cost > 0 else None
            # tuple.__new__ skips the NamedTuple's Python-level __new__ (hot path).
            return _new(Decision, (allowed, limit, remaining, reset, retry, name, window, held, ()))

        return hit

    def decide(self, requests: Sequence[LimitRequest]) -> list[Decision]:
        """Decide several limits at once, all or nothing."""
        keys = [self.key(r.name, r.key) for r in requests]
        with self._lock:
            now = self.clock.monotonic()
            states = [self._get(k, now) for k in keys]
            new_states, decisions = decide_group(requests, states, now)
            if new_states is not None:
                for key, state, r, d in zip(keys, new_states, requests, decisions):
                    if r.cost > 0:
                        self._put(key, state, d.reset_after, now)
        return decisions

    @overload
    def hit_many(
        self, limits: Sequence[tuple[Algorithm, str, str]], cost: float
    ) -> list[Decision]: ...
    @overload
    def hit_many(
        self, limits: Sequence[tuple[Algorithm, str, str]], cost: float, *, quiet: bool
    ) -> list[Decision] | None: ...
    def hit_many(
        self, limits: Sequence[tuple[Algorithm, str, str]], cost: float, *, quiet: bool = False
    ) -> list[Decision] | None:
        """:meth:`decide` for limits of one cost, without building LimitRequests.

        ``limits`` pairs each algorithm with its policy name and key. The limiters'
        hot path for several limits of one request (the gateway decides a
        per-client and a global limit on every request): the same decisions and
        stored states as ``decide`` through ``core.decide_group``, all or nothing.
        With ``quiet``, a hit every limit admitted (and no lease taken) returns
        None instead of its decisions: a caller that only needs to know it passed
        builds nothing.
        """
        data, put = self._data, self._put
        rows = []  # (algorithm, name, store key, state, lease, outcome)
        committed = True
        leased = False
        with self._lock:
            now = self._monotonic()
            if quiet:
                # The common quiet hit (no lease, every limit admits: a gateway's new
                # client) without a row per limit; anything else is decided below
                # from the start, with the same `now` (nothing was written).
                admitted = []
                for algorithm, name, key in limits:
                    if type(algorithm) is Concurrency:
                        break
                    skey = name + "\x00" + key
                    entry = data.get(skey)
                    state = None if entry is None or entry[0] <= now else entry[1]
                    outcome = algorithm.advance(state, now, cost, "")
                    if not outcome[1]:
                        break
                    admitted.append((skey, outcome))
                else:
                    if cost > 0:
                        for skey, o in admitted:
                            if skey in data and o[3] > 0:  # as the writes below
                                data[skey] = (now + o[3], o[0])
                                data.move_to_end(skey)
                            else:
                                put(skey, o[0], o[3], now)
                    return None
            for algorithm, name, key in limits:
                skey = name + "\x00" + key
                entry = data.get(skey)
                state = None if entry is None or entry[0] <= now else entry[1]
                if type(algorithm) is Concurrency:
                    lease = os.urandom(9).hex()
                    leased = True
                else:
                    lease = ""
                outcome = algorithm.advance(state, now, cost, lease)
                committed = committed and outcome[1]
                rows.append((algorithm, name, skey, state, lease, outcome))
            if not committed:  # nothing taken: the admitting limits report their quota
                rows = [
                    (a, n, k, s, "", a.advance(s, now, 0.0) if o[1] else o)
                    for a, n, k, s, _, o in rows
                ]
            elif cost > 0:
                for _, _, skey, _, _, o in rows:
                    if skey in data and o[3] > 0:  # a key in the table: _put's common case
                        data[skey] = (now + o[3], o[0])
                        data.move_to_end(skey)
                    else:
                        put(skey, o[0], o[3], now)
            if quiet and committed and not leased:
                return None
        return [
            _new(Decision, (o[1], a.limit, o[2], o[3], o[4], n, a.window, lease or None, ()))
            for a, n, _, _, lease, o in rows
        ]

    def group_hitter(
        self,
        limits: Sequence[tuple[Algorithm, str, str]],
        cost: float,
        otherwise: Callable[[], T],
    ) -> Callable[[], T | None]:
        """:meth:`hit_many` ``(limits, cost, quiet=True)`` for limits hit again and
        again (stores/_memory_fast.py): the returned callable answers None when
        every limit admitted the hit, else ``otherwise()``, which then decides the
        hit from the start (nothing was taken)."""
        table = Table(self._data, self._lock, self._put, self._monotonic, self.max_keys)
        return group_hitter(table, limits, cost, otherwise)

    def keyed_hitter(
        self,
        limits: Sequence[tuple[Algorithm, str, str]],
        cost: float,
        otherwise: Callable[[str], T],
        per_hit: Sequence[int],
    ) -> Callable[[str], T | None]:
        """:meth:`group_hitter` for limits some of which are keyed per hit (a
        per-client and a global limit, for requests of ever other clients):
        ``hit(key)``, the key of each limit at an index in ``per_hit`` being its
        given key followed by ``key``; ``otherwise(key)`` decides what does not
        simply pass (nothing was taken then)."""
        table = Table(self._data, self._lock, self._put, self._monotonic, self.max_keys)
        return keyed_hitter(table, limits, cost, otherwise, per_hit)

    async def adecide(self, requests: Sequence[LimitRequest]) -> list[Decision]:
        """:meth:`decide` for async limiters (never blocks the loop on I/O)."""
        return self.decide(requests)

    def release(self, request: LimitRequest) -> None:
        """Give back a concurrency lease (no-op when it has expired already)."""
        self._lease_op(request, renew=False)

    async def arelease(self, request: LimitRequest) -> None:
        """:meth:`release` for async limiters."""
        self._lease_op(request, renew=False)

    def renew(self, request: LimitRequest) -> bool:
        """Extend a concurrency lease; ``False`` when it had expired already."""
        return self._lease_op(request, renew=True)

    async def arenew(self, request: LimitRequest) -> bool:
        """:meth:`renew` for async limiters."""
        return self._lease_op(request, renew=True)

    def _lease_op(self, request: LimitRequest, *, renew: bool) -> bool:
        algorithm = request.algorithm
        if not isinstance(algorithm, Concurrency):
            return False
        key = self.key(request.name, request.key)
        with self._lock:
            now = self.clock.monotonic()
            state = self._get(key, now)
            if renew:
                state, ttl, found = algorithm.renew(state, request.lease, now)
            else:
                (state, ttl), found = algorithm.release(state, request.lease, now), True
            self._put(key, state, ttl, now)
        return found

    def close(self) -> None:
        """Forget every key."""
        with self._lock:
            self._data.clear()

    async def aclose(self) -> None:
        """:meth:`close` for async callers."""
        self.close()
