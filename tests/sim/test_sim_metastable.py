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

from stormguard import RetryQuota, RetryThrottling
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
    token_budget_strategy,
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


@pytest.mark.parametrize("trigger", ["capacity", "load"])
@pytest.mark.parametrize("strategy", ["grpc-a6", "aws-quota"])
def test_client_token_budgets_recover_where_none_stays_stuck(strategy: str, trigger: str) -> None:
    """gRPC A6 throttling and the AWS quota recover from the trigger that leaves none stuck."""
    assert cell("none", trigger, 0.8, 10.0).state == "stuck"
    row = cell(strategy, trigger, 0.8, 10.0)
    assert row.recovered and row.state == "recovered"
    assert 0 < row.recovery_s < CONFIG.tail - CONFIG.settle
    assert 1.0 < row.amplification < 1.1


class SpiedThrottling(RetryThrottling):
    """The library's RetryThrottling, noting the count each retry question saw."""

    def __init__(self) -> None:
        super().__init__(max_tokens=10, token_ratio=0.1)
        self.asked: list[tuple[float, bool]] = []

    def try_retry(self, *, throttled: bool = False) -> bool:
        allowed = super().try_retry(throttled=throttled)
        self.asked.append((self.balance, allowed))
        return allowed


class SpiedQuota(RetryQuota):
    """The library's RetryQuota, noting its balance after every answer."""

    def __init__(self) -> None:
        super().__init__()
        self.balances: list[float] = []
        self.refused = 0

    def try_retry(self, *, throttled: bool = False) -> bool:
        allowed = super().try_retry(throttled=throttled)
        self.refused += not allowed
        return allowed

    def record_outcome(self, **verdict: bool) -> None:
        super().record_outcome(**verdict)
        self.balances.append(self.balance)


@pytest.fixture
def spied() -> Iterator[list[Any]]:
    """Register `spied-a6` and `spied-quota` (the library's objects, watched) for one test."""
    made: list[Any] = []

    def factory(kind: type[Any]) -> _metastable.StrategyFactory:
        def build(config: MetastableConfig) -> _metastable.Strategy:
            made.append(kind())
            return token_budget_strategy(made[-1])

        return build

    register("spied-a6", factory(SpiedThrottling))
    register("spied-quota", factory(SpiedQuota))
    yield made
    del STRATEGIES["spied-a6"], STRATEGIES["spied-quota"]


def test_a6_rule_retries_stop_at_half_the_tokens() -> None:
    """A6: each failure takes a token, a success adds token_ratio; retry only above max/2."""
    budget = RetryThrottling(max_tokens=10, token_ratio=0.1)
    strategy = token_budget_strategy(budget)
    strategy.first(0.0)
    for _ in range(4):
        strategy.client_outcome(0.0, False, False)
    assert budget.balance == 6.0 and strategy.may_retry(0.0) is True
    strategy.client_outcome(0.0, False, True)
    assert budget.balance == 5.0 and strategy.may_retry(0.0) is False
    strategy.client_outcome(0.0, True, False)
    assert budget.balance == pytest.approx(5.1) and strategy.may_retry(0.0) is True
    assert budget.balance == pytest.approx(5.1)  # asking takes nothing


def test_a6_in_the_sweep_never_retries_at_or_below_half(spied: list[Any]) -> None:
    """Through a whole trigger, every retry A6 allowed had more than max/2 tokens."""
    row = run_cell("spied-a6", "capacity", 0.8, 10.0, CONFIG, py_rng(7))
    asked = spied[0].asked
    assert row.recovered and any(allowed for _, allowed in asked)
    assert any(not allowed for _, allowed in asked)
    assert all(allowed == (tokens > 5.0) for tokens, allowed in asked)


def test_quota_drains_and_refills_as_the_sdk_does() -> None:
    """AWS quota: 500 tokens, 14 per retry after a timeout; a first success adds 1, a
    successful retry refunds its 14; the bucket never holds more than 500."""
    quota = RetryQuota()
    strategy = token_budget_strategy(quota)
    retries = 0
    while True:
        strategy.client_outcome(0.0, False, retries > 0)  # failures change nothing
        if not strategy.may_retry(0.0):
            break
        retries += 1
    assert (retries, quota.balance) == (35, 10.0)
    strategy.client_outcome(0.0, True, True)
    assert quota.balance == 24.0
    strategy.client_outcome(0.0, True, False)
    assert quota.balance == 25.0
    for _ in range(600):
        strategy.client_outcome(0.0, True, False)
    assert quota.balance == 500.0


