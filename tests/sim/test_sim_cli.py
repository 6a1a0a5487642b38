"""`stormguard simulate`: files, exact CSV headers, reproducibility, missing extras."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from stormguard._errors import MissingExtra
from stormguard.sim._cli import simulate_command

SMALL = {
    "occ": ["--clients", "5,10", "--runs", "5", "--jobs", "1"],
    "storm": ["--duration", "3", "--rps", "200", "--outage", "1"],
    "budget": ["--clients", "3", "--duration", "5", "--failure-rates", "0.1,0.5"],
    "layers": ["--depth", "2", "--attempts", "3"],
}

HEADERS = {
    "occ.csv": "strategy,clients,runs,calls_mean,calls_sd,time_mean,time_sd",
    "storm.csv": "strategy,server,peak_rps,amplification,failed,recovery_s",
    "storm_timeline.csv": "strategy,server,second,requests,attempts,successes,failures",
    "budget.csv": "strategy,clients,failure_rate,success,load",
    "layers.csv": "policy,depth,attempts,load",
}


def _simulate(scenario: str, out: Path, *extra: str) -> str:
    args = [scenario, "--out", str(out), "--no-progress", *SMALL[scenario], *extra]
    result = CliRunner().invoke(simulate_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("scenario", sorted(SMALL))
def test_scenario_writes_csv_json_and_png(scenario: str, tmp_path: Path) -> None:
    """Each scenario writes its CSV files with the exact headers, JSON rows and a PNG."""
    _simulate(scenario, tmp_path)
    csvs = sorted(p.name for p in tmp_path.glob("*.csv"))
    assert csvs and all(name in HEADERS for name in csvs)
    for name in csvs:
        lines = (tmp_path / name).read_text().splitlines()
        assert lines[0] == HEADERS[name]
        assert len(lines) > 1
    document = json.loads((tmp_path / f"{scenario}.json").read_text())
    assert document["scenario"] == scenario
    with (tmp_path / f"{scenario}.csv").open() as handle:
        assert len(document["rows"]) == len(list(csv.DictReader(handle)))
    png = tmp_path / f"{scenario}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("scenario", ["occ", "storm", "budget"])
def test_same_seed_same_files(scenario: str, tmp_path: Path) -> None:
    """The same --seed gives byte-identical CSV and JSON; another seed does not."""
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        _simulate(scenario, tmp_path / name, "--seed", seed, "--no-plot")
    for suffix in ("csv", "json"):
        a, b, c = ((tmp_path / d / f"{scenario}.{suffix}").read_bytes() for d in ("a", "b", "c"))
        assert a == b
        assert a != c


def test_occ_reports_events_per_second(tmp_path: Path) -> None:
    """The occ run prints its size, wall time and events per second."""
    output = _simulate("occ", tmp_path, "--no-plot")
    assert "events/s" in output
    assert "10 configurations x 5 runs" in output


def test_bad_list_is_a_usage_error(tmp_path: Path) -> None:
    """A malformed --failure-rates list is refused with a usage error, not a traceback."""
    result = CliRunner().invoke(
        simulate_command, ["budget", "--out", str(tmp_path), "--failure-rates", "0.1,lots"]
    )
    assert result.exit_code == 2
    assert "comma-separated" in result.output


def test_missing_numpy_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without numpy the simulator raises MissingExtra naming stormguard[sim]."""
    from stormguard.sim import _engine

    monkeypatch.setitem(sys.modules, "numpy", None)
    with pytest.raises(MissingExtra, match=r"stormguard\[sim\]"):
        _engine.numpy()


def test_stormguard_cli_loads_simulate() -> None:
    """`stormguard simulate --help` is reachable through the main command."""
    from stormguard.cli import _build

    result = CliRunner().invoke(_build(), ["simulate", "--help"])
    assert result.exit_code == 0
    assert "occ" in result.output and "--seed" in result.output


def test_impossible_layers_run_is_a_usage_error(tmp_path: Path) -> None:
    """A layers run past the work limit ends with a usage error naming the cause."""
    result = CliRunner().invoke(
        simulate_command, ["layers", "--out", str(tmp_path), "--depth", "8", "--attempts", "10"]
    )
    assert result.exit_code == 2
    assert "calls per request" in result.output
