"""MemoryStore.hit_many (the limiters' group hot path) decides exactly like decide()."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import stormguard as sg
from stormguard import AsyncRateLimiter, Concurrency, RateLimiter, TokenBucket
from stormguard.core._limiters import LimitRequest
from stormguard.stores import MemoryStore
from stormguard.testing import FakeClock

ALGORITHMS = [
    TokenBucket(2, 3),
    sg.GCRA(1, 2),
    sg.SlidingWindowCounter(3, 1.0),
    sg.SlidingWindowLog(2, 1.0),
    sg.FixedWindow(3, 2.0),
]

traces = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),  # client key
        st.floats(min_value=0, max_value=1.5, allow_nan=False),  # time advance
        st.sampled_from([1.0, 0.0, 2.0]),  # cost
    ),
    min_size=1,
    max_size=40,
)
pairs = st.tuples(st.sampled_from(ALGORITHMS), st.sampled_from(ALGORITHMS))


@settings(max_examples=200, deadline=None)
@given(pairs, traces)
def test_hit_many_equals_decide(pair: tuple, trace: list) -> None:
    """Random traffic on a per-client + global pair: same decisions and states both ways."""
    fast_clock, slow_clock = FakeClock(), FakeClock()
    fast, slow = MemoryStore(clock=fast_clock), MemoryStore(clock=slow_clock)
    client, everyone = pair
    for key, dt, cost in trace:
        fast_clock.advance(dt)
        slow_clock.advance(dt)
        limits = [(client, "client", key), (everyone, "global", "all")]
        requests = [LimitRequest(a, k, n, cost) for a, n, k in limits]
        assert fast.hit_many(limits, cost) == slow.decide(requests)
        peek = [LimitRequest(a, k, n, 0.0) for a, n, k in limits]
        assert fast.decide(peek) == slow.decide(peek)


def test_refused_group_takes_nothing() -> None:
    """A refusal by one limit leaves the other's quota untouched (all or nothing)."""
    store = MemoryStore(clock=FakeClock())
    limits = [(TokenBucket(1, 5), "client", "a"), (TokenBucket(1, 1), "global", "all")]
    assert all(d.allowed for d in store.hit_many(limits, 1.0))
    refused = store.hit_many(limits, 1.0)
    assert [d.allowed for d in refused] == [True, False]
    assert refused[0].remaining == 4  # the client's bucket was not charged twice


def test_concurrency_lease_is_handed_out_only_when_admitted() -> None:
    """A Concurrency limit in a group gets a lease when the group is admitted, none otherwise."""
    store = MemoryStore(clock=FakeClock())
    limits = [(Concurrency(1, 10.0), "slots", "a"), (TokenBucket(1, 1), "global", "all")]
    first = store.hit_many(limits, 1.0)
    assert first[0].lease and first[1].lease is None
    second = store.hit_many(limits, 1.0)
    assert not any(d.lease for d in second)


async def test_limiters_take_the_memory_path_for_groups() -> None:
    """hit_many of sync and async limiters on one MemoryStore is all or nothing."""
    store = MemoryStore(clock=FakeClock())
    client = AsyncRateLimiter(TokenBucket(1, 5), store, name="client")
    everyone = AsyncRateLimiter(TokenBucket(1, 1), store, name="global")
    assert (await AsyncRateLimiter.hit_many([(client, "a"), (everyone, "all")])).allowed
    refused = await AsyncRateLimiter.hit_many([(client, "a"), (everyone, "all")])
    assert not refused.allowed and refused.name == "global"
    sync = [(RateLimiter(TokenBucket(1, 5), store, name="c2"), "a")]
    assert RateLimiter.hit_many(sync).allowed


@settings(max_examples=150, deadline=None)
@given(pairs, traces)
def test_quiet_hit_many_is_none_exactly_when_all_admitted(pair: tuple, trace: list) -> None:
    """quiet=True returns None where the decisions would all be admitted, else the
    same decisions; the stored states stay identical either way."""
    quiet_clock, loud_clock = FakeClock(), FakeClock()
    quiet, loud = MemoryStore(clock=quiet_clock), MemoryStore(clock=loud_clock)
    client, everyone = pair
    for key, dt, cost in trace:
        quiet_clock.advance(dt)
        loud_clock.advance(dt)
        limits = [(client, "client", key), (everyone, "global", "all")]
        answer, decisions = quiet.hit_many(limits, cost, quiet=True), loud.hit_many(limits, cost)
        if all(d.allowed for d in decisions):
            assert answer is None
        else:
            assert answer == decisions
        peek = [LimitRequest(a, k, n, 0.0) for a, n, k in limits]
        assert quiet.decide(peek) == loud.decide(peek)


