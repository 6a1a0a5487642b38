"""Budget and breaker wired into RetryPolicy and @retry: the reasons the call ends with."""

from __future__ import annotations

import random

import pytest

import stormguard
from stormguard import CircuitOpen, NoBackoff, RetryError
from stormguard.protection import CircuitBreaker, RetryBudget
from stormguard.testing import FakeClock


class Flaky(Exception):
    pass


def test_budget_exhausted_ends_the_call(clock: FakeClock, rng: random.Random) -> None:
    """When the budget says no, @retry gives up with 'retry budget exhausted'."""
    budget = RetryBudget(ratio=0.0, min_per_second=0, window=10.0, clock=clock)
    calls = 0

    @stormguard.retry(
        on=Flaky, attempts=5, budget=budget, backoff=NoBackoff(), clock=clock, rng=rng
    )
    def flaky() -> None:
        nonlocal calls
        calls += 1
        raise Flaky

    with pytest.raises(RetryError) as info:
        flaky()
    assert info.value.reason == "retry budget exhausted"
    assert calls == 1


def test_budget_counts_first_attempts_and_retries(clock: FakeClock, rng: random.Random) -> None:
    """Each logical call deposits once; each retry withdraws once."""
    budget = RetryBudget(ratio=0.5, min_per_second=0, window=100.0, clock=clock)

    @stormguard.retry(
        on=Flaky, attempts=3, budget=budget, backoff=NoBackoff(), clock=clock, rng=rng
    )
    def always() -> None:
        raise Flaky

    reasons = []
    for _ in range(4):
        with pytest.raises(RetryError) as info:
            always()
        reasons.append(info.value.reason)
    # deposits 0.5 per call: retries granted while retries + 1 <= 0.5 * calls
    assert reasons.count("retry budget exhausted") >= 2
    assert budget.balance() < 1.0


def test_breaker_refusal_on_first_attempt_raises_circuit_open(
    clock: FakeClock, rng: random.Random
) -> None:
    """An open breaker refuses the first attempt with CircuitOpen (nothing was tried)."""
    breaker = CircuitBreaker(min_calls=1, clock=clock, rng=rng)
    breaker.force_open()

    @stormguard.retry(on=Flaky, breaker=breaker, clock=clock, rng=rng)
    def guarded() -> None:
        raise AssertionError("must not run")

    with pytest.raises(CircuitOpen):
        guarded()


def test_breaker_opening_mid_call_ends_with_circuit_open(
    clock: FakeClock, rng: random.Random
) -> None:
    """The breaker trips on the first failure: the retry ends with reason 'circuit open'."""
    breaker = CircuitBreaker(min_calls=1, open_for=30.0, clock=clock, rng=rng)
    calls = 0

    @stormguard.retry(
        on=Flaky, attempts=4, breaker=breaker, backoff=NoBackoff(), clock=clock, rng=rng
    )
    def flaky() -> None:
        nonlocal calls
        calls += 1
        raise Flaky

    with pytest.raises(RetryError) as info:
        flaky()
    assert info.value.reason == "circuit open"
    assert calls == 1


async def test_async_retry_with_breaker_and_budget(clock: FakeClock, rng: random.Random) -> None:
    """The async decorator consults the same breaker and budget."""
    breaker = CircuitBreaker(min_calls=2, clock=clock, rng=rng)
    budget = RetryBudget(ratio=0.0, min_per_second=1, window=10.0, clock=clock)
    calls = 0

    @stormguard.retry(
        on=Flaky, attempts=3, breaker=breaker, budget=budget, backoff=NoBackoff(), clock=clock
    )
    async def flaky() -> None:
        nonlocal calls
        calls += 1
        raise Flaky

    with pytest.raises(RetryError) as info:
        await flaky()
    assert info.value.reason == "circuit open"
    assert calls == 2
    assert breaker.state == "open"


def test_successful_calls_leave_the_breaker_closed(clock: FakeClock, rng: random.Random) -> None:
    """Successes through @retry are recorded as successes."""
    breaker = CircuitBreaker(min_calls=2, clock=clock, rng=rng)

    @stormguard.retry(on=Flaky, breaker=breaker, clock=clock, rng=rng)
    def ok() -> int:
        return 1

    assert sum(ok() for _ in range(50)) == 50
    assert breaker.state == "closed"
