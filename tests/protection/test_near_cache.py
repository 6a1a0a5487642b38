"""The near cache of a Redis-shared breaker: closed calls cost no round trip, bounded staleness."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from protection_support import fake_time_redis_store

from stormguard import CircuitOpen, ConfigError
from stormguard.protection import CircuitBreaker
from stormguard.testing import FakeClock

pytest.importorskip("redis")
pytestmark = pytest.mark.redis


class Boom(Exception):
    pass


def boom() -> None:
    raise Boom


class Counted:
    """Counts the scripts a store runs (one script call is one round trip)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: list[str] = []
        inner = store.run_script

        def run_script(name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
            self.calls.append(name)
            return inner(name, keys, args)

        async def arun_script(name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
            self.calls.append(name)
            return await inner(name, keys, args)

        store.run_script = arun_script if inspect.iscoroutinefunction(inner) else run_script


@pytest.fixture
def counted(redis_url: str, key_prefix: str, clock: FakeClock) -> Iterator[Counted]:
    """A fake-clock RedisStore whose round trips are counted."""
    store = fake_time_redis_store(redis_url, key_prefix, clock)
    yield Counted(store)
    store.close()


def shared(store: Any, clock: FakeClock, **kwargs: Any) -> CircuitBreaker:
    settings: dict[str, Any] = {
        "name": "api",
        "store": store,
        "clock": clock,
        "min_calls": 5,
        "open_for": 10.0,
        "jitter": 0.0,
    }
    settings.update(kwargs)
    return CircuitBreaker(**settings)


def test_closed_calls_cost_one_round_trip_per_staleness(counted: Counted, clock: FakeClock) -> None:
    """1,000 successful calls over 1 s cost one round trip per 100 ms, not two per call."""
    breaker = shared(counted.store, clock)
    for _ in range(1000):
        breaker.call(lambda: None)
        clock.advance(0.001)
    assert len(counted.calls) <= 11
    assert set(counted.calls) == {"breaker_record"}


def test_without_the_cache_every_call_costs_two(counted: Counted, clock: FakeClock) -> None:
    """staleness=0 asks the store twice per call (admit and record)."""
    breaker = shared(counted.store, clock, staleness=0.0)
    for _ in range(10):
        breaker.call(lambda: None)
    assert len(counted.calls) == 20


def test_batched_successes_reach_the_shared_window(counted: Counted, clock: FakeClock) -> None:
    """Successes counted locally land in Redis' window with the next batch."""
    breaker = shared(counted.store, clock)
    for _ in range(500):
        breaker.call(lambda: None)
    key = counted.store.key("breaker", "api")
    assert counted.store.client.hget(key, "calls") is None  # nothing sent yet
    clock.advance(0.1)
    breaker.call(lambda: None)  # the cache is stale: the batch goes with the re-read
    assert int(counted.store.client.hget(key, "calls")) == 500
    assert len(counted.calls) == 2


def test_own_trip_is_seen_at_once(counted: Counted, clock: FakeClock) -> None:
    """A failure is sent at once: the process that trips the breaker refuses the next call."""
    breaker = shared(counted.store, clock, min_calls=1)
    with pytest.raises(Boom):
        breaker.call(boom)
    with pytest.raises(CircuitOpen):
        breaker.call(lambda: None)
    assert breaker.state == "open"


def test_other_processes_see_a_trip_within_staleness(
    counted: Counted, redis_url: str, key_prefix: str, clock: FakeClock
) -> None:
    """Another breaker object admits on its cached 'closed' for at most `staleness` seconds."""
    other_store = fake_time_redis_store(redis_url, key_prefix, clock)
    try:
        first = shared(counted.store, clock, min_calls=1)
        second = shared(other_store, clock, min_calls=1)
        assert second.call(lambda: 1) == 1  # reads "closed" into its cache
        with pytest.raises(Boom):
            first.call(boom)
        clock.advance(0.05)
        assert second.call(lambda: 2) == 2  # still within the staleness bound
        clock.advance(0.06)
        with pytest.raises(CircuitOpen):
            second.call(lambda: None)
    finally:
        other_store.close()


def test_open_refusals_cost_no_round_trip(counted: Counted, clock: FakeClock) -> None:
    """While the cached state says open, refusals are local."""
    breaker = shared(counted.store, clock, min_calls=1)
    with pytest.raises(Boom):
        breaker.call(boom)
    before = len(counted.calls)
    for _ in range(100):
        with pytest.raises(CircuitOpen):
            breaker.call(lambda: None)
    assert len(counted.calls) == before


def test_half_open_is_always_asked(counted: Counted, clock: FakeClock) -> None:
    """In half-open every admission runs breaker_acquire (the fleet-wide probe limit)."""
    breaker = shared(counted.store, clock, min_calls=1)
    with pytest.raises(Boom):
        breaker.call(boom)
    clock.advance(10.0)
    probe = breaker.acquire()
    assert probe.probe
    with pytest.raises(CircuitOpen):
        breaker.acquire()
    assert counted.calls[-2:] == ["breaker_record", "breaker_acquire"]
    probe.record(failure=False)
    assert breaker.state == "closed"


def test_staleness_stays_below_the_shortest_open_time(counted: Counted, clock: FakeClock) -> None:
    """A cached 'closed' can never reach a later half-open: staleness <= half the open time."""
    breaker = shared(counted.store, clock, open_for=0.1, jitter=0.2, staleness=5.0)
    breaker.call(lambda: None)
    clock.advance(0.041)
    calls = len(counted.calls)
    breaker.call(lambda: None)
    assert len(counted.calls) == calls + 1  # 0.041 > 0.5 * 0.1 * 0.8: asked again


@pytest.mark.parametrize("staleness", [-0.1, float("inf"), True, "0.1"])
def test_invalid_staleness_is_a_config_error(staleness: Any) -> None:
    """staleness must be a finite number of seconds >= 0."""
    with pytest.raises(ConfigError, match="staleness"):
        CircuitBreaker(staleness=staleness)


def test_threads_share_one_refresh(counted: Counted, clock: FakeClock) -> None:
    """50 threads finding the cache stale together make one round trip between them."""
    import threading

    breaker = shared(counted.store, clock)
    breaker.call(lambda: None)
    clock.advance(0.2)
    before = len(counted.calls)
    start = threading.Barrier(50)

    def caller() -> None:
        start.wait()
        for _ in range(20):
            breaker.call(lambda: None)

    threads = [threading.Thread(target=caller) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(counted.calls) - before == 1


async def test_tasks_share_one_refresh(redis_url: str, key_prefix: str, clock: FakeClock) -> None:
    """50 tasks of one loop finding the cache stale together make one round trip."""
    import asyncio

    from protection_support import fake_time_async_redis_store

    store = fake_time_async_redis_store(redis_url, key_prefix, clock)
    counted = Counted(store)
    breaker = shared(store, clock)

    async def ok() -> None:
        await asyncio.sleep(0)

    await breaker.acall(ok)
    clock.advance(0.2)
    before = len(counted.calls)
    await asyncio.gather(*(breaker.acall(ok) for _ in range(50)))
    assert len(counted.calls) - before == 1
    await store.aclose()


def test_try_enter_cached_admits_on_a_fresh_closed_reading_only(
    counted: Counted, clock: FakeClock
) -> None:
    """No ticket before a reading, past `staleness`, or while open; a ticket costs no
    round trip and its successes reach the shared window with the next reading."""
    breaker = shared(counted.store, clock)
    assert breaker.try_enter() is None  # the lock-free pair of a local breaker only
    assert breaker.try_enter_cached() is None  # never read
    breaker.call(lambda: None)  # reads "closed"
    before = len(counted.calls)
    for _ in range(20):
        ticket = breaker.try_enter_cached()
        assert ticket is not None
        breaker.settle(ticket, clock.monotonic(), clock.monotonic())
    assert len(counted.calls) == before  # no round trip
    clock.advance(0.1)
    assert breaker.try_enter_cached() is None  # stale: acquire() asks
    breaker.call(lambda: None)  # the batch goes with the re-read
    key = counted.store.key("breaker", "api")
    assert int(counted.store.client.hget(key, "calls")) == 21


def test_a_cached_ticket_failure_is_sent_at_once(counted: Counted, clock: FakeClock) -> None:
    """settle(failure=True) of a cached ticket sends the batch now: the trip is seen at
    once, and no ticket is handed out while the reading says open."""
    breaker = shared(counted.store, clock, min_calls=2)
    breaker.call(lambda: None)
    ticket = breaker.try_enter_cached()
    assert ticket is not None
    breaker.settle(ticket, clock.monotonic(), clock.monotonic(), failure=True)
    assert breaker.state == "open"
    assert breaker.try_enter_cached() is None
    with pytest.raises(CircuitOpen):
        breaker.acquire()


def test_a_cached_ticket_of_an_earlier_generation_counts_nothing(
    counted: Counted, clock: FakeClock
) -> None:
    """A ticket handed out before the breaker moved on (a reset) is not counted
    against the new generation."""
    breaker = shared(counted.store, clock, min_calls=1)
    breaker.call(lambda: None)
    old = breaker.try_enter_cached()
    assert old is not None
    breaker.reset()  # a new generation
    breaker.call(lambda: None)
    breaker.settle(old, clock.monotonic(), clock.monotonic(), failure=True)
    assert breaker.state == "closed"


def test_a_cached_ticket_judges_slow_calls(counted: Counted, clock: FakeClock) -> None:
    """With slow_call, a success slower than it is a failure, sent at once."""
    breaker = shared(counted.store, clock, min_calls=1, slow_call=0.5)
    breaker.call(lambda: None)
    ticket = breaker.try_enter_cached()
    assert ticket is not None
    started = clock.monotonic()
    breaker.settle(ticket, started, started + 0.6)
    assert breaker.state == "open"


def test_no_cached_ticket_while_the_store_is_unreachable(
    redis_url: str, key_prefix: str, clock: FakeClock
) -> None:
    """Once the store failed, the breaker decides locally: try_enter_cached hands out
    the local core's closed admission only through acquire(), never a shared ticket."""
    from net_support import refused_port
    from stormguard.stores import RedisStore

    store = RedisStore(f"redis://127.0.0.1:{refused_port()}/0", prefix=key_prefix)
    breaker = shared(store, clock)
    breaker.call(lambda: None)  # decided locally; the store is marked unreachable
    assert breaker.degraded
    assert breaker.try_enter_cached() is None
    store.close()


async def test_asettle_awaits_the_store_for_a_cached_failure(
    redis_url: str, key_prefix: str, clock: FakeClock
) -> None:
    """The async twin on an AsyncRedisStore: a success is counted with no round trip,
    a failure awaits the report (the trip is seen at once); sync settle() of a cached
    failure on an async store says to use the async form."""
    from protection_support import fake_time_async_redis_store

    store = fake_time_async_redis_store(redis_url, key_prefix, clock)
    counted = Counted(store)
    breaker = shared(store, clock, min_calls=2)

    async def ok() -> None:
        return None

    await breaker.acall(ok)
    before = len(counted.calls)
    ticket = breaker.try_enter_cached()
    assert ticket is not None
    await breaker.asettle(ticket, clock.monotonic(), clock.monotonic())
    assert len(counted.calls) == before
    ticket = breaker.try_enter_cached()
    assert ticket is not None
    with pytest.raises(TypeError, match="async forms"):
        breaker.settle(ticket, clock.monotonic(), clock.monotonic(), failure=True)
    assert len(counted.calls) == before
    # two successes so far: the second failure (2 of 4) trips it, and this process
    # hands out no ticket from then on
    tickets = 0
    while (ticket := breaker.try_enter_cached()) is not None and tickets < 5:
        tickets += 1
        await breaker.asettle(ticket, clock.monotonic(), clock.monotonic(), failure=True)
    assert tickets == 2 and await breaker.astate() == "open"
    assert breaker.last_state == "open"
    await store.aclose()
