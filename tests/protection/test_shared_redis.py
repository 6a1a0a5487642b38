"""Breaker, budget and cooldown shared through a real Redis (never mocked, never flushed)."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from stormguard import CircuitOpen
from stormguard.protection import BreakerEvent, CircuitBreaker, Cooldown, RetryBudget
from stormguard.testing import FakeClock

redis = pytest.importorskip("redis")
from stormguard.stores import AsyncRedisStore, RedisStore  # noqa: E402

pytestmark = pytest.mark.redis


class Boom(Exception):
    pass


# The backend of the half-open tests takes 200 ms, as the scenario states.
SLOW_BACKEND = 0.2


def _wait_on_redis_clock(seconds: float) -> None:
    """Let Redis' own clock move on: shared breakers run on Redis TIME, which no fake
    clock reaches, so open times are kept to a few hundred milliseconds and waited out."""
    time.sleep(seconds)


def boom() -> None:
    raise Boom


@pytest.fixture
def store(redis_url: str, key_prefix: str) -> Iterator[RedisStore]:
    """A RedisStore on the shared server under a unique prefix."""
    with RedisStore(redis_url, prefix=key_prefix) as s:
        yield s


def shared_breaker(store: Any, **kwargs: Any) -> CircuitBreaker:
    settings: dict[str, Any] = {
        "name": "payments-api",
        "store": store,
        "min_calls": 1,
        "open_for": 0.3,
        "jitter": 0.0,
    }
    settings.update(kwargs)
    return CircuitBreaker(**settings)


def test_state_is_shared_between_instances(
    store: RedisStore, redis_url: str, key_prefix: str
) -> None:
    """A trip seen by one breaker object is seen by another one with the same name."""
    first = shared_breaker(store)
    with RedisStore(redis_url, prefix=key_prefix) as other_store:
        second = shared_breaker(other_store)
        assert second.state == "closed"
        with pytest.raises(Boom):
            first.call(boom)
        assert second.state == "open"
        with pytest.raises(CircuitOpen) as info:
            second.call(lambda: None)
        assert 0.0 < info.value.remaining <= 0.3


def test_other_names_are_independent(store: RedisStore) -> None:
    """Breakers with different names do not share state."""
    a = shared_breaker(store, name="a")
    b = shared_breaker(store, name="b")
    with pytest.raises(Boom):
        a.call(boom)
    assert a.state == "open"
    assert b.state == "closed"


def test_rate_window_and_min_calls_in_redis(store: RedisStore) -> None:
    """The Redis window opens at failure_rate once min_calls completed."""
    breaker = shared_breaker(store, min_calls=4, failure_rate=0.5)
    breaker.call(lambda: None)
    breaker.call(lambda: None)
    with pytest.raises(Boom):
        breaker.call(boom)
    assert breaker.state == "closed"
    with pytest.raises(Boom):
        breaker.call(boom)
    assert breaker.state == "open"


def test_count_window_in_redis(store: RedisStore) -> None:
    """A count window in Redis judges only the last `window` outcomes."""
    breaker = shared_breaker(store, window_kind="count", window=4, min_calls=4)
    with pytest.raises(Boom):
        breaker.call(boom)
    for _ in range(4):
        breaker.call(lambda: None)  # pushes the failure out of the last 4
    with pytest.raises(Boom):
        breaker.call(boom)
    assert breaker.state == "closed"
    with pytest.raises(Boom):
        breaker.call(boom)  # 2 of the last 4 (a time window would hold 3 of 7)
    assert breaker.state == "open"


def test_half_open_probe_then_close_in_redis(store: RedisStore) -> None:
    """After open_for (Redis time) one probe runs; its success closes for everyone."""
    breaker = shared_breaker(store, open_for=0.2)
    with pytest.raises(Boom):
        breaker.call(boom)
    _wait_on_redis_clock(0.25)
    probe = breaker.acquire()
    assert probe.probe
    with pytest.raises(CircuitOpen):
        breaker.acquire()
    probe.record(failure=False)
    assert breaker.state == "closed"


def test_late_result_of_older_generation_ignored_in_redis(store: RedisStore) -> None:
    """A call admitted while closed that fails after the trip changes nothing."""
    breaker = shared_breaker(store, open_for=0.2)
    slow = breaker.acquire()
    with pytest.raises(Boom):
        breaker.call(boom)
    _wait_on_redis_clock(0.25)
    probe = breaker.acquire()
    slow.record(failure=True)
    assert breaker.state == "half_open"
    probe.record(failure=False)
    assert breaker.state == "closed"


def test_hung_probe_lease_expires_in_redis(store: RedisStore) -> None:
    """A probe that never reports is counted failed when its lease ends; then a new probe runs."""
    breaker = shared_breaker(store, open_for=0.1, probe_lease=0.2)
    with pytest.raises(Boom):
        breaker.call(boom)
    _wait_on_redis_clock(0.15)
    hung = breaker.acquire()
    assert hung.probe
    _wait_on_redis_clock(0.25)
    assert breaker.state == "open"  # re-opened for 0.2 s (doubled)
    _wait_on_redis_clock(0.25)
    assert breaker.call(lambda: 7) == 7
    hung.record(failure=True)
    assert breaker.state == "closed"


def test_slow_calls_fail_in_redis(store: RedisStore, clock: FakeClock) -> None:
    """slow_call is measured by the permit on the injected clock."""
    breaker = shared_breaker(store, slow_call=1.0, clock=clock)
    breaker.call(clock.advance, 2.0)
    assert breaker.state == "open"


def test_force_open_and_reset_are_shared(
    store: RedisStore, redis_url: str, key_prefix: str
) -> None:
    """force_open() in one process object refuses in another until reset()."""
    first = shared_breaker(store)
    with RedisStore(redis_url, prefix=key_prefix) as other_store:
        second = shared_breaker(other_store)
        first.force_open()
        with pytest.raises(CircuitOpen):
            second.call(lambda: None)
        second.reset()
        assert first.call(lambda: 1) == 1


def test_half_open_50_threads_one_probe_in_redis(store: RedisStore) -> None:
    """50 threads in half-open through Redis: one probe reaches the backend."""
    breaker = shared_breaker(store, open_for=0.1)
    with pytest.raises(Boom):
        breaker.call(boom)
    _wait_on_redis_clock(0.15)
    reached = 0
    lock = threading.Lock()
    start = threading.Barrier(50, timeout=10)

    def backend() -> None:
        nonlocal reached
        with lock:
            reached += 1
        time.sleep(SLOW_BACKEND)
        raise Boom

    def caller() -> None:
        start.wait()
        try:
            breaker.call(backend)
        except (Boom, CircuitOpen):
            pass

    threads = [threading.Thread(target=caller) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert reached == 1


def _process_callers(
    url: str, prefix: str, counter: str, callers: int, barrier: Any, results: Any
) -> None:
    store = RedisStore(url, prefix=prefix)
    breaker = shared_breaker(store, open_for=0.5, half_open_probes=2)
    client = store.client
    outcome = {"refused": 0, "failed": 0}
    lock = threading.Lock()

    def backend() -> None:
        client.incr(counter)
        time.sleep(SLOW_BACKEND)
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


def test_half_open_50_callers_in_8_processes(
    store: RedisStore, redis_url: str, key_prefix: str
) -> None:
    """8 processes x 50 callers in half-open: at most half_open_probes reach the backend."""
    breaker = shared_breaker(store, open_for=0.5, half_open_probes=2)
    with pytest.raises(Boom):
        breaker.call(boom)
    tripped_at = time.monotonic()
    counter = key_prefix + "reached"
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(9)
    results = ctx.Queue()
    split = [7, 7, 6, 6, 6, 6, 6, 6]
    procs = [
        ctx.Process(
            target=_process_callers,
            args=(redis_url, key_prefix, counter, n, barrier, results),
        )
        for n in split
    ]
    for p in procs:
        p.start()
    try:
        time.sleep(max(0.0, 0.55 - (time.monotonic() - tripped_at)))
        barrier.wait(20)
        outcomes = [results.get(timeout=30) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
    reached = int(store.client.get(counter) or 0)
    store.client.delete(counter)
    assert 1 <= reached <= 2
    assert sum(o["refused"] for o in outcomes) == 50 - reached
    assert sum(o["failed"] for o in outcomes) == reached


def test_outage_decides_locally_then_rejoins(
    owned_redis: Any, key_prefix: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis down: the breaker decides locally, logs and tells listeners; back: it rejoins."""
    events: list[BreakerEvent] = []
    store = RedisStore(owned_redis.url, prefix=key_prefix)
    breaker = shared_breaker(
        store, listeners=[events.append], clock=clock, store_retry=1.0, open_for=60.0
    )
    assert breaker.call(lambda: 1) == 1
    owned_redis.stop()
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
    store.close()


