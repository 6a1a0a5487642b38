# Hand-inlined hot paths of MemoryStore for the two single-state algorithms.
#
# A gateway decides a limit on every request, so MemoryStore.hitter hands a
# RateLimiter(TokenBucket | GCRA) one of these closures as its hit. Each is the
# generic path (MemoryStore._generic_hitter -> algorithm.advance -> Decision) with the algorithm's
# arithmetic written out in place: no method call per hit, no outcome tuple. The
# formulas are copied term for term from `core._limiters` so every float comes
# out bit-identical; tests/limiting/test_memory_fast.py replays random traffic
# through both paths and compares decisions and stored state exactly. Anything
# unusual (zero, oversized, negative or infinite costs) takes the generic path.
#
# The store hands over what a hit touches as a `Table`; nothing here reaches into
# the store object itself.
#
# `group_hitter` is the same idea for several limits decided together (a gateway's
# per-client and global limit, on every request of a connection whose client and
# keys do not change): MemoryStore.hit_many's quiet case -- every limit admits,
# all states written, nothing built -- with the store keys made once and no row
# per limit. The algorithms' own `advance` decides (the same floats by
# construction). Anything else -- a limit that refuses, a lease to take
# (Concurrency), a cost that takes nothing -- goes to the caller's `otherwise`,
# which decides the hit from the start: the quick pass has written nothing.
# `keyed_hitter` is the one implementation: some limits' keys may be given per hit
# (a new client's), and `group_hitter` is it with none.
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple, TypeVar

from ..core._limiters import EPSILON, GCRA, Algorithm, Concurrency, Decision, TokenBucket

__all__ = ["Table", "group_hitter", "inlined_hitter", "keyed_hitter"]

FastHit = Callable[..., Decision]
T = TypeVar("T")
_new = tuple.__new__


class Table(NamedTuple):
    """The parts of a MemoryStore an inlined hit works on (given by the store)."""

    data: OrderedDict[str, tuple[float, Any]]  # store key -> (expires at, state)
    lock: threading.Lock
    put: Callable[[str, Any, float, float], None]  # (key, state, ttl, now)
    monotonic: Callable[[], float]
    max_keys: int


def inlined_hitter(
    table: Table, algorithm: Algorithm, name: str, slow: Callable[..., Decision]
) -> FastHit | None:
    """``hit(key, cost=1.0)`` for ``algorithm`` on ``table``, or None when none is written."""
    kind = type(algorithm)
    if kind is GCRA:
        return _gcra(table, algorithm, name, slow)  # type: ignore[arg-type]
    if kind is TokenBucket:
        return _token_bucket(table, algorithm, name, slow)  # type: ignore[arg-type]
    return None


def group_hitter(
    table: Table,
    limits: Sequence[tuple[Algorithm, str, str]],
    cost: float,
    otherwise: Callable[[], T],
) -> Callable[[], T | None]:
    """A hit of every ``(algorithm, name, key)`` in ``limits`` with ``cost``, all or
    nothing: None when every limit admitted it (its states are written), else
    ``otherwise()`` (nothing was written; it decides the hit itself)."""
    if not cost > 0 or any(type(algorithm) is Concurrency for algorithm, _, _ in limits):
        return otherwise
    # keyed_hitter with no limit keyed per hit: the same steps, decisions and writes
    # (calling the partial adds no Python frame).
    keyed = keyed_hitter(table, limits, cost, lambda _key: otherwise(), ())
    return partial(keyed, "")


def keyed_hitter(
    table: Table,
    limits: Sequence[tuple[Algorithm, str, str]],
    cost: float,
    otherwise: Callable[[str], T],
    per_hit: Sequence[int],
) -> Callable[[str], T | None]:
    """:func:`group_hitter` for limits of which some are keyed per hit: ``hit(key)``,
    where the key of each limit at an index in ``per_hit`` is its given key (a
    prefix) followed by ``key``, and the others' are as given. The same steps,
    decisions and writes; ``otherwise(key)`` decides what does not simply pass."""
    if not cost > 0 or any(type(algorithm) is Concurrency for algorithm, _, _ in limits):
        return otherwise
    data, lock, put, monotonic = table.data, table.lock, table.put, table.monotonic
    move_to_end = data.move_to_end
    steps = tuple(
        (name + "\x00" + key, index in per_hit, algorithm.advance)
        for index, (algorithm, name, key) in enumerate(limits)
    )
    if len(steps) == 2 and not steps[1][1]:
        return _keyed_pair_hitter(table, steps, cost, otherwise)

    def hit(key: str) -> T | None:
        with lock:
            now = monotonic()
            admitted = []
            for skey, keyed, advance in steps:
                if keyed:
                    skey += key
                entry = data.get(skey)
                state = None if entry is None or entry[0] <= now else entry[1]
                outcome = advance(state, now, cost)
                if not outcome[1]:
                    break
                admitted.append((skey, outcome[0], outcome[3]))
            else:
                for skey, new, reset in admitted:  # (group_hitter's writes)
                    if reset > 0 and skey in data:
                        data[skey] = (now + reset, new)
                        move_to_end(skey)
                    else:
                        put(skey, new, reset, now)
                return None
        return otherwise(key)

    return hit


