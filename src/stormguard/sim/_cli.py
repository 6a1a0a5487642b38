# `stormguard simulate SCENARIO --out DIR`: flags -> scenario config -> run() ->
# CSV, JSON and PNG files in DIR. Loaded lazily by stormguard/cli.py.
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TypeVar

from .._errors import ConfigError, MissingExtra

try:
    import click
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingExtra("click", "sim") from exc

from . import _budget, _layers, _occ, _output, _storm
from ._engine import numpy, progress

__all__ = ["simulate_command"]

_T = TypeVar("_T")

_OCC_CLIENTS = "10,20,30,40,50,60,70,80,90,100,110,120,130,140,150,160,170,180,190"


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"{name}: expected integers >= 1, got {text!r}")
    return values


def _floats(text: str, name: str) -> list[float]:
    # A comma list ("0.05,0.1,0.5") or an inclusive range START:STOP:STEP ("0:1:0.05").
    try:
        if ":" in text:
            start, stop, step = (float(part) for part in text.split(":"))
            if not step > 0 or stop < start or (stop - start) / step > 10_000:
                raise ValueError(text)
            count = round((stop - start) / step)
            values = [round(start + i * step, 10) for i in range(count + 1)]
        else:
            values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated numbers or START:STOP:STEP, got {text!r}"
        ) from None
    if not values or min(values) < 0 or max(values) > 1:
        raise click.BadParameter(f"{name}: expected rates in [0, 1], got {text!r}")
    return values


def _say(message: str) -> None:
    click.echo(message)


def run_occ(
    out: Path,
    clients: list[int],
    runs: int,
    seed: int,
    *,
    jobs: int | None,
    plot: bool,
    show_progress: bool | None,
) -> list[Path]:
    """The occ sweep: occ.csv, occ.json and occ.png."""
    numpy()  # fail early, naming the extra
    started = time.perf_counter()
    with progress("occ", 1.0, enabled=show_progress) as tick:
        rows = _occ.sweep(_occ.STRATEGIES, clients, runs, seed, jobs=jobs, tick=tick)
    elapsed = time.perf_counter() - started
    table = [
        (r.strategy, r.clients, r.runs, r.calls_mean, r.calls_sd, r.time_mean, r.time_sd)
        for r in rows
    ]
    writes = sum(r.writes for r in rows)
    events = writes * _occ.EVENTS_PER_CALL
    _say(
        f"occ: {len(rows)} configurations x {runs} runs, {writes:,} writes "
        f"({events:,} message events) in {elapsed:.2f} s = {events / elapsed:,.0f} events/s"
    )
    parameters = {
        "clients": clients,
        "runs": runs,
        "seed": seed,
        "base": _occ.BASE,
        "cap": _occ.CAP,
    }
    paths = [
        _output.write_csv(out / "occ.csv", _output.OCC_HEADER, table),
        _output.write_json(
            out / "occ.json", "occ", parameters, {"rows": (_output.OCC_HEADER, table)}
        ),
    ]
    if plot:
        from ._plots import plot_occ

        paths.append(plot_occ(rows, out / "occ.png"))
    return paths


def run_storm(
    out: Path, config: _storm.StormConfig, seed: int, *, plot: bool, show_progress: bool | None
) -> list[Path]:
    """The storm scenario: storm.csv, storm_timeline.csv, storm.json and storm.png."""
    with progress("storm", len(_storm.STRATEGIES), enabled=show_progress) as tick:
        results = _storm.run(config, seed, tick=tick)
    table = [
        (r.strategy, r.server, r.peak_rps, r.amplification, r.failed, r.recovery_s) for r in results
    ]
    timeline = [
        (r.strategy, r.server, second, *counts)
        for r in results
        for second, counts in enumerate(r.timeline)
    ]
    for row in table:
        _say(
            "storm: "
            + ", ".join(
                f"{k}={_output.format_cell(v)}"
                for k, v in zip(_output.STORM_HEADER, row, strict=True)
            )
        )
    paths = [
        _output.write_csv(out / "storm.csv", _output.STORM_HEADER, table),
        _output.write_csv(out / "storm_timeline.csv", _output.TIMELINE_HEADER, timeline),
        _output.write_json(
            out / "storm.json",
            "storm",
            {**asdict(config), "seed": seed},
            {
                "rows": (_output.STORM_HEADER, table),
                "timeline": (_output.TIMELINE_HEADER, timeline),
            },
        ),
    ]
    if plot:
        from ._plots import plot_storm

        paths.append(plot_storm(results, config, out / "storm.png"))
    return paths


def run_budget(
    out: Path,
    config: _budget.BudgetConfig,
    clients: list[int],
    failure_rates: list[float],
    seed: int,
    *,
    plot: bool,
    show_progress: bool | None,
) -> list[Path]:
    """The budget scenario: budget.csv, budget.json and budget.png."""
    total = len(_budget.STRATEGIES) * len(clients) * len(failure_rates)
    with progress("budget", total, enabled=show_progress) as tick:
        rows = _budget.run(config, clients, failure_rates, seed, tick=tick)
    table = [(r.strategy, r.clients, r.failure_rate, r.success, r.load) for r in rows]
    parameters = {
        **asdict(config),
        "clients": clients,
        "failure_rates": failure_rates,
        "seed": seed,
    }
    paths = [
        _output.write_csv(out / "budget.csv", _output.BUDGET_HEADER, table),
        _output.write_json(
            out / "budget.json", "budget", parameters, {"rows": (_output.BUDGET_HEADER, table)}
        ),
    ]
    if plot:
        from ._plots import plot_budget

        paths.append(plot_budget(rows, out / "budget.png"))
    return paths


