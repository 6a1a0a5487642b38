"""RetryBudget in one process: the reserve, the ratio, amplification and thread safety."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
from protection_support import run_threads

from stormguard import ConfigError
from stormguard.protection import RetryBudget
from stormguard.testing import FakeClock


@pytest.mark.parametrize(("use_budget", "expected"), [(False, 2.97), (True, 1.11)])
def test_amplification_falls_from_2_97_to_1_11(
    use_budget: bool, expected: float, clock: FakeClock
) -> None:
    """3 attempts per request, 99 % rejected: load 2.97x without the budget, ~1.11x with it."""
    budget = RetryBudget(ratio=0.1, min_per_second=10, window=10.0, clock=clock)
    draw = random.Random(11).random
    requests = attempts = 0
    for _ in range(60_000):  # 1000 requests/s for 60 s of virtual time
        clock.advance(0.001)
        requests += 1
        attempts += 1
        budget.record_request()
        for _retry in range(2):
            if draw() >= 0.99:
                break
            if use_budget and not budget.try_retry():
                break
            attempts += 1
    assert attempts / requests == pytest.approx(expected, abs=0.02)


def test_threads_share_one_budget_exactly(clock: FakeClock) -> None:
    """32 threads withdrawing at once get exactly the balance between them."""
    budget = RetryBudget(ratio=0.5, min_per_second=0, window=10.0, clock=clock)
    for _ in range(2000):
        budget.record_request()
    granted = []
    lock = threading.Lock()

    def worker(_: int) -> None:
        mine = sum(budget.try_retry() for _ in range(100))
        with lock:
            granted.append(mine)

    run_threads(worker, 32)
    assert sum(granted) == 1000


async def test_tasks_share_one_budget(clock: FakeClock) -> None:
    """1,000 tasks draw on one budget: exactly the balance is granted."""
    budget = RetryBudget(ratio=0.0, min_per_second=10, window=10.0, clock=clock)

    async def one() -> bool:
        await asyncio.sleep(0)
        return await budget.atry_retry()

    results = await asyncio.gather(*(one() for _ in range(1000)))
    assert sum(results) == 100


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("ratio", {"ratio": -1.0}),
        ("min_per_second", {"min_per_second": -1}),
        ("window", {"window": 0.0}),
        ("name", {"store": object()}),
    ],
)
def test_invalid_settings(field: str, kwargs: dict[str, object]) -> None:
    """Bad settings raise ConfigError naming the field."""
    with pytest.raises(ConfigError, match=field):
        RetryBudget(**kwargs)  # type: ignore[arg-type]