def test_quiet_hit_many_still_hands_out_a_lease() -> None:
    """An admitted group holding a Concurrency lease returns its decisions (the lease)."""
    store = MemoryStore(clock=FakeClock())
    limits = [(Concurrency(2, 10.0), "slots", "a"), (TokenBucket(1, 5), "global", "all")]
    answer = store.hit_many(limits, 1.0, quiet=True)
    assert answer is not None and answer[0].lease


@settings(max_examples=150, deadline=None)
@given(pairs, traces)
def test_group_hitter_answers_and_stores_like_quiet_hit_many(pair: tuple, trace: list) -> None:
    """A group hitter built once per key set answers None exactly where quiet hit_many
    does, else hands the hit to ``otherwise``; the stored table stays identical."""
    group_clock, plain_clock = FakeClock(), FakeClock()
    group, plain = MemoryStore(clock=group_clock), MemoryStore(clock=plain_clock)
    client, everyone = pair
    hitters: dict[tuple[str, float], object] = {}
    for key, dt, cost in trace:
        group_clock.advance(dt)
        plain_clock.advance(dt)
        limits = [(client, "client", key), (everyone, "global", "all")]
        hit = hitters.get((key, cost))
        if hit is None:

            def otherwise(limits: list = limits, cost: float = cost) -> object:
                return group.hit_many(limits, cost, quiet=True)

            hit = hitters[key, cost] = group.group_hitter(limits, cost, otherwise)
        expected = plain.hit_many(limits, cost, quiet=True)
        answer = hit()  # type: ignore[operator]
        assert answer == expected
        assert list(group._data.items()) == list(plain._data.items())


def test_group_hitter_leaves_leases_and_peeks_to_otherwise() -> None:
    """With a Concurrency limit or a cost of 0 the group hitter is ``otherwise`` itself."""
    store = MemoryStore(clock=FakeClock())
    leased = [(Concurrency(2, 10.0), "slots", "a"), (TokenBucket(1, 5), "global", "all")]
    plain = [(TokenBucket(1, 5), "client", "a")]

    def otherwise() -> str:
        return "decided the long way"

    assert store.group_hitter(leased, 1.0, otherwise) is otherwise
    assert store.group_hitter(plain, 0.0, otherwise) is otherwise
    assert store.group_hitter(plain, 1.0, otherwise)() is None


def test_group_hitter_refusal_takes_nothing() -> None:
    """A refusal goes to ``otherwise`` with every quota as it was (all or nothing)."""
    store = MemoryStore(clock=FakeClock())
    limits = [(TokenBucket(1, 5), "client", "a"), (TokenBucket(1, 1), "global", "all")]
    hit = store.group_hitter(limits, 1.0, lambda: store.hit_many(limits, 1.0))
    assert hit() is None
    refused = hit()
    assert refused is not None and [d.allowed for d in refused] == [True, False]
    assert refused[0].remaining == 4  # the client's bucket was not charged by the refusal


@pytest.mark.parametrize("count", [1, 3])
def test_group_hitter_of_one_or_three_limits_stores_like_quiet_hit_many(count: int) -> None:
    """The group hitter's general loop (not the written-out pair) answers and stores
    like quiet hit_many, through admissions and a refusal."""
    group_clock, plain_clock = FakeClock(), FakeClock()
    group, plain = MemoryStore(clock=group_clock), MemoryStore(clock=plain_clock)
    limits = [
        (TokenBucket(2, 3), "client", "a"),
        (sg.SlidingWindowCounter(4, 1.0), "global", "all"),
        (sg.GCRA(1, 5), "route", "r"),
    ][:count]
    hit = group.group_hitter(limits, 1.0, lambda: group.hit_many(limits, 1.0, quiet=True))
    for dt in [0.0, 0.1, 0.1, 0.1, 0.1, 0.5, 0.0, 2.0]:
        group_clock.advance(dt)
        plain_clock.advance(dt)
        assert hit() == plain.hit_many(limits, 1.0, quiet=True)
        assert list(group._data.items()) == list(plain._data.items())