def run_layers(
    out: Path,
    config: _layers.LayersConfig,
    depth: int,
    attempts: int,
    *,
    plot: bool,
    show_progress: bool | None,
) -> list[Path]:
    """The layers scenario: layers.csv, layers.json and layers.png."""
    with progress("layers", len(_layers.POLICIES) * depth, enabled=show_progress) as tick:
        rows = _layers.run(config, depth, attempts, tick=tick)
    table = [(r.policy, r.depth, r.attempts, r.load) for r in rows]
    parameters = {**asdict(config), "depth": depth, "attempts": attempts}
    paths = [
        _output.write_csv(out / "layers.csv", _output.LAYERS_HEADER, table),
        _output.write_json(
            out / "layers.json", "layers", parameters, {"rows": (_output.LAYERS_HEADER, table)}
        ),
    ]
    if plot:
        from ._plots import plot_layers

        paths.append(plot_layers(rows, out / "layers.png"))
    return paths


def _checked(call: Callable[[], _T]) -> _T:
    try:
        return call()
    except MissingExtra as exc:
        raise click.ClickException(str(exc)) from exc
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc


@click.command(name="simulate")
@click.argument("scenario", type=click.Choice(["occ", "storm", "budget", "layers"]))
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("sim-out"),
    show_default=True,
    help="Directory for CSV/JSON/PNG.",
)
@click.option("--seed", type=int, default=1, show_default=True, help="Same seed, same files.")
@click.option(
    "--clients", default=None, help="occ: comma list [10,20,...,190]; budget: comma list [100]."
)
@click.option(
    "--runs",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="occ: runs per configuration.",
)
@click.option(
    "--jobs", type=click.IntRange(min=1), default=None, help="occ: worker processes [all cores]."
)
@click.option(
    "--rps",
    type=click.FloatRange(min=0, min_open=True),
    default=1000.0,
    show_default=True,
    help="storm: first attempts per second.",
)
@click.option(
    "--outage",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="storm: seconds the server fails everything.",
)
@click.option(
    "--outage-start",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="storm: second at which the outage starts.",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="storm: retries per request.",
)
@click.option(
    "--server",
    type=click.Choice(list(_storm.SERVERS)),
    default="outage",
    show_default=True,
    help="storm: server model.",
)
@click.option(
    "--capacity",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="storm: server capacity in attempts/s [1.5 x rps].",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="storm, budget: seconds of traffic.",
)
@click.option(
    "--failure-rates",
    default="0:1:0.05",
    show_default=True,
    help="budget: failure probabilities per attempt: a comma list or START:STOP:STEP.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="budget: calls per second per client.",
)
@click.option(
    "--total-rps",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="budget: fixed total calls/s shared by the clients (overrides --rate).",
)
@click.option(
    "--depth",
    type=click.IntRange(min=1, max=8),
    default=4,
    show_default=True,
    help="layers: number of retrying layers.",
)
@click.option(
    "--attempts",
    type=click.IntRange(min=1, max=10),
    default=4,
    show_default=True,
    help="layers: attempts per layer.",
)
@click.option("--plot/--no-plot", default=True, show_default=True, help="Draw PNG plots.")
@click.option(
    "--progress/--no-progress", "show_progress", default=None, help="Progress bar [on a terminal]."
)
def simulate_command(
    scenario: str,
    out: Path,
    seed: int,
    clients: str | None,
    runs: int,
    jobs: int | None,
    rps: float,
    outage: float,
    outage_start: float,
    retries: int,
    server: str,
    capacity: float | None,
    duration: float,
    failure_rates: str,
    rate: float,
    total_rps: float | None,
    depth: int,
    attempts: int,
    plot: bool,
    show_progress: bool | None,
) -> None:
    """Simulate a retry policy across a fleet in virtual time.

    \b
    occ     AWS "Exponential Backoff And Jitter" contention: 5 backoffs x clients
    storm   an outage under steady load: immediate, exponential, full, full+budget
    budget  independent failures: none, retries, budget, breaker per client
    layers  retries nested over --depth layers above a failing bottom
    """
    if scenario == "occ":
        occ_clients = _ints(clients or _OCC_CLIENTS, "--clients")
        paths = _checked(
            lambda: run_occ(
                out, occ_clients, runs, seed, jobs=jobs, plot=plot, show_progress=show_progress
            )
        )
    elif scenario == "storm":
        storm = _checked(
            lambda: _storm.StormConfig(
                rps=rps,
                outage=outage,
                outage_start=outage_start,
                retries=retries,
                server=server,
                capacity=capacity,
                duration=duration,
            )
        )
        paths = _checked(
            lambda: run_storm(out, storm, seed, plot=plot, show_progress=show_progress)
        )
    elif scenario == "budget":
        fleet = _ints(clients or "100", "--clients")
        rates = _floats(failure_rates, "--failure-rates")
        budget = _checked(
            lambda: _budget.BudgetConfig(rate=rate, total_rps=total_rps, duration=duration)
        )
        paths = _checked(
            lambda: run_budget(
                out, budget, fleet, rates, seed, plot=plot, show_progress=show_progress
            )
        )
    else:
        paths = _checked(
            lambda: run_layers(
                out, _layers.LayersConfig(), depth, attempts, plot=plot, show_progress=show_progress
            )
        )
    for path in paths:
        _say(f"wrote {path}")
