"""Seams of the protection layer: no import cycle, one ring window, core's error convention."""

from __future__ import annotations

import ast
import asyncio
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import stormguard.protection
from stormguard import BulkheadFull, ConfigError
from stormguard.core._breaker import BreakerConfig
from stormguard.core._budget import RetryBudgetCore
from stormguard.core._pacer import PacerCore
from stormguard.core._window import RingWindow
from stormguard.protection import Bulkhead
from stormguard.testing import FakeClock

PROTECTION = Path(stormguard.protection.__file__).parent
LUA = resources.files("stormguard.stores").joinpath("lua")


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def test_permit_does_not_import_the_breaker() -> None:
    """A permit is a value that reports back through functions: _permit.py never imports
    _breaker.py (not even for typing), so the two modules have no cycle."""
    assert "._breaker" not in _imported_modules(PROTECTION / "_permit.py")


def test_permit_reports_back_without_the_breaker() -> None:
    """A Permit built from an admission and two report functions reports once."""
    from stormguard.core._breaker import Admission
    from stormguard.protection import Permit

    seen: list[str] = []

    async def areport(permit: Permit, outcome: str) -> None:
        seen.append("a" + outcome)

    permit = Permit(Admission(True, False, 0), 0.0, (lambda p, o: seen.append(o), areport))
    permit.record(failure=True)
    permit.record(failure=False)
    permit.release()
    assert seen == ["fail"]


def test_ring_window_written_once_in_lua() -> None:
    """The bucket roll of the time window lives in one Lua helper used by breaker and budget."""
    rolls = {
        path.name
        for path in LUA.iterdir()
        if path.name.endswith(".lua") and "math.floor(now * n / window)" in path.read_text("utf-8")
    }
    assert rolls == {"_helpers.lua"}
    for name in ("breaker_record.lua", "budget.lua"):
        text = LUA.joinpath(name).read_text("utf-8")
        assert text.startswith("--#include _helpers") and "ring_roll(" in text


def test_script_source_puts_helpers_first() -> None:
    """A script's --#include lines bring the helper source in front of it."""
    from stormguard.stores._scripts import script_source

    source = script_source(LUA, "budget")
    assert source.index("local function ring_roll") < source.index("local H = KEYS[1]")
    assert script_source(LUA, "breaker_reset").startswith("-- Circuit breaker: RESET")


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: RetryBudgetCore(ratio=-1.0, min_per_second=1.0, window=1.0), "ratio"),
        (lambda: RetryBudgetCore(ratio=0.1, min_per_second="x", window=1.0), "min_per_second"),
        (lambda: RetryBudgetCore(ratio=0.1, min_per_second=1.0, window=1.0, buckets=0), "buckets"),
        (lambda: PacerCore(threshold=2.0), "threshold"),
        (lambda: PacerCore(max_wait=-1.0), "max_wait"),
        (lambda: BreakerConfig(min_calls=0), "min_calls"),
        (lambda: BreakerConfig(open_for="5"), "open_for"),
        (lambda: BreakerConfig(half_open_probes=1.5), "half_open_probes"),
    ],
)
def test_core_configuration_errors_are_config_errors(make: object, field: str) -> None:
    """Invalid breaker, budget and pacer core settings raise ConfigError naming the field."""
    with pytest.raises(ConfigError) as info:
        make()  # type: ignore[operator]
    assert info.value.field == field


def test_ring_window_ages_out_and_counts() -> None:
    """Counts land in the newest bucket and leave the totals once the window passes them."""
    ring = RingWindow(10.0, 10)
    ring.add(0.5, 1, 0)
    ring.add(3.5, 2, 1)
    assert (ring.a_total, ring.b_total) == (3, 1)
    ring.roll(10.7)  # bucket 0 (t in [0, 1)) has left the window
    assert (ring.a_total, ring.b_total) == (2, 1)
    ring.add(2.0, 1, 1)  # the clock went backwards: counted in the newest bucket
    assert ring.a[ring.j] == 1 and ring.a_total == 3
    ring.roll(100.0)
    assert (ring.a_total, ring.b_total) == (0, 0)


def test_bulkhead_waits_on_the_injected_clock(clock: FakeClock, eventually: Any) -> None:
    """A waiter gives up when the injected clock passes its max_wait; waited is on that clock."""
    bulkhead = Bulkhead(1, max_wait=5.0, clock=clock)
    bulkhead.acquire()
    outcome: list[BaseException] = []

    def waiter() -> None:
        try:
            bulkhead.acquire()
        except BulkheadFull as exc:
            outcome.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    eventually(lambda: bulkhead.waiting == 1)
    assert thread.is_alive() and not outcome
    clock.advance(6.0)
    thread.join(10.0)
    assert len(outcome) == 1 and isinstance(outcome[0], BulkheadFull)
    assert outcome[0].waited == 6.0  # type: ignore[attr-defined]
    assert bulkhead.in_flight == 1


async def test_async_bulkhead_waits_on_the_injected_clock(clock: FakeClock) -> None:
    """aacquire gives up when the injected clock passes max_wait."""
    bulkhead = Bulkhead(1, max_wait=2.0, clock=clock)
    await bulkhead.aacquire()
    task = asyncio.ensure_future(bulkhead.aacquire())
    await asyncio.sleep(0)  # the task runs until it waits for a slot
    assert bulkhead.waiting == 1 and not task.done()
    clock.advance(3.0)
    with pytest.raises(BulkheadFull) as info:
        await asyncio.wait_for(task, 10.0)
    assert info.value.waited == 3.0
