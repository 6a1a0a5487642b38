"""One contract for the shared protection objects, run on every store, on a fake clock.

Each test builds its objects through ``shared_store()``: the same MemoryStore, or
a new RedisStore view of one Redis (another process, as far as the object can
tell). Two objects with the same name must behave as one, whatever the store.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from protection_support import StoreFactory

from stormguard import CircuitOpen
from stormguard.protection import CircuitBreaker, Cooldown, RetryBudget
from stormguard.testing import FakeClock


class Boom(Exception):
    pass


def boom() -> None:
    raise Boom


def trip(b: CircuitBreaker) -> None:
    """One failing call through ``b``."""
    with pytest.raises(Boom):
        b.call(boom)


def breaker(store: Any, clock: FakeClock, **kwargs: Any) -> CircuitBreaker:
    settings: dict[str, Any] = {
        "name": "payments",
        "store": store,
        "clock": clock,
        "min_calls": 1,
        "open_for": 10.0,
        "jitter": 0.0,
        "rng": random.Random(7),
        "staleness": 0.0,  # every call asks the store: the near cache has its own tests
    }
    settings.update(kwargs)
    return CircuitBreaker(**settings)


# -- circuit breaker -------------------------------------------------------------------


def test_breaker_trip_is_seen_by_every_instance(
    shared_store: StoreFactory, clock: FakeClock
) -> None:
    """A trip through one breaker object refuses calls through another with the same name."""
    first, second = breaker(shared_store(), clock), breaker(shared_store(), clock)
    assert second.state == "closed"
    trip(first)
    assert second.state == "open"
    with pytest.raises(CircuitOpen) as info:
        second.call(lambda: None)
    assert info.value.remaining == pytest.approx(10.0)
    clock.advance(4.0)
    assert second.open_remaining() == pytest.approx(6.0)


def test_breaker_names_are_independent(shared_store: StoreFactory, clock: FakeClock) -> None:
    """Breakers with different names on one store do not share state."""
    a = breaker(shared_store(), clock, name="a")
    b = breaker(shared_store(), clock, name="b")
    trip(a)
    assert (a.state, b.state) == ("open", "closed")


@pytest.mark.parametrize(("failures", "state"), [(1, "closed"), (2, "open")])
def test_breaker_rate_and_min_calls(
    shared_store: StoreFactory, clock: FakeClock, failures: int, state: str
) -> None:
    """It opens at failure_rate once min_calls completed in the window."""
    b = breaker(shared_store(), clock, min_calls=4, failure_rate=0.5)
    b.call(lambda: None)
    b.call(lambda: None)
    for _ in range(failures):
        trip(b)
    if failures == 1:
        assert b.state == "closed"  # 3 calls < min_calls
        b.call(lambda: None)  # 1 of 4 < 50 %
    assert b.state == state


def test_breaker_time_window_forgets_old_failures(
    shared_store: StoreFactory, clock: FakeClock
) -> None:
    """Failures older than the window do not count towards a trip."""
    b = breaker(shared_store(), clock, min_calls=2, window=10.0, buckets=10)
    trip(b)
    clock.advance(11.0)
    b.call(lambda: None)
    trip(b)
    assert b.state == "open"  # 1 of 2 in the window; with the old one it would be 2 of 3
    c = breaker(shared_store(), clock, name="c", min_calls=3, window=10.0)
    trip(c)
    clock.advance(11.0)
    c.call(lambda: None)
    c.call(lambda: None)
    assert c.state == "closed"  # the failure aged out: 0 of 2


def test_breaker_count_window(shared_store: StoreFactory, clock: FakeClock) -> None:
    """A count window judges only the last `window` outcomes."""
    b = breaker(shared_store(), clock, window_kind="count", window=4, min_calls=4)
    trip(b)
    for _ in range(4):
        b.call(lambda: None)
    trip(b)
    assert b.state == "closed"
    trip(b)
    assert b.state == "open"


def test_breaker_half_open_probe_closes_for_everyone(
    shared_store: StoreFactory, clock: FakeClock
) -> None:
    """After open_for one probe is admitted (others refused); its success closes the circuit."""
    first, second = breaker(shared_store(), clock), breaker(shared_store(), clock)
    trip(first)
    clock.advance(10.0)
    probe = first.acquire()
    assert probe.probe
    with pytest.raises(CircuitOpen):
        second.acquire()
    probe.record(failure=False)
    assert second.state == "closed"
    assert second.call(lambda: 5) == 5


def test_breaker_failed_probe_reopens_for_twice_as_long(
    shared_store: StoreFactory, clock: FakeClock
) -> None:
    """A failed probe re-opens the circuit for open_for * 2."""
    b = breaker(shared_store(), clock)
    trip(b)
    clock.advance(10.0)
    trip(b)
    assert b.state == "open"
    assert b.open_remaining() == pytest.approx(20.0)


def test_breaker_two_probes_must_both_succeed(shared_store: StoreFactory, clock: FakeClock) -> None:
    """With half_open_probes=2 exactly two probes run, and both must succeed to close."""
    first = breaker(shared_store(), clock, half_open_probes=2)
    second = breaker(shared_store(), clock, half_open_probes=2)
    trip(first)
    clock.advance(10.0)
    p1, p2 = first.acquire(), second.acquire()
    assert p1.probe and p2.probe
    with pytest.raises(CircuitOpen):
        first.acquire()
    p1.record(failure=False)
    assert second.state == "half_open"
    p2.record(failure=False)
    assert first.state == "closed"


def test_breaker_hung_probe_lease_expires(shared_store: StoreFactory, clock: FakeClock) -> None:
    """A probe that never reports counts as failed when its lease ends; its late result is stale."""
    b = breaker(shared_store(), clock, probe_lease=5.0)
    trip(b)
    clock.advance(10.0)
    hung = b.acquire()
    assert hung.probe
    clock.advance(5.0)
    assert b.state == "open"
    assert b.open_remaining() == pytest.approx(20.0)
    clock.advance(20.0)
    assert b.call(lambda: 7) == 7
    hung.record(failure=True)  # an older generation: changes nothing
    assert b.state == "closed"


def test_breaker_released_probe_frees_its_slot(
    shared_store: StoreFactory, clock: FakeClock
) -> None:
    """A cancelled probe gives its slot to the next caller without an outcome."""
    b = breaker(shared_store(), clock)
    trip(b)
    clock.advance(10.0)
    b.acquire().release()
    probe = b.acquire()
    assert probe.probe
    probe.record(failure=False)
    assert b.state == "closed"


def test_breaker_late_result_of_older_generation_ignored(
    shared_store: StoreFactory, clock: FakeClock
) -> None:
    """A call admitted while closed that fails after the trip changes nothing."""
    b = breaker(shared_store(), clock)
    slow = b.acquire()
    trip(b)
    clock.advance(10.0)
    probe = b.acquire()
    slow.record(failure=True)
    assert b.state == "half_open"
    probe.record(failure=False)
    assert b.state == "closed"


def test_breaker_slow_calls_are_failures(shared_store: StoreFactory, clock: FakeClock) -> None:
    """A call slower than slow_call counts as a failure."""
    b = breaker(shared_store(), clock, slow_call=1.0)
    b.call(clock.advance, 2.0)
    assert b.state == "open"


def test_breaker_force_open_and_reset_are_shared(
    shared_store: StoreFactory, clock: FakeClock
) -> None:
    """force_open() through one object refuses through another until reset()."""
    first, second = breaker(shared_store(), clock), breaker(shared_store(), clock)
    first.force_open()
    clock.advance(1e6)
    with pytest.raises(CircuitOpen):
        second.call(lambda: None)
    second.reset()
    assert first.call(lambda: 1) == 1


async def test_breaker_async_forms(shared_store: StoreFactory, clock: FakeClock) -> None:
    """acall/astate/aopen_remaining follow the same rules."""
    b = breaker(shared_store(), clock)

    async def fail() -> None:
        raise Boom

    with pytest.raises(Boom):
        await b.acall(fail)
    assert await b.astate() == "open"
    assert await b.aopen_remaining() == pytest.approx(10.0)
    clock.advance(10.0)
    async with b:
        pass
    assert await b.astate() == "closed"


# -- retry budget ----------------------------------------------------------------------


def budget(store: Any, clock: FakeClock, **kwargs: Any) -> RetryBudget:
    settings: dict[str, Any] = {
        "name": "payments",
        "store": store,
        "clock": clock,
        "ratio": 0.5,
        "min_per_second": 0.5,
        "window": 10.0,
    }
    settings.update(kwargs)
    return RetryBudget(**settings)


def test_budget_starts_at_the_reserve(shared_store: StoreFactory, clock: FakeClock) -> None:
    """A new budget allows min_per_second * window retries, then refuses."""
    b = budget(shared_store(), clock)
    assert [b.try_retry() for _ in range(6)] == [True] * 5 + [False]


def test_budget_first_attempts_deposit_ratio(shared_store: StoreFactory, clock: FakeClock) -> None:
    """Every first attempt deposits `ratio` of a retry, shared by every instance."""
    first, second = budget(shared_store(), clock), budget(shared_store(), clock)
    for _ in range(10):
        first.record_request()
    allowed = sum(second.try_retry() for _ in range(20))
    assert allowed == 10  # reserve 5 + 10 * 0.5


def test_budget_window_returns_retries(shared_store: StoreFactory, clock: FakeClock) -> None:
    """Withdrawals leave with the window: the reserve is back one window later."""
    b = budget(shared_store(), clock)
    while b.try_retry():
        pass
    clock.advance(5.0)
    assert not b.try_retry()
    clock.advance(6.0)
    assert b.try_retry()


async def test_budget_async_twins(shared_store: StoreFactory, clock: FakeClock) -> None:
    """arecord_request/atry_retry count in the same shared counters."""
    first, second = budget(shared_store(), clock), budget(shared_store(), clock)
    for _ in range(2):
        await first.arecord_request()
    results = [await second.atry_retry() for _ in range(7)]
    assert results == [True] * 6 + [False]


# -- cooldown --------------------------------------------------------------------------


def test_cooldown_is_shared_and_runs_out(shared_store: StoreFactory, clock: FakeClock) -> None:
    """A pause set through one cooldown is seen through another and ends on the clock."""
    a = Cooldown(store=shared_store(), clock=clock)
    b = Cooldown(store=shared_store(), clock=clock)
    a.pause("https://api.example.com", 30.0)
    assert b.remaining("https://api.example.com") == pytest.approx(30.0)
    assert b.remaining("https://other.example.com") == 0.0
    clock.advance(12.0)
    assert b.remaining("https://api.example.com") == pytest.approx(18.0)
    clock.advance(18.0)
    assert b.remaining("https://api.example.com") == 0.0


def test_cooldown_is_only_extended(shared_store: StoreFactory, clock: FakeClock) -> None:
    """A shorter pause never shortens a longer one; a longer one extends it."""
    a = Cooldown(store=shared_store(), clock=clock)
    b = Cooldown(store=shared_store(), clock=clock)
    a.pause("o", 30.0)
    b.pause("o", 1.0)
    assert a.remaining("o") == pytest.approx(30.0)
    b.pause("o", 45.0)
    assert a.remaining("o") == pytest.approx(45.0)


async def test_cooldown_async_twins(shared_store: StoreFactory, clock: FakeClock) -> None:
    """apause/aremaining share the same pauses."""
    a = Cooldown(store=shared_store(), clock=clock)
    b = Cooldown(store=shared_store(), clock=clock)
    await a.apause("o", 10.0)
    clock.advance(4.0)
    assert await b.aremaining("o") == pytest.approx(6.0)
