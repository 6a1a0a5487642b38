"""Issue 15 item 11: the occ plot tells every strategy apart, budget samples the
failure rate finely by default, and the layers default depth is the one the docs show."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from stormguard.sim import _occ
from stormguard.sim._cli import simulate_command
from stormguard.sim._occ import OccRow
from stormguard.sim._plots import _pyplot, occ_figure

LAYERS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "simulator" / "layers.md"


def occ_rows() -> list[OccRow]:
    """Rows in which full and equal jitter give the very same figures."""
    rows = []
    for strategy in _occ.STRATEGIES:
        calls = 500.0 if strategy in ("full", "equal") else 900.0
        rows += [OccRow(strategy, n, 5, calls + n, 1.0, 100.0, 1.0, 100) for n in (10, 20, 30)]
    return rows


def test_occ_lines_differ_in_style_and_marker() -> None:
    """Every strategy has its own line style and marker, so `full` is not hidden by `equal`."""
    plt = _pyplot()
    figure = occ_figure(plt, occ_rows())
    try:
        for axes in figure.axes:
            lines = {line.get_label(): line for line in axes.get_lines()}
            assert set(lines) == set(_occ.STRATEGIES)
            markers = [str(line.get_marker()) for line in lines.values()]
            assert len(set(markers)) == len(markers)
            assert lines["full"].get_linestyle() != lines["equal"].get_linestyle()
    finally:
        plt.close(figure)


def rates_in(path: Path) -> list[float]:
    """The distinct failure rates of a budget.csv."""
    with path.open() as handle:
        return sorted({float(row["failure_rate"]) for row in csv.DictReader(handle)})


def test_budget_samples_the_failure_rate_finely_by_default(tmp_path: Path) -> None:
    """Without --failure-rates, budget runs 0, 0.05, ..., 1: 21 points, not four."""
    args = ["budget", "--out", str(tmp_path), "--no-progress", "--no-plot"]
    args += ["--clients", "2", "--duration", "2"]
    result = CliRunner().invoke(simulate_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rates = rates_in(tmp_path / "budget.csv")
    assert len(rates) == 21
    assert (rates[0], rates[1], rates[-1]) == (0.0, 0.05, 1.0)


@pytest.mark.parametrize("bad", ["0:2:0.5", "0:1:0", "1:0:0.1", "0:1"])
def test_failure_rate_ranges_are_validated(tmp_path: Path, bad: str) -> None:
    """A range past 1, with a zero step, backwards or incomplete is a usage error."""
    result = CliRunner().invoke(
        simulate_command, ["budget", "--out", str(tmp_path), "--failure-rates", bad]
    )
    assert result.exit_code == 2


def test_layers_default_depth_is_the_documented_depth(tmp_path: Path) -> None:
    """`simulate layers` without --depth runs the depth the docs page's command shows."""
    shown = re.search(r"stormguard simulate layers --depth (\d+)", LAYERS_PAGE.read_text())
    assert shown is not None
    args = ["layers", "--out", str(tmp_path), "--no-progress", "--no-plot", "--attempts", "2"]
    result = CliRunner().invoke(simulate_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with (tmp_path / "layers.csv").open() as handle:
        depths = {int(row["depth"]) for row in csv.DictReader(handle)}
    assert max(depths) == int(shown.group(1)) == 4
