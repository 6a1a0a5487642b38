"""The one outage-aware store call (stores/_fallback.py) and the objects built on it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from stormguard import ConfigError, StoreError
from stormguard.protection import CircuitBreaker, Cooldown, RetryBudget
from stormguard.stores._fallback import StoreHealth, acall_all, call_all
from stormguard.testing import FakeClock


def _down() -> int:
    raise StoreError("redis: ConnectionError: refused")


def _local() -> int:
    return -1


class ScriptOnlyStore:
    """A store that has nothing but the script interface (no raw client)."""

    def __init__(self, replies: dict[str, Any] | None = None) -> None:
        self.calls: list[tuple[str, list[str], list[Any]]] = []
        self.replies = replies or {}
        self.down = False

    def key(self, *parts: str) -> str:
        return "t:{" + ":".join(parts) + "}"

    def run_script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self.down:
            raise StoreError("redis: ConnectionError: down")
        self.calls.append((name, list(keys), list(args)))
        return self.replies.get(name, "0")


def test_outage_logged_once_and_recovery_logged(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Many failing calls make one outage and one log line; the first success logs the return."""
    health = StoreHealth("thing 'x'", clock=clock, retry_after=1.0)
    with caplog.at_level(logging.WARNING, logger="stormguard"):
        answers = [health.call(_down, _local) for _ in range(5)]
        clock.advance(1.0)
        assert health.call(lambda: 7, _local) == 7
    assert answers == [-1] * 5
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "unreachable" in lines[0] and "is back" in lines[1]
    stats = health.stats
    assert (stats.outages, stats.store_errors, stats.fallback_decisions) == (1, 1, 5)
    assert not stats.degraded


def test_degraded_record_probes_once_per_interval(clock: FakeClock) -> None:
    """While degraded, the store is asked at most once per retry_after; others decide locally."""
    health = StoreHealth("x", clock=clock, retry_after=2.0)
    asked: list[int] = []

    def ask() -> int:
        asked.append(1)
        raise StoreError("down")

    for _ in range(10):
        health.call(ask, _local)
    clock.advance(2.0)
    for _ in range(10):
        health.call(ask, _local)
    assert len(asked) == 2
    assert health.stats.outages == 1


def test_concurrent_failures_count_one_outage(clock: FakeClock) -> None:
    """Threads failing at once still count one outage (the record is locked)."""
    health = StoreHealth("x", clock=clock, retry_after=60.0)
    start = threading.Barrier(16)

    def worker() -> None:
        start.wait()
        for _ in range(200):
            health.call(_down, _local)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = health.stats
    assert stats.outages == 1
    assert stats.fallback_decisions == 16 * 200


def test_grouped_call_counts_for_each_object(clock: FakeClock) -> None:
    """One store call for three objects: each record sees the outage and the fallback."""
    healths = [StoreHealth(f"limiter {i}", clock=clock) for i in range(3)]
    for _ in range(2):  # two outages
        assert call_all(healths, _down, _local) == -1
        clock.advance(1.0)
        assert call_all(healths, lambda: 1, _local) == 1
    assert [h.stats.outages for h in healths] == [2, 2, 2]
    assert [h.stats.fallback_decisions for h in healths] == [2, 2, 2]


async def test_async_call_and_grouped_twin(clock: FakeClock) -> None:
    """acall/acall_all await the store and fall back the same way."""
    health = StoreHealth("x", clock=clock)

    async def down() -> int:
        raise StoreError("down")

    async def up() -> int:
        return 3

    assert await health.acall(down, _local) == -1
    assert health.degraded
    clock.advance(1.0)
    assert await acall_all([health], up, _local) == 3
    assert not health.degraded


def test_require_raises_and_counts(clock: FakeClock) -> None:
    """require() asks even while degraded and lets the StoreError through, counted."""
    health = StoreHealth("x", clock=clock)
    with pytest.raises(StoreError):
        health.require(_down)
    with pytest.raises(StoreError):
        health.require(_down)
    assert health.stats.store_errors == 2
    assert health.require(lambda: 5) == 5
    assert not health.degraded


@pytest.mark.parametrize("retry_after", [0, -1.0, float("inf"), True])
def test_bad_retry_interval_is_a_config_error(retry_after: float) -> None:
    """store_retry must be a positive finite number of seconds."""
    with pytest.raises(ConfigError, match="store_retry"):
        StoreHealth("x", retry_after=retry_after)


def test_each_object_has_its_own_outage_record(clock: FakeClock) -> None:
    """A breaker and a budget on one store report their own outages."""
    store = ScriptOnlyStore()
    breaker = CircuitBreaker(store=store, name="b", clock=clock)
    budget = RetryBudget(store=store, name="b", clock=clock)
    store.down = True
    budget.record_request()
    budget.record_request()
    assert budget.stats.outages == 1 and budget.stats.fallback_decisions == 2
    assert breaker.stats.outages == 0 and not breaker.degraded


def test_cooldown_runs_a_script_not_raw_commands(clock: FakeClock) -> None:
    """A shared Cooldown needs only run_script: one 'cooldown' script per pause and read."""
    store = ScriptOnlyStore({"cooldown": "12.5"})
    cooldown = Cooldown(store=store, clock=clock)
    cooldown.pause("https://a", 10.0)
    assert cooldown.remaining("https://a") == 12.5
    assert [(name, args[0]) for name, _, args in store.calls] == [
        ("cooldown", "pause"),
        ("cooldown", "remaining"),
    ]
    assert not cooldown.degraded and cooldown.stats.store_errors == 0


def test_cooldown_outage_falls_back_to_local_pauses(clock: FakeClock) -> None:
    """With the store down the local pause decides; the outage is counted once."""
    store = ScriptOnlyStore()
    store.down = True
    cooldown = Cooldown(store=store, clock=clock)
    cooldown.pause("o", 4.0)
    assert cooldown.remaining("o") == 4.0
    assert cooldown.degraded and cooldown.stats.outages == 1