async def test_async_store_forms(redis_url: str, key_prefix: str) -> None:
    """With AsyncRedisStore the async forms share state; the sync form says to use them."""
    store = AsyncRedisStore(redis_url, prefix=key_prefix)
    breaker = shared_breaker(store, open_for=0.2)

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
    await asyncio.sleep(0.25)
    reached = 0

    async def probe() -> None:
        nonlocal reached
        reached += 1
        await asyncio.sleep(0.1)

    results = await asyncio.gather(
        *(breaker.acall(probe) for _ in range(20)), return_exceptions=True
    )
    assert reached == 1
    assert sum(isinstance(r, CircuitOpen) for r in results) == 19
    assert await breaker.astate() == "closed"
    await breaker.aforce_open()
    assert await breaker.astate() == "open"
    await breaker.areset()
    assert await breaker.astate() == "closed"
    await store.aclose()


async def test_sync_store_from_async_code(store: RedisStore) -> None:
    """A sync RedisStore works from the async forms (run in a worker thread)."""
    breaker = shared_breaker(store)

    async def fail() -> None:
        raise Boom

    with pytest.raises(Boom):
        await breaker.acall(fail)
    with pytest.raises(CircuitOpen):
        await breaker.aacquire()


# -- retry budget --------------------------------------------------------------------


