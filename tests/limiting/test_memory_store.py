"""MemoryStore: bounded, clock-injected, safe under threads and asyncio."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stormguard import (
    AsyncRateLimiter,
    Concurrency,
    ConfigError,
    FixedWindow,
    RateLimiter,
    SlidingWindowLog,
    TokenBucket,
)
from stormguard.stores import MemoryStore, from_url
from stormguard.testing import FakeClock


def test_a_flood_of_keys_is_capped(clock: FakeClock) -> None:
    """However many distinct keys arrive, at most max_keys are kept (LRU eviction)."""
    store = MemoryStore(max_keys=100, clock=clock)
    limiter = RateLimiter(FixedWindow(5, 60), store)
    for i in range(10_000):
        limiter.hit(f"client-{i}")
    assert len(store) == 100


@pytest.mark.parametrize("algorithm", [FixedWindow(5, 60), TokenBucket(0.1, 5)])
def test_evictions_count_only_keys_whose_limit_was_not_full_again(
    clock: FakeClock, algorithm: object
) -> None:
    """A full store forgetting live keys counts each; keys past their reset are
    dropped without counting (forgetting them changes no decision)."""
    store = MemoryStore(max_keys=10, clock=clock)
    limiter = RateLimiter(algorithm, store)  # type: ignore[arg-type]
    for i in range(25):
        limiter.hit(f"live-{i}")
    assert len(store) == 10 and store.evictions == 15
    clock.advance(1000)  # every key is back to full
    for i in range(25):
        limiter.hit(f"later-{i}")
    assert store.evictions == 15 + 15  # 15 live new keys; the ten expired ones uncounted


def test_distinct_keys_that_expire_do_not_fill_the_store(clock: FakeClock) -> None:
    """Keys expiring as fast as new ones arrive are swept faster than they come: the
    table holds about the live keys, not the bound."""
    store = MemoryStore(max_keys=10_000, clock=clock)
    limiter = RateLimiter(TokenBucket(10, 10), store)  # one hit is refilled in 0.1 s
    for i in range(5_000):
        limiter.hit(f"client-{i}")
        clock.advance(0.01)  # ten keys live at a time
    assert len(store) < 100
    assert store.evictions == 0


def test_lru_keeps_the_recently_used_keys(clock: FakeClock) -> None:
    """The least recently used key is the one evicted."""
    store = MemoryStore(max_keys=2, clock=clock)
    limiter = RateLimiter(FixedWindow(1, 60), store)
    limiter.hit("a")
    limiter.hit("b")
    limiter.hit("a", 0)  # a peek writes nothing: "a" stays the oldest write
    limiter.hit("c")
    assert limiter.hit("b", 0).remaining == 0  # kept
    assert limiter.hit("a", 0).remaining == 1  # evicted: fresh again


def test_expired_keys_are_dropped(clock: FakeClock) -> None:
    """Keys past their reset are treated as fresh and swept out as writes go on."""
    store = MemoryStore(clock=clock)
    limiter = RateLimiter(SlidingWindowLog(1, 10), store)
    for i in range(40):
        limiter.hit(f"old-{i}")
    assert not limiter.hit("old-0").allowed
    clock.advance(10)
    assert limiter.hit("old-0").allowed
    for i in range(80):
        limiter.hit(f"new-{i}")
    assert len(store) <= 81


def test_the_injected_clock_drives_refill(clock: FakeClock) -> None:
    """Refill follows the store's clock, not real time."""
    limiter = RateLimiter(TokenBucket(rate=1, burst=1), clock=clock)
    assert limiter.hit("k").allowed
    assert not limiter.hit("k").allowed
    clock.advance(1)
    assert limiter.hit("k").allowed


def test_threads_never_over_admit() -> None:
    """Eight threads hammering one key get exactly the quota between them."""
    limiter = RateLimiter(FixedWindow(1000, 1_000_000))
    allowed = [0] * 8

    def worker(i: int) -> None:
        for _ in range(400):
            if limiter.hit("hot").allowed:
                allowed[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(allowed) == 1000


async def test_tasks_never_over_admit() -> None:
    """Many asyncio tasks on one key get exactly the quota between them."""
    limiter = AsyncRateLimiter(TokenBucket(rate=0.001, burst=50))
    results = await asyncio.gather(*(limiter.hit("hot") for _ in range(200)))
    assert sum(d.allowed for d in results) == 50


async def test_async_lease_is_released_on_exit() -> None:
    """`async with limiter.lease(key)` holds a slot for the block only."""
    limiter = AsyncRateLimiter(Concurrency(1, 60))
    async with limiter.lease("k") as decision:
        assert decision.allowed
        assert not (await limiter.hit("k")).allowed
    async with limiter.lease("k"):
        pass


def test_lease_raises_rate_limited_when_full() -> None:
    """`with limiter.lease(key)` raises RateLimited carrying retry_after when full."""
    from stormguard import RateLimited

    limiter = RateLimiter(Concurrency(1, 60))
    with limiter.lease("k"):
        with pytest.raises(RateLimited) as info, limiter.lease("k"):
            pass  # pragma: no cover
        assert info.value.retry_after == pytest.approx(60, abs=1)
    with limiter.lease("k"):
        pass


def test_from_url_memory() -> None:
    """from_url("memory://") gives a MemoryStore; unknown schemes are config errors."""
    assert isinstance(from_url("memory://", max_keys=7), MemoryStore)
    with pytest.raises(ConfigError, match="url"):
        from_url("mongodb://x")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_max_keys_is_validated(bad: object) -> None:
    """max_keys must be a positive integer."""
    with pytest.raises(ConfigError, match="max_keys"):
        MemoryStore(max_keys=bad)  # type: ignore[arg-type]


def test_limiter_options_are_validated() -> None:
    """on_store_error, instances and retry_store_after are checked at construction."""
    with pytest.raises(ConfigError, match="on_store_error"):
        RateLimiter(FixedWindow(1, 1), on_store_error="maybe")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="instances"):
        RateLimiter(FixedWindow(1, 1), instances=0)
    with pytest.raises(ConfigError, match="retry_store_after"):
        RateLimiter(FixedWindow(1, 1), retry_store_after=0)


def test_group_needs_one_store() -> None:
    """hit_many refuses limiters on different stores (it could not be atomic)."""
    a, b = RateLimiter(FixedWindow(1, 1)), RateLimiter(FixedWindow(1, 1))
    with pytest.raises(ConfigError, match="one store"):
        RateLimiter.hit_many([(a, "k"), (b, "k")])


def test_group_refuses_the_same_state_twice() -> None:
    """hit_many refuses one (limiter name, key) twice: it could not be all or nothing."""
    a = RateLimiter(FixedWindow(1, 1))
    with pytest.raises(ConfigError, match="twice"):
        RateLimiter.hit_many([(a, "k"), (a, "k")])