def test_group_hitter_keeps_the_key_bound_when_a_write_evicts_the_other_key() -> None:
    """A full table: the first limit's new key evicts the second's, which is then
    written as a new key (within max_keys), exactly as hit_many writes it."""
    group, plain = (
        MemoryStore(clock=FakeClock(), max_keys=2),
        MemoryStore(clock=FakeClock(), max_keys=2),
    )
    bucket = TokenBucket(1, 5)
    for store in (group, plain):
        store.hit_many([(bucket, "global", "all")], 1.0, quiet=True)  # the oldest key
        store.hit_many([(bucket, "client", "x")], 1.0, quiet=True)
    limits = [(bucket, "client", "y"), (bucket, "global", "all")]
    assert group.group_hitter(limits, 1.0, lambda: "refused")() is None
    assert plain.hit_many(limits, 1.0, quiet=True) is None
    assert len(group._data) == 2
    assert list(group._data.items()) == list(plain._data.items())


def _keyed(template: list, per_hit: tuple[int, ...], key: str) -> list:
    # the limits a keyed hit of `key` decides
    return [(a, n, k + key if i in per_hit else k) for i, (a, n, k) in enumerate(template)]


@settings(max_examples=300, deadline=None)
@given(pairs, traces, st.sampled_from([(0,), (1,), (0, 1), ()]))
@example(
    (TokenBucket(2, 3), TokenBucket(2, 3)), [("a", 0, 1.0), ("b", 0, 1.0), ("a", 0, 1.0)], (0,)
)
def test_keyed_hitter_answers_and_stores_like_quiet_hit_many(
    pair: tuple, trace: list, per_hit: tuple[int, ...]
) -> None:
    """A keyed hitter, built once for every key, answers None exactly where quiet
    hit_many of the same keys does, else hands the key to ``otherwise``; the stored
    table stays identical, entry for entry and in order (the pair of a per-hit and
    a fixed key has its own hit)."""
    keyed_clock, plain_clock = FakeClock(), FakeClock()
    keyed, plain = MemoryStore(clock=keyed_clock), MemoryStore(clock=plain_clock)
    client, everyone = pair
    template = [(client, "client", "c:"), (everyone, "global", "all")]
    hitters: dict[float, Any] = {}
    for key, dt, cost in trace:
        keyed_clock.advance(dt)
        plain_clock.advance(dt)
        limits = _keyed(template, per_hit, key)
        hit = hitters.get(cost)
        if hit is None:

            def otherwise(key: str, cost: float = cost) -> object:
                keys = [
                    (a, n, k + key if i in per_hit else k) for i, (a, n, k) in enumerate(template)
                ]
                return keyed.hit_many(keys, cost, quiet=True)

            hit = hitters[cost] = keyed.keyed_hitter(template, cost, otherwise, per_hit)
        assert hit(key) == plain.hit_many(limits, cost, quiet=True)
        assert list(keyed._data.items()) == list(plain._data.items())


def test_keyed_hitter_of_a_new_key_writes_it_through_the_store() -> None:
    """A key never seen is stored as the store stores a new key (its bound holds)."""
    store = MemoryStore(clock=FakeClock(), max_keys=3)
    template = [(TokenBucket(1, 5), "client", "c:"), (TokenBucket(100, 100), "global", "all")]
    hit = store.keyed_hitter(template, 1.0, lambda key: "refused", (0,))
    assert [hit(f"k{n}") for n in range(5)] == [None] * 5
    assert len(store._data) == 3 and store.evictions == 3
    assert "client\x00c:k4" in store._data and "global\x00all" in store._data


def test_keyed_hitter_leaves_leases_and_peeks_to_otherwise() -> None:
    """With a Concurrency limit or a cost of 0 the keyed hitter is ``otherwise``."""
    store = MemoryStore(clock=FakeClock())
    leased = [(Concurrency(2, 10.0), "slots", "c:"), (TokenBucket(1, 5), "global", "all")]

    def otherwise(key: str) -> str:
        return "decided the long way for " + key

    assert store.keyed_hitter(leased, 1.0, otherwise, (0,)) is otherwise
    assert store.keyed_hitter(leased[1:], 0.0, otherwise, ()) is otherwise