def test_budget_shared_between_instances(
    store: RedisStore, redis_url: str, key_prefix: str
) -> None:
    """Two budget objects with one name draw on one balance."""
    a = RetryBudget(ratio=0.5, min_per_second=1, window=2.0, store=store, name="up")
    with RedisStore(redis_url, prefix=key_prefix) as other:
        b = RetryBudget(ratio=0.5, min_per_second=1, window=2.0, store=other, name="up")
        for _ in range(4):
            a.record_request()
        # reserve 2 + 0.5 * 4 = 4 retries between both of them
        allowed = [a.try_retry(), b.try_retry(), a.try_retry(), b.try_retry(), a.try_retry()]
        assert allowed == [True, True, True, True, False]
        assert not b.try_retry()


async def test_budget_async_twins_shared(redis_url: str, key_prefix: str) -> None:
    """arecord_request/atry_retry use an AsyncRedisStore."""
    store = AsyncRedisStore(redis_url, prefix=key_prefix)
    budget = RetryBudget(ratio=0.0, min_per_second=1, window=3.0, store=store, name="up")
    await budget.arecord_request()
    assert [await budget.atry_retry() for _ in range(4)] == [True, True, True, False]
    await store.aclose()


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


# -- cooldown ------------------------------------------------------------------------


def test_cooldown_shared_and_only_extended(
    store: RedisStore, redis_url: str, key_prefix: str
) -> None:
    """A pause set by one process object is seen by another; a shorter one never shortens it."""
    origin = "https://api.example.com"
    a = Cooldown(store=store)
    with RedisStore(redis_url, prefix=key_prefix) as other:
        b = Cooldown(store=other)
        assert b.remaining(origin) == 0.0
        a.pause(origin, 30.0)
        assert 29.0 < b.remaining(origin) <= 30.0
        b.pause(origin, 1.0)
        assert a.remaining(origin) > 29.0


async def test_cooldown_async_store(redis_url: str, key_prefix: str) -> None:
    """apause/aremaining work through an AsyncRedisStore."""
    store = AsyncRedisStore(redis_url, prefix=key_prefix)
    a, b = Cooldown(store=store), Cooldown(store=store)
    await a.apause("o", 10.0)
    assert 9.0 < await b.aremaining("o") <= 10.0
    await store.aclose()


def test_rng_seeded_jitter_is_reproducible(store: RedisStore) -> None:
    """The jitter draw comes from the breaker's RNG, so a seeded run is reproducible."""
    b1 = shared_breaker(store, name="j1", jitter=0.5, open_for=10.0, rng=random.Random(3))
    b2 = shared_breaker(store, name="j2", jitter=0.5, open_for=10.0, rng=random.Random(3))
    remaining = []
    for b in (b1, b2):
        with pytest.raises(Boom):
            b.call(boom)
        with pytest.raises(CircuitOpen) as info:
            b.call(lambda: None)
        remaining.append(info.value.remaining)
    assert 5.0 <= remaining[0] <= 10.0
    assert remaining[0] == pytest.approx(remaining[1], abs=0.05)


async def test_async_retry_awaits_an_async_store(redis_url: str, key_prefix: str) -> None:
    """@retry on a coroutine awaits a breaker and budget shared through AsyncRedisStore."""
    import stormguard

    store = AsyncRedisStore(redis_url, prefix=key_prefix)
    breaker = shared_breaker(store, min_calls=2, open_for=30.0)
    budget = RetryBudget(ratio=0.0, min_per_second=1, window=10.0, store=store, name="api")
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
