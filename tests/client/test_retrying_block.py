"""stormguard.retrying(): retrying a block with `for` and `async for`."""

from __future__ import annotations

import asyncio

import pytest

from stormguard import Constant, Exponential, GiveUpReason, RetryError, RetryRecord, retrying
from stormguard.testing import FakeClock


def test_block_is_retried_until_it_succeeds() -> None:
    """Two failing blocks then a good one: three attempts, two waits."""
    clock = FakeClock()
    outcomes = [OSError("a"), OSError("b"), None]
    numbers = []
    for attempt in retrying(on=OSError, backoff=Exponential(1, 10), clock=clock):
        with attempt:
            numbers.append(attempt.number)
            error = outcomes.pop(0)
            if error is not None:
                raise error
    assert numbers == [1, 2, 3] and clock.sleeps == [1, 2]


def test_giving_up_raises_retry_error_from_the_block() -> None:
    """When attempts run out the block raises RetryError with the last exception."""
    clock = FakeClock()
    with pytest.raises(RetryError) as info:
        for attempt in retrying(on=OSError, attempts=2, backoff=Constant(1, 1), clock=clock):
            with attempt:
                raise OSError("always")
    assert info.value.reason == GiveUpReason.ATTEMPTS_EXHAUSTED
    assert isinstance(info.value.last_exception, OSError) and clock.sleeps == [1]


def test_unmatched_exception_propagates_at_once() -> None:
    """An exception not matched by `on` leaves the loop unchanged after one attempt."""
    count = 0
    with pytest.raises(KeyError):
        for attempt in retrying(on=OSError, clock=FakeClock()):
            with attempt:
                count += 1
                raise KeyError("bug")
    assert count == 1


def test_async_for_works_the_same() -> None:
    """`async for` sleeps with the clock's async sleep and records each retry."""
    clock = FakeClock()
    records: list[RetryRecord] = []

    async def main() -> int:
        calls = 0
        async for attempt in retrying(
            on=TimeoutError,
            backoff=Constant(0.5, 0.5),
            clock=clock,
            on_retry=records.append,
            name="fetch",
        ):
            with attempt:
                calls += 1
                if calls < 3:
                    raise TimeoutError
        return calls

    assert asyncio.run(main()) == 3
    assert clock.sleeps == [0.5, 0.5]
    assert [r.target for r in records] == ["fetch", "fetch"]


def test_a_loop_without_with_stops_after_one_attempt() -> None:
    """An attempt never entered counts as finished: the loop cannot spin forever."""
    attempts = list(retrying(on=OSError, clock=FakeClock()))
    assert len(attempts) == 1


@pytest.mark.redis
async def test_async_for_awaits_a_budget_on_an_async_redis_store(
    redis_url: str, key_prefix: str
) -> None:
    """Drift bug: `async for` in retrying(budget=...) used the sync budget calls (TypeError)."""
    pytest.importorskip("redis")
    from stormguard import CircuitBreaker, RetryBudget
    from stormguard.stores import AsyncRedisStore

    store = AsyncRedisStore(redis_url, prefix=key_prefix)
    budget = RetryBudget(store=store, name="block")
    breaker = CircuitBreaker(store=store, name="block", min_calls=100)
    clock = FakeClock()
    calls = 0
    async for attempt in retrying(
        on=OSError, budget=budget, breaker=breaker, backoff=Constant(1, 1), clock=clock
    ):
        with attempt:
            calls += 1
            if calls < 3:
                raise OSError("flaky")
    assert calls == 3 and clock.sleeps == [1, 1]
    await store.aclose()


def test_reraise_in_a_retrying_block_raises_the_last_exception() -> None:
    """retrying(reraise=True) ends with the last exception itself, not RetryError."""
    with pytest.raises(OSError, match="2"):
        for attempt in retrying(on=OSError, attempts=2, reraise=True, clock=FakeClock()):
            with attempt:
                raise OSError(str(attempt.number))


def test_retry_if_in_a_retrying_block() -> None:
    """retrying(retry_if=...) sees each matched exception; False ends the loop at once."""
    calls = 0
    with pytest.raises(RetryError) as info:
        for attempt in retrying(on=OSError, retry_if=lambda exc: False, clock=FakeClock()):
            with attempt:
                calls += 1
                raise OSError("no")
    assert calls == 1 and info.value.reason == GiveUpReason.NOT_RETRYABLE


async def test_async_with_attempt_drives_the_call_at_the_block_end() -> None:
    """`async with attempt:` in `async for` retries and raises RetryError from the block."""
    clock = FakeClock()
    calls = 0
    with pytest.raises(RetryError):
        async for attempt in retrying(on=OSError, attempts=3, backoff=Constant(1, 1), clock=clock):
            async with attempt:
                calls += 1
                raise OSError("down")
    assert calls == 3 and clock.sleeps == [1, 1]
