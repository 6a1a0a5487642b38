"""The metastable sweep: which triggers each strategy recovers from, in virtual time."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stormguard._errors import ConfigError
from stormguard.core._budget import RetryBudgetCore
from stormguard.sim import _metastable
from stormguard.sim._cli import simulate_command
from stormguard.sim._engine import py_rng
from stormguard.sim._metastable import (
    STRATEGIES,
    MetastableConfig,
    budget_strategy,
    register,
    run_cell,
    sweep,
)

CONFIG = MetastableConfig(tail=40.0, settle=5.0)


def cell(strategy: str, trigger: str, depth: float, duration: float) -> _metastable.MetastableRow:
    """One cell on a fixed stream."""
    rng = py_rng(7, strategy, trigger, depth, duration)
    return run_cell(strategy, trigger, depth, duration, CONFIG, rng)


@pytest.mark.parametrize("trigger", ["capacity", "load"])
def test_unprotected_retries_stay_stuck_after_a_long_deep_trigger(trigger: str) -> None:
    """No protection: the trigger ends, the retry storm does not (a metastable failure)."""
    row = cell("none", trigger, 0.8, 10.0)
    assert row.state == "stuck" and not row.recovered and math.isinf(row.recovery_s)
    assert row.amplification > 3.0 and row.failed > 0.5


@pytest.mark.parametrize("strategy", ["budget", "admission"])
def test_budget_and_admission_control_recover_from_the_same_trigger(strategy: str) -> None:
    """The cell where retries alone stay stuck recovers, after a finite drain."""
    row = cell(strategy, "capacity", 0.8, 10.0)
    assert row.recovered and row.state == "recovered"
    assert 0 < row.recovery_s < CONFIG.tail - CONFIG.settle


def test_throttling_never_leaves_the_queue_stuck() -> None:
    """SRE throttling drains the queue (slow at worst: its window remembers the outage)."""
    row = cell("sre-throttle", "capacity", 0.8, 10.0)
    assert row.state in ("recovered", "recovering")
    assert row.amplification < cell("none", "capacity", 0.8, 10.0).amplification


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_shallow_trigger_costs_nothing(strategy: str) -> None:
    """Capacity down 20 % for 5 s stays under the load: nothing fails, at once recovered."""
    row = cell(strategy, "capacity", 0.2, 5.0)
    assert (row.recovered, row.recovery_s, row.failed) == (True, 0.0, 0.0)
    assert row.amplification == 1.0


def test_budget_bounds_the_amplification() -> None:
    """Retries under the budget stay within ratio plus reserve of first attempts."""
    row = cell("budget", "load", 0.6, 20.0)
    bound = 1 + CONFIG.budget_ratio + CONFIG.budget_min_per_second / CONFIG.rps
    assert 1.0 < row.amplification <= bound


def test_sweep_is_reproducible() -> None:
    """The same seed gives the same rows, cell by cell."""
    grid: dict[str, Any] = {"depths": [0.6], "durations": [5.0], "strategies": ["none", "budget"]}
    first = sweep(CONFIG, grid["depths"], grid["durations"], 3, strategies=grid["strategies"])
    again = sweep(CONFIG, grid["depths"], grid["durations"], 3, strategies=grid["strategies"])
    assert first == again and len(first) == 4


class TokenBucketBudget:
    """A budget core shaped like RetryBudgetCore with an outcome hook (A6-like):
    tokens fall by 1 on failure, rise by 0.1 on success; retries only above half."""

    def __init__(self) -> None:
        self.tokens = 10.0
        self.outcomes: list[bool] = []

    def record_request(self, now: float) -> None:
        return None

    def try_retry(self, now: float) -> bool:
        return self.tokens > 5.0

    def observe(self, now: float, ok: bool) -> None:
        self.outcomes.append(ok)
        self.tokens = min(10.0, self.tokens + 0.1) if ok else max(0.0, self.tokens - 1.0)


@pytest.fixture
def registered() -> Iterator[list[TokenBucketBudget]]:
    """Register the token-bucket strategy for one test."""
    made: list[TokenBucketBudget] = []

    def factory(config: MetastableConfig) -> _metastable.Strategy:
        core = TokenBucketBudget()
        made.append(core)
        return budget_strategy(core, on_outcome=lambda c, now, ok: c.observe(now, ok))

    register("token-bucket", factory)
    yield made
    del STRATEGIES["token-bucket"]


def test_a_registered_budget_joins_the_sweep(registered: list[TokenBucketBudget]) -> None:
    """register(name, factory) adds a strategy; its outcome hook sees every attempt."""
    rows = sweep(CONFIG, [0.8], [10.0], 1, strategies=["token-bucket"], triggers=["capacity"])
    assert [r.strategy for r in rows] == ["token-bucket"]
    assert len(registered) == 1 and False in registered[0].outcomes
    assert rows[0].state != "stuck"


def test_budget_strategy_counts_first_attempts() -> None:
    """The wrapped RetryBudgetCore sees each call's first attempt and each retry."""
    core = RetryBudgetCore(ratio=0.0, min_per_second=0.0, window=10.0)
    strategy = budget_strategy(core)
    strategy.first(1.0)
    assert core.counts(1.0) == (1, 0) and strategy.may_retry(1.0) is False


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("1.2", "5", "none"), "depths"),
        (("0.5", "0", "none"), "durations"),
        (("0.5", "5", "none,unknown"), "strategies"),
        (("a", "5", "none"), "depths"),
    ],
)
def test_grid_validation(args: tuple[str, str, str], field: str) -> None:
    """Bad comma lists name the option."""
    with pytest.raises(ConfigError) as raised:
        _metastable.parse_grid(*args)
    assert raised.value.field == field


def test_config_and_cell_validation() -> None:
    """Invalid settings, strategies and triggers fail naming the field."""
    with pytest.raises(ConfigError, match="settle"):
        MetastableConfig(tail=5.0, settle=10.0)
    with pytest.raises(ConfigError, match="trigger"):
        run_cell("none", "flood", 0.5, 1.0, CONFIG, py_rng(1))
    with pytest.raises(ConfigError, match="strategy"):
        register("a,b", lambda config: _metastable.Strategy())


def test_cli_writes_csv_json_and_png(tmp_path: Path) -> None:
    """`stormguard simulate metastable` writes its files and a one-line summary each."""
    args = ["metastable", "--out", str(tmp_path), "--no-progress", "--depths", "0.8"]
    args += ["--durations", "10", "--strategies", "none,budget"]
    result = CliRunner().invoke(simulate_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "metastable: none: 0 of 2 cells recovered within 60 s, 0 slow, 2 stuck" in result.output
    with (tmp_path / "metastable.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(_metastable.HEADER)
    assert [(r["strategy"], r["trigger"], r["state"]) for r in rows] == [
        ("none", "capacity", "stuck"),
        ("none", "load", "stuck"),
        ("budget", "capacity", "recovered"),
        ("budget", "load", "recovered"),
    ]
    document = json.loads((tmp_path / "metastable.json").read_text())
    assert document["parameters"]["depths"] == [0.8] and len(document["rows"]) == 4
    assert (tmp_path / "metastable.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_an_unknown_strategy(tmp_path: Path) -> None:
    """An unknown strategy name is a usage error naming the option."""
    args = ["metastable", "--out", str(tmp_path), "--strategies", "hope", "--no-plot"]
    result = CliRunner().invoke(simulate_command, args)
    assert result.exit_code == 2 and "strategies" in result.output