def test_quota_in_the_sweep_drains_then_fills_again(spied: list[Any]) -> None:
    """Under a deep trigger the quota runs dry and refuses; after it, successes refill it."""
    row = run_cell("spied-quota", "capacity", 0.8, 10.0, CONFIG, py_rng(7))
    quota = spied[0]
    assert row.recovered and quota.refused > 0
    assert min(quota.balances) < 14.0 and quota.balances[-1] == 500.0


class Recording(_metastable.Strategy):
    """No protection, noting each client outcome's (ok, retry)."""

    def __init__(self) -> None:
        self.firsts = 0
        self.outcomes: list[tuple[bool, bool]] = []

    def first(self, now: float) -> None:
        self.firsts += 1

    def client_outcome(self, now: float, ok: bool, retry: bool) -> None:
        self.outcomes.append((ok, retry))


def test_every_client_outcome_says_whether_it_was_a_retry() -> None:
    """client_outcome hears every attempt, with retry=True exactly for the retries."""
    made: list[Recording] = []
    register("recording", lambda config: made.append(Recording()) or made[-1])
    try:
        shallow = run_cell("recording", "capacity", 0.2, 5.0, CONFIG, py_rng(7))
        deep = run_cell("recording", "capacity", 0.8, 10.0, CONFIG, py_rng(7))
    finally:
        del STRATEGIES["recording"]
    assert shallow.amplification == 1.0 and all(not retry for _, retry in made[0].outcomes)
    firsts = sum(not retry for _, retry in made[1].outcomes)
    retries = sum(retry for _, retry in made[1].outcomes)
    assert firsts <= made[1].firsts and retries > firsts
    sent = round(deep.amplification * made[1].firsts)
    assert 0.95 * sent <= firsts + retries <= sent  # only the run's last timeout unheard


def test_token_budget_strategy_wants_a_budget_that_records_outcomes() -> None:
    """A plain ratio budget has no outcome hook: refused, naming the argument."""
    with pytest.raises(ConfigError) as raised:
        token_budget_strategy(RetryBudgetCore(ratio=0.1, min_per_second=1.0, window=10.0))
    assert raised.value.field == "budget"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("a6_max_tokens", 0.0),
        ("a6_max_tokens", 1001.0),
        ("a6_token_ratio", 0.0),
        ("quota_capacity", 0.0),
        ("quota_retry_cost", -1.0),
        ("quota_throttling_cost", -1.0),
        ("quota_success_increment", -1.0),
    ],
)
def test_token_budget_settings_errors_name_the_field(field: str, value: float) -> None:
    """An invalid gRPC A6 or AWS quota setting fails naming the config's own field."""
    with pytest.raises(ConfigError) as raised:
        MetastableConfig(**{field: value})
    assert raised.value.field == field and str(raised.value).startswith(f"{field}: ")


def test_cli_default_strategies_include_the_client_budgets(tmp_path: Path) -> None:
    """`--help` lists grpc-a6 and aws-quota by default, and a default run reports them."""
    runner = CliRunner()
    assert "grpc-a6,aws-quota" in runner.invoke(simulate_command, ["--help"]).output
    args = ["metastable", "--out", str(tmp_path), "--no-progress", "--no-plot"]
    args += ["--depths", "0.8", "--durations", "10"]
    result = runner.invoke(simulate_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    for name in _metastable.DEFAULT_STRATEGIES:
        assert f"metastable: {name}: " in result.output
    assert "metastable: grpc-a6: 2 of 2 cells recovered" in result.output
    assert "metastable: aws-quota: 2 of 2 cells recovered" in result.output


PAGE = Path(__file__).resolve().parents[2] / "docs" / "simulator" / "metastable.md"


def test_docs_table_gives_the_client_budgets_default_sweep() -> None:
    """The page's recovered/slow/stuck counts for grpc-a6 and aws-quota are the default grid's."""
    defaults = {p.name: p.default for p in simulate_command.params}
    names = "grpc-a6,aws-quota"
    depths, durations, strategies = _metastable.parse_grid(
        str(defaults["depths"]), str(defaults["durations"]), names
    )
    rows = sweep(
        MetastableConfig(), depths, durations, int(str(defaults["seed"])), strategies=strategies
    )
    text = PAGE.read_text(encoding="utf-8")
    for name in strategies:
        mine = [r for r in rows if r.strategy == name]
        counts = [
            sum(r.state == state for r in mine) for state in ("recovered", "recovering", "stuck")
        ]
        amplification = max(r.amplification for r in mine)
        line = f"| `{name}` | {counts[0]} | {counts[1]} | {counts[2]} | "
        assert line in text, (line, amplification)
        assert f"-- {amplification:.3f} |" in text
