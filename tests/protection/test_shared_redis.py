"""Breaker, budget and cooldown through a real Redis: what the contract suite cannot show.

Concurrency across threads and processes, outages of a real server, the async
store. The rules themselves are in test_contract.py (every store). The scripts run
on a fake clock (a test-only `now` argument), so nothing here waits real time.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from protection_support import fake_time_async_redis_store, fake_time_redis_store

from stormguard import CircuitOpen
from stormguard.protection import BreakerEvent, CircuitBreaker, RetryBudget
from stormguard.testing import FakeClock

redis = pytest.importorskip("redis")
from stormguard.stores import RedisStore  # noqa: E402

pytestmark = pytest.mark.redis


class Boom(Exception):
    pass


def boom() -> None:
    raise Boom


@pytest.fixture
def store(redis_url: str, key_prefix: str, clock: FakeClock) -> Iterator[RedisStore]:
    """A RedisStore on the shared server under a unique prefix, on the fake clock."""
    s = fake_time_redis_store(redis_url, key_prefix, clock)
    yield s
    s.close()


def shared_breaker(store: Any, clock: FakeClock | None = None, **kwargs: Any) -> CircuitBreaker:
    settings: dict[str, Any] = {
        "name": "payments-api",
        "store": store,
        "min_calls": 1,
        "open_for": 10.0,
        "jitter": 0.0,
        "clock": clock,
    }
    settings.update(kwargs)
    return CircuitBreaker(**settings)


def test_half_open_50_threads_one_probe_in_redis(store: RedisStore, clock: FakeClock) -> None:
    """50 threads in half-open through Redis: one probe reaches the backend."""
    breaker = shared_breaker(store, clock)
    with pytest.raises(Boom):
        breaker.call(boom)
    clock.advance(10.0)
    reached = refused = 0
    lock = threading.Lock()
    everyone_else_refused = threading.Event()
    start = threading.Barrier(50, timeout=10)

    def backend() -> None:
        nonlocal reached
        with lock:
            reached += 1
        everyone_else_refused.wait(10)  # the probe stays in flight meanwhile
        raise Boom

    def caller() -> None:
        nonlocal refused
        start.wait()
        try:
            breaker.call(backend)
        except Boom:
            pass
        except CircuitOpen:
            with lock:
                refused += 1
                if refused == 49:
                    everyone_else_refused.set()

    threads = [threading.Thread(target=caller) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert (reached, refused) == (1, 49)


def _process_callers(
    url: str, prefix: str, counter: str, now: float, callers: int, barrier: Any, results: Any
) -> None:
    clock = FakeClock(now)
    # Generous timeouts: 400 threads on a shared 2-core host can make Redis answer
    # late, and a timed-out breaker decides locally (the outage mode, tested apart).
    store = fake_time_redis_store(url, prefix, clock, socket_timeout=10, connect_timeout=10)
    breaker = shared_breaker(store, clock, half_open_probes=2)
    client = store.client
    outcome = {"refused": 0, "failed": 0}
    lock = threading.Lock()

    def backend() -> None:
        client.incr(counter)
        raise Boom

    def caller() -> None:
        try:
            breaker.call(backend)
        except CircuitOpen:
            key = "refused"
        except Boom:
            key = "failed"
        with lock:
            outcome[key] += 1

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    barrier.wait(20)
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    results.put(outcome)
    store.close()


@pytest.mark.stress
@pytest.mark.parametrize("callers", [50, 400])  # 400: 8 processes x 50 callers
def test_half_open_callers_in_8_processes(
    store: RedisStore, redis_url: str, key_prefix: str, clock: FakeClock, callers: int
) -> None:
    """8 processes calling together in half-open: at most half_open_probes reach the backend."""
    breaker = shared_breaker(store, clock, half_open_probes=2)
    with pytest.raises(Boom):
        breaker.call(boom)
    counter = key_prefix + "reached"
    ctx = multiprocessing.get_context("spawn")  # no threads inherited (gRPC, stores)
    barrier = ctx.Barrier(8)
    results = ctx.Queue()
    split = [callers // 8 + (1 if i < callers % 8 else 0) for i in range(8)]
    now = clock.monotonic() + 10.0  # every process at the end of the open time
    procs = [
        ctx.Process(
            target=_process_callers,
            args=(redis_url, key_prefix, counter, now, n, barrier, results),
        )
        for n in split
    ]
    for p in procs:
        p.start()
    try:
        outcomes = [results.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
    reached = int(store.client.get(counter) or 0)
    store.client.delete(counter)
    assert 1 <= reached <= 2
    assert sum(o["refused"] for o in outcomes) == callers - reached
    assert sum(o["failed"] for o in outcomes) == reached


def test_outage_decides_locally_then_rejoins(
    owned_redis: Any, key_prefix: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis down: the breaker decides locally, logs and tells listeners; back: it rejoins."""
    events: list[BreakerEvent] = []
    store = RedisStore(owned_redis.url, prefix=key_prefix)
    breaker = shared_breaker(
        store, clock, listeners=[events.append], store_retry=1.0, open_for=60.0
    )
    assert breaker.call(lambda: 1) == 1
    owned_redis.stop()
    clock.advance(1.0)  # the near cache's reading is stale: the next call asks the store
    with caplog.at_level(logging.WARNING, logger="stormguard"):
        assert breaker.call(lambda: 2) == 2  # decided locally
    assert breaker.degraded
    assert "deciding locally" in caplog.text
    assert [e.kind for e in events] == ["store_unavailable"]
    with pytest.raises(Boom):
        breaker.call(boom)  # the local core trips
    with pytest.raises(CircuitOpen):
        breaker.call(lambda: None)
    owned_redis.start()
    clock.advance(1.0)  # due for a retry of the store
    assert breaker.call(lambda: 3) == 3  # Redis never saw the local trip: closed there
    assert not breaker.degraded
    kinds = [e.kind for e in events]
    assert kinds == ["store_unavailable", "state_change", "store_available", "state_change"]
    assert (events[-1].old_state, events[-1].new_state) == ("open", "closed")  # Redis' state
    assert breaker.stats.outages == 1
    store.close()


