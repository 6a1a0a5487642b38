"""The `hedging` scenario reproduces the tail-at-scale result with the library's
own HedgePolicy, LatencyWindow and RetryBudgetCore: hedging late in the
distribution cuts the 99.9th percentile by an order of magnitude for a few percent
more requests, and the budget bounds the extra load."""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import pytest
from click.testing import CliRunner

from stormguard.sim import _cli, _hedging
from stormguard.sim._cli import simulate_command

SHORT = _hedging.HedgingConfig(rate=200, duration=100)  # 20,000 reads


@pytest.fixture(scope="module")
def rows() -> dict[str, _hedging.HedgingRow]:
    """Every strategy on the short run, by name."""
    result, _ = _hedging.run(SHORT, seed=1)
    return {row.strategy: row for row in result}


def test_hedging_at_p99_cuts_p999_tenfold_for_a_few_percent_more(
    rows: dict[str, _hedging.HedgingRow],
) -> None:
    """Dean & Barroso: p99.9 down by at least 10x, for at most 5 % more requests."""
    none, late = rows["none"], rows["p99"]
    assert late.p999_ms * 10 <= none.p999_ms
    assert 0 < late.extra <= 0.05


def test_hedging_never_hurts_the_median(rows: dict[str, _hedging.HedgingRow]) -> None:
    """Same draws: the median is the same with and without hedging."""
    assert {round(row.p50_ms, 9) for row in rows.values()} == {round(rows["none"].p50_ms, 9)}


def test_the_budget_bounds_the_extra_requests(rows: dict[str, _hedging.HedgingRow]) -> None:
    """Hedging at the median would hedge half the reads: the 10 % budget (plus its
    reserve) caps it, and the tail it could not cover stays."""
    assert rows["p50"].extra <= 0.11
    assert rows["p50"].p999_ms > 10 * rows["p99"].p999_ms


def test_an_empty_budget_hedges_nothing() -> None:
    """ratio 0 and no reserve: no extra request, the latencies of no hedging."""
    empty = _hedging.HedgingConfig(rate=200, duration=20, ratio=0.0, min_per_second=0.0)
    result, samples = _hedging.run(empty, seed=3, strategies=("none", "p95"))
    assert result[1].extra == 0 and samples["p95"] == samples["none"]


def test_the_same_seed_gives_the_same_rows() -> None:
    """Reproducible: two runs with one seed agree exactly."""
    config = _hedging.HedgingConfig(rate=100, duration=10)
    assert _hedging.run(config, seed=5)[0] == _hedging.run(config, seed=5)[0]


def test_the_command_writes_the_table_and_the_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stormguard simulate hedging` writes hedging.csv/json/png; the CSV has a row
    per strategy with the pinned header. (A shorter run than the command's 300 s: the
    files are the same shape; the figures are the docs' and other tests'.)"""
    monkeypatch.setattr(
        _cli._hedging, "HedgingConfig", functools.partial(_hedging.HedgingConfig, duration=30.0)
    )
    args = ["hedging", "--out", str(tmp_path), "--no-progress"]
    result = CliRunner().invoke(simulate_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with (tmp_path / "hedging.csv").open() as file:
        table = list(csv.reader(file))
    assert table[0] == ["strategy", "requests", "extra", "p50_ms", "p99_ms", "p999_ms"]
    assert [row[0] for row in table[1:]] == list(_hedging.STRATEGIES)
    assert (tmp_path / "hedging.png").stat().st_size > 10_000
    assert "p99: +" in result.output
