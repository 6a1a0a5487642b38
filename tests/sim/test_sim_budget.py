"""The budget scenario checked against closed forms for independent failures."""

from __future__ import annotations

import math

import pytest

from stormguard.sim import _budget

CONFIG = _budget.BudgetConfig(rate=10.0, duration=30.0)
CLIENTS = 20  # about 6,000 calls per configuration


def _retry_moments(x: float, retries: int) -> tuple[float, float]:
    """Mean and variance of attempts per call with ``retries`` retries at failure rate x."""
    probs = [x**k * (1 - x) for k in range(retries)] + [x**retries]
    mean = sum((k + 1) * p for k, p in enumerate(probs))
    square = sum((k + 1) ** 2 * p for k, p in enumerate(probs))
    return mean, square - mean * mean


def _row(strategy: str, x: float, clients: int = CLIENTS) -> _budget.BudgetRow:
    (row,) = _budget.run(CONFIG, [clients], [x], seed=2, strategies=[strategy])
    return row


@pytest.mark.parametrize("x", [0.05, 0.2, 0.5, 0.8])
def test_retries_follow_closed_forms(x: float) -> None:
    """N retries at failure rate x: success 1 - x**(N+1), load 1 + x + ... + x**N."""
    row = _row("retries", x)
    success = 1 - x ** (CONFIG.retries + 1)
    load = sum(x**k for k in range(CONFIG.retries + 1))
    _, variance = _retry_moments(x, CONFIG.retries)
    success_sd = math.sqrt(success * (1 - success) / row.calls)
    assert row.success == pytest.approx(success, abs=5 * success_sd + 1e-9)
    assert row.load == pytest.approx(load, abs=5 * math.sqrt(variance / row.calls))


@pytest.mark.parametrize("x", [0.1, 0.5])
def test_no_retries_is_one_attempt(x: float) -> None:
    """Without retries, success is 1 - x and load is exactly 1."""
    row = _row("none", x)
    assert row.load == 1.0
    assert row.success == pytest.approx(1 - x, abs=5 * math.sqrt(x * (1 - x) / row.calls))


def test_budget_at_total_failure_stays_within_ratio_plus_reserve() -> None:
    """At 100 % failure a ratio budget keeps load within 1/(1 - ratio) plus its reserve."""
    row = _row("budget", 1.0)
    calls_per_client = row.calls / CLIENTS
    # The reserve refills every window: min_per_second * window per window spanned,
    # plus one window for the bucket edges.
    windows = CONFIG.duration / CONFIG.window + 1
    reserve = CONFIG.min_per_second * CONFIG.window * windows / calls_per_client
    assert row.success == 0.0
    assert row.load <= 1 / (1 - CONFIG.ratio) + reserve
    assert row.load >= 1 + 0.8 * CONFIG.ratio  # the budget does admit retries


def test_budget_leaves_rare_failures_alone() -> None:
    """At 5 % failure the budget never binds: it behaves like plain retries."""
    x = 0.05
    row = _row("budget", x)
    assert row.success == pytest.approx(1 - x**4, abs=0.002)
    assert row.load == pytest.approx(1 + x + x**2 + x**3, abs=0.02)


def test_breaker_stops_sending_at_total_failure() -> None:
    """A breaker per client sends far less than one attempt per call when all fail."""
    row = _row("breaker", 1.0)
    assert row.success == 0.0
    assert row.load < 0.2


def test_total_rps_spreads_fixed_traffic_over_clients() -> None:
    """With total_rps the number of calls stays the same whatever the fleet size."""
    config = _budget.BudgetConfig(total_rps=200.0, duration=10.0)
    few, many = (
        _budget.run(config, [n], [0.1], seed=1, strategies=["none"])[0].calls for n in (2, 100)
    )
    expected = 200.0 * 10.0
    assert few == pytest.approx(expected, abs=5 * math.sqrt(expected))
    assert many == pytest.approx(expected, abs=5 * math.sqrt(expected))


@pytest.mark.parametrize("clients", [10, 500])
def test_budget_bound_holds_per_client_with_fixed_total_traffic(clients: int) -> None:
    """With total_rps fixed, each client's reserve adds to the bound; the bound holds."""
    config = _budget.BudgetConfig(total_rps=500.0, duration=20.0)
    (row,) = _budget.run(config, [clients], [1.0], seed=3, strategies=["budget"])
    calls_per_client = row.calls / clients
    windows = config.duration / config.window + 1
    reserve = config.min_per_second * config.window * windows / calls_per_client
    assert row.load <= 1 / (1 - config.ratio) + reserve


def test_many_small_clients_let_more_retries_through() -> None:
    """The same traffic split over 50x more clients sends more retries at 100 % failure."""
    config = _budget.BudgetConfig(total_rps=500.0, duration=20.0)
    few, many = (
        _budget.run(config, [n], [1.0], seed=3, strategies=["budget"])[0].load for n in (10, 500)
    )
    # 500 clients of 1 call/s: each reserve (10 per window) covers most of the 3
    # retries its 10 calls per window want; 10 clients of 50 calls/s: ratio rules.
    assert many > few + 0.5