def test_budget_outage_counts_locally(owned_redis: Any, key_prefix: str, clock: FakeClock) -> None:
    """With Redis down the budget keeps deciding from local counts."""
    store = RedisStore(owned_redis.url, prefix=key_prefix)
    budget = RetryBudget(
        ratio=0.0, min_per_second=1, window=2.0, store=store, name="up", clock=clock
    )
    owned_redis.stop()
    assert [budget.try_retry() for _ in range(3)] == [True, True, False]
    assert budget.degraded
    owned_redis.start()
    clock.advance(1.0)
    assert budget.try_retry()  # Redis again, its own fresh reserve
    assert not budget.degraded
    store.close()


async def test_async_store_forms(redis_url: str, key_prefix: str, clock: FakeClock) -> None:
    """With AsyncRedisStore the async forms share state; the sync form says to use them."""
    store = fake_time_async_redis_store(redis_url, key_prefix, clock)
    breaker = shared_breaker(store, clock)

    async def fail() -> None:
        raise Boom

    with pytest.raises(Boom):
        await breaker.acall(fail)
    assert await breaker.astate() == "open"
    with pytest.raises(CircuitOpen):
        async with breaker:
            pass
    with pytest.raises(TypeError, match="AsyncRedisStore"):
        breaker.acquire()
    clock.advance(10.0)
    reached = refused = 0
    others_refused = asyncio.Event()

    async def probe() -> None:
        nonlocal reached
        reached += 1
        # the probe stays in flight meanwhile; bounded, so a second probe fails the
        # assertions below instead of hanging the test
        await asyncio.wait_for(others_refused.wait(), 10)

    async def attempt() -> None:
        nonlocal refused
        try:
            await breaker.acall(probe)
        except CircuitOpen:
            refused += 1
            if refused == 19:
                others_refused.set()
            raise

    results = await asyncio.gather(*(attempt() for _ in range(20)), return_exceptions=True)
    assert reached == 1
    assert sum(isinstance(r, CircuitOpen) for r in results) == 19
    assert await breaker.astate() == "closed"
    await breaker.aforce_open()
    assert await breaker.astate() == "open"
    await breaker.areset()
    assert await breaker.astate() == "closed"
    await store.aclose()


async def test_sync_store_from_async_code(store: RedisStore, clock: FakeClock) -> None:
    """A sync RedisStore works from the async forms (run in a worker thread)."""
    breaker = shared_breaker(store, clock)

    async def fail() -> None:
        raise Boom

    with pytest.raises(Boom):
        await breaker.acall(fail)
    with pytest.raises(CircuitOpen):
        await breaker.aacquire()


def test_rng_seeded_jitter_is_reproducible(store: RedisStore, clock: FakeClock) -> None:
    """The jitter draw comes from the breaker's RNG, so a seeded run is reproducible."""
    b1 = shared_breaker(store, clock, name="j1", jitter=0.5, rng=random.Random(3))
    b2 = shared_breaker(store, clock, name="j2", jitter=0.5, rng=random.Random(3))
    remaining = []
    for b in (b1, b2):
        with pytest.raises(Boom):
            b.call(boom)
        with pytest.raises(CircuitOpen) as info:
            b.call(lambda: None)
        remaining.append(info.value.remaining)
    assert 5.0 <= remaining[0] <= 10.0
    assert remaining[0] == remaining[1]


async def test_async_retry_awaits_an_async_store(
    redis_url: str, key_prefix: str, clock: FakeClock
) -> None:
    """@retry on a coroutine awaits a breaker and budget shared through AsyncRedisStore."""
    import stormguard

    store = fake_time_async_redis_store(redis_url, key_prefix, clock)
    breaker = shared_breaker(store, clock, min_calls=2, open_for=30.0)
    budget = RetryBudget(
        ratio=0.0, min_per_second=1, window=10.0, store=store, name="api", clock=clock
    )
    calls = 0

    @stormguard.retry(
        on=Boom, attempts=5, breaker=breaker, budget=budget, backoff=stormguard.NoBackoff()
    )
    async def flaky() -> None:
        nonlocal calls
        calls += 1
        raise Boom

    with pytest.raises(stormguard.RetryError) as info:
        await flaky()
    assert info.value.reason == "circuit open"
    assert calls == 2
    assert await breaker.astate() == "open"
    await store.aclose()