def _keyed_pair_hitter(
    table: Table,
    steps: tuple[tuple[str, bool, Callable[..., Any]], ...],
    cost: float,
    otherwise: Callable[[str], T],
) -> Callable[[str], T | None]:
    # keyed_hitter's hit for two limits, the second's key fixed (a gateway's
    # per-client and global pair: keyed per hit for a connection whose every
    # request may be another client's, or not, for group_hitter), its loop written
    # out: the same steps, decisions and writes.
    data, lock, put, monotonic = table.data, table.lock, table.put, table.monotonic
    get, move_to_end = data.get, data.move_to_end
    (prefix_a, keyed_a, advance_a), (key_b, _, advance_b) = steps

    def hit(key: str) -> T | None:
        key_a = prefix_a + key if keyed_a else prefix_a
        with lock:
            now = monotonic()
            entry_a = get(key_a)
            a = advance_a(None if entry_a is None or entry_a[0] <= now else entry_a[1], now, cost)
            if a[1]:
                entry_b = get(key_b)
                b = advance_b(
                    None if entry_b is None or entry_b[0] <= now else entry_b[1], now, cost
                )
                if b[1]:
                    reset = a[3]
                    if reset > 0 and entry_a is not None and key_a in data:
                        data[key_a] = (now + reset, a[0])
                        move_to_end(key_a)
                    else:
                        put(key_a, a[0], reset, now)
                    reset = b[3]
                    if reset > 0 and key_b in data:
                        data[key_b] = (now + reset, b[0])
                        move_to_end(key_b)
                    else:
                        put(key_b, b[0], reset, now)
                    return None
        return otherwise(key)

    return hit


class _StoreKeys(dict[str, str]):
    """key -> store key (``prefix + key``): a lookup is cheaper than a concat.

    A hit is a plain dict lookup; a miss builds the key in ``__missing__``. Bounded like the
    store itself: full, it starts over.
    """

    __slots__ = ("cap", "prefix")

    def __init__(self, prefix: str, cap: int) -> None:
        super().__init__()
        self.prefix, self.cap = prefix, cap

    def __missing__(self, key: str) -> str:
        if len(self) >= self.cap:
            self.clear()
        skey = self[key] = self.prefix + key
        return skey


def _gcra(table: Table, algorithm: GCRA, name: str, slow: Callable[..., Decision]) -> FastHit:
    data, lock, put, monotonic = table.data, table.lock, table.put, table.monotonic
    move_to_end = data.move_to_end
    rate, burst = algorithm.rate, algorithm.burst
    tau = burst / rate
    limit, window = algorithm.limit, algorithm.window
    skeys = _StoreKeys(name + "\x00", table.max_keys)

    def hit(key: str, cost: float = 1.0) -> Decision:
        if not 0 < cost <= burst:
            return slow(key, cost)
        skey = skeys[key]
        with lock:
            now = monotonic()
            entry = data.get(skey)
            if entry is None or entry[0] <= now:
                tat = now
            else:
                tat = entry[1]
                if tat < now:
                    tat = now
            new_tat = tat + cost / rate
            allow_at = new_tat - tau
            if allow_at > now + EPSILON:
                remaining = (tau - (tat - now)) * rate
                reset = tat - now
                return _new(
                    Decision,
                    (
                        False,
                        limit,
                        remaining if remaining > 0.0 else 0.0,
                        reset if reset > 0.0 else 0.0,
                        allow_at - now,
                        name,
                        window,
                        None,
                        (),
                    ),
                )
            reset = new_tat - now
            if entry is not None and reset > 0:
                data[skey] = (now + reset, new_tat)
                move_to_end(skey)
            else:
                put(skey, new_tat, reset, now)
        remaining = (tau - (new_tat - now)) * rate
        return _new(
            Decision,
            (
                True,
                limit,
                remaining if remaining > 0.0 else 0.0,
                reset,
                0.0,
                name,
                window,
                None,
                (),
            ),
        )

    return hit


def _token_bucket(
    table: Table, algorithm: TokenBucket, name: str, slow: Callable[..., Decision]
) -> FastHit:
    data, lock, put, monotonic = table.data, table.lock, table.put, table.monotonic
    move_to_end = data.move_to_end
    rate, burst = algorithm.rate, algorithm.burst
    limit, window = algorithm.limit, algorithm.window
    skeys = _StoreKeys(name + "\x00", table.max_keys)

    def hit(key: str, cost: float = 1.0) -> Decision:
        skey = skeys[key]
        if not 0 < cost <= burst:
            return slow(key, cost)
        with lock:
            now = stamp = monotonic()
            entry = data.get(skey)
            if entry is not None and entry[0] > now:  # a live state: refill it
                last = entry[1][1]
                if stamp < last:
                    stamp = last
                tokens = entry[1][0] + (stamp - last) * rate
                if tokens > burst:
                    tokens = burst
            else:
                tokens = burst
            if cost > tokens + EPSILON:
                remaining = tokens if tokens > 0.0 else 0.0
                reset = (burst - tokens) / rate
                return _new(
                    Decision,
                    (
                        False,
                        limit,
                        remaining,
                        reset if reset > 0.0 else 0.0,
                        (cost - tokens) / rate,
                        name,
                        window,
                        None,
                        (),
                    ),
                )
            tokens -= cost
            reset = (burst - tokens) / rate
            if entry is not None and reset > 0:
                data[skey] = (now + reset, (tokens, stamp))
                move_to_end(skey)
            else:
                put(skey, (tokens, stamp), reset, now)
        return _new(
            Decision,
            (True, limit, tokens if tokens > 0.0 else 0.0, reset, 0.0, name, window, None, ()),
        )

    return hit
