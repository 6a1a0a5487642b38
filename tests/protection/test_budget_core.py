"""RetryBudgetCore: retries bounded by a ratio of first attempts plus a reserve."""

from __future__ import annotations

import random

import pytest

from stormguard.core._budget import RetryBudgetCore


def test_starts_at_reserve_not_full() -> None:
    """A fresh budget allows exactly min_per_second * window retries."""
    budget = RetryBudgetCore(ratio=0.1, min_per_second=10, window=10.0)
    allowed = sum(budget.try_retry(0.0) for _ in range(1000))
    assert allowed == 100


def test_first_attempts_deposit_ratio() -> None:
    """Each first attempt earns `ratio` of a retry."""
    budget = RetryBudgetCore(ratio=0.2, min_per_second=0, window=10.0)
    assert not budget.try_retry(0.0)
    for _ in range(50):
        budget.record_request(0.0)
    assert sum(budget.try_retry(0.0) for _ in range(100)) == 10


def test_withdrawals_expire_with_the_window() -> None:
    """Retries older than the window no longer count against the budget."""
    budget = RetryBudgetCore(ratio=0.0, min_per_second=1, window=10.0)
    assert sum(budget.try_retry(0.0) for _ in range(20)) == 10
    assert not budget.try_retry(9.9)
    assert sum(budget.try_retry(10.5) for _ in range(20)) == 10


def test_full_failure_retries_stay_within_ratio_plus_reserve() -> None:
    """At 1000 first attempts/s on a 100% failing backend, retries <= 10% + reserve."""
    budget = RetryBudgetCore(ratio=0.1, min_per_second=10, window=10.0)
    requests = retries = 0
    for ms in range(60_000):
        now = ms / 1000.0
        budget.record_request(now)
        requests += 1
        while budget.try_retry(now):  # every attempt fails: retry while allowed
            retries += 1
    assert retries <= 0.1 * requests + 10 * 60 + 100
    assert retries >= 0.1 * requests  # and it does allow what it promised


@pytest.mark.parametrize(("with_budget", "expected"), [(False, 2.97), (True, 1.11)])
def test_amplification_with_and_without_budget(with_budget: bool, expected: float) -> None:
    """3 attempts per request, 99% rejected: load 2.97x without a budget, ~1.11x with."""
    rng = random.Random(7)
    budget = RetryBudgetCore(ratio=0.1, min_per_second=10, window=10.0)
    requests = attempts = 0
    for ms in range(120_000):  # 1000 requests/s for 120 s of virtual time
        now = ms / 1000.0
        requests += 1
        attempts += 1
        budget.record_request(now)
        for _ in range(2):  # up to 2 retries
            if rng.random() >= 0.99:
                break  # accepted
            if with_budget and not budget.try_retry(now):
                break
            attempts += 1
    assert attempts / requests == pytest.approx(expected, abs=0.02)


def test_balance_and_counts() -> None:
    """balance = ratio * requests + reserve - retries over the window."""
    budget = RetryBudgetCore(ratio=0.5, min_per_second=1, window=4.0, buckets=4)
    for _ in range(10):
        budget.record_request(0.0)
    budget.try_retry(0.0)
    assert budget.counts(0.0) == (10, 1)
    assert budget.balance(0.0) == pytest.approx(0.5 * 10 + 4 - 1)
    assert budget.balance(5.0) == pytest.approx(4.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ratio": -0.1, "min_per_second": 1, "window": 1.0},
        {"ratio": 0.1, "min_per_second": -1, "window": 1.0},
        {"ratio": 0.1, "min_per_second": 1, "window": 0.0},
        {"ratio": 0.1, "min_per_second": 1, "window": 1.0, "buckets": 0},
    ],
)
def test_invalid_settings_raise(kwargs: dict[str, float]) -> None:
    """Negative ratio/reserve or an empty window is refused."""
    with pytest.raises(ValueError):
        RetryBudgetCore(**kwargs)  # type: ignore[arg-type]
