# `stormguard simulate SCENARIO --out DIR`: flags -> scenario config -> run() ->
# CSV, JSON and PNG files in DIR. Loaded lazily by stormguard/cli.py.
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal, TypeVar

from .._errors import ConfigError, MissingExtra

try:
    import click
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingExtra("click", "sim") from exc

from . import _budget, _hedging, _layers, _metastable, _occ, _output, _storm
from ._engine import numpy, progress

__all__ = ["simulate_command"]

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])

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


_Tables = Mapping[str, tuple[Sequence[str], Sequence[Sequence[object]]]]


def _written(
    out: Path,
    scenario: str,
    parameters: Mapping[str, Any],
    tables: _Tables,
    draw: Callable[[Path], Path] | Literal[False],
) -> list[Path]:
    # SCENARIO.csv holds the "rows" table, SCENARIO_NAME.csv each other table, SCENARIO.json
    # all of them with the parameters, SCENARIO.png the plot (when `draw` is given).
    paths = [_output.write_csv(out / f"{scenario}.csv", *tables["rows"])]
    paths += [
        _output.write_csv(out / f"{scenario}_{name}.csv", *table)
        for name, table in tables.items()
        if name != "rows"
    ]
    paths.append(_output.write_json(out / f"{scenario}.json", scenario, parameters, tables))
    if draw:
        paths.append(draw(out / f"{scenario}.png"))
    return paths


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

    def draw(path: Path) -> Path:
        from ._plots import plot_occ

        return plot_occ(rows, path)

    return _written(out, "occ", parameters, {"rows": (_output.OCC_HEADER, table)}, plot and draw)


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

    def draw(path: Path) -> Path:
        from ._plots import plot_storm

        return plot_storm(results, config, path)

    tables: _Tables = {
        "rows": (_output.STORM_HEADER, table),
        "timeline": (_output.TIMELINE_HEADER, timeline),
    }
    return _written(out, "storm", {**asdict(config), "seed": seed}, tables, plot and draw)


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

    def draw(path: Path) -> Path:
        from ._plots import plot_budget

        return plot_budget(rows, path)

    tables = {"rows": (_output.BUDGET_HEADER, table)}
    return _written(out, "budget", parameters, tables, plot and draw)


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

    def draw(path: Path) -> Path:
        from ._plots import plot_layers

        return plot_layers(rows, path)

    tables = {"rows": (_output.LAYERS_HEADER, table)}
    return _written(out, "layers", parameters, tables, plot and draw)


def run_metastable(
    out: Path,
    config: _metastable.MetastableConfig,
    depths: list[float],
    durations: list[float],
    strategies: list[str],
    seed: int,
    *,
    plot: bool,
    show_progress: bool | None,
) -> list[Path]:
    """The metastable sweep: metastable.csv, metastable.json and metastable.png."""
    total = len(strategies) * len(_metastable.TRIGGERS) * len(depths) * len(durations)
    with progress("metastable", total, enabled=show_progress) as tick:
        rows = _metastable.sweep(config, depths, durations, seed, strategies=strategies, tick=tick)
    table = [tuple(getattr(r, name) for name in _metastable.HEADER) for r in rows]
    for strategy in strategies:
        mine = [r for r in rows if r.strategy == strategy]
        stuck = sum(r.state == "stuck" for r in mine)
        slow = sum(r.state == "recovering" for r in mine)
        _say(
            f"metastable: {strategy}: {len(mine) - stuck - slow} of {len(mine)} cells recovered"
            f" within {config.tail:g} s, {slow} slow, {stuck} stuck"
        )
    parameters = {**asdict(config), "depths": depths, "durations": durations, "seed": seed}

    def draw(path: Path) -> Path:
        from ._metastable_plot import plot_metastable

        return plot_metastable(rows, config, path)

    tables = {"rows": (_metastable.HEADER, table)}
    return _written(out, "metastable", parameters, tables, plot and draw)


def run_hedging(
    out: Path, config: _hedging.HedgingConfig, seed: int, *, plot: bool, show_progress: bool | None
) -> list[Path]:
    """The hedging scenario: hedging.csv, hedging.json and hedging.png."""
    with progress("hedging", len(_hedging.STRATEGIES), enabled=show_progress) as tick:
        rows, samples = _hedging.run(config, seed, tick=tick)
    table = [(r.strategy, r.requests, r.extra, r.p50_ms, r.p99_ms, r.p999_ms) for r in rows]
    for r in rows:
        _say(
            f"hedging: {r.strategy}: +{r.extra:.1%} requests, "
            f"p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, p99.9 {r.p999_ms:.1f} ms"
        )

    def draw(path: Path) -> Path:
        from ._plots_hedging import plot_hedging

        return plot_hedging(rows, samples, path)

    tables = {"rows": (_output.HEDGING_HEADER, table)}
    return _written(out, "hedging", {**asdict(config), "seed": seed}, tables, plot and draw)


_POSITIVE = click.FloatRange(min=0, min_open=True)
_NON_NEGATIVE = click.FloatRange(min=0)


def _option(flag: str, kind: Any, default: object, help: str) -> Callable[[_F], _F]:
    """One scenario flag; its default is shown in ``--help`` unless it is None (computed)."""
    return click.option(
        flag, type=kind, default=default, show_default=default is not None, help=help
    )


def _checked(call: Callable[[], _T]) -> _T:
    try:
        return call()
    except MissingExtra as exc:
        raise click.ClickException(str(exc)) from exc
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc


@click.command(name="simulate")
@click.argument(
    "scenario",
    type=click.Choice(["occ", "storm", "budget", "layers", "metastable", "hedging"]),
)
@_option(
    "--out",
    click.Path(file_okay=False, path_type=Path),
    Path("sim-out"),
    "Directory for CSV/JSON/PNG.",
)
@_option("--seed", int, 1, "Same seed, same files.")
@_option("--clients", None, None, "occ: comma list [10,20,...,190]; budget: comma list [100].")
@_option("--runs", click.IntRange(min=1), 100, "occ: runs per configuration.")
@_option("--jobs", click.IntRange(min=1), None, "occ: worker processes [all cores].")
@_option("--rps", _POSITIVE, 1000.0, "storm: first attempts per second.")
@_option("--outage", _NON_NEGATIVE, 5.0, "storm: seconds the server fails everything.")
@_option("--outage-start", _NON_NEGATIVE, 5.0, "storm: second at which the outage starts.")
@_option("--retries", click.IntRange(min=0), 3, "storm: retries per request.")
@_option("--server", click.Choice(list(_storm.SERVERS)), "outage", "storm: server model.")
@_option("--capacity", _POSITIVE, None, "storm: server capacity in attempts/s [1.5 x rps].")
@_option("--duration", _POSITIVE, 30.0, "storm, budget: seconds of traffic.")
@_option(
    "--failure-rates",
    None,
    "0:1:0.05",
    "budget: failure probabilities per attempt: a comma list or START:STOP:STEP.",
)
@_option("--rate", _POSITIVE, 10.0, "budget: calls per second per client.")
@_option(
    "--total-rps",
    _POSITIVE,
    None,
    "budget: fixed total calls/s shared by the clients (overrides --rate).",
)
@_option("--depth", click.IntRange(min=1, max=8), 4, "layers: number of retrying layers.")
@_option("--attempts", click.IntRange(min=1, max=10), 4, "layers: attempts per layer.")
@_option("--depths", str, "0.2,0.4,0.6,0.8", "metastable: trigger depths in [0, 1).")
@_option("--durations", str, "1,2,5,10,20", "metastable: trigger durations (s).")
@_option(
    "--strategies",
    str,
    ",".join(_metastable.DEFAULT_STRATEGIES),
    "metastable: strategies to compare (comma list).",
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
    depths: str,
    durations: str,
    strategies: str,
    plot: bool,
    show_progress: bool | None,
) -> None:
    """Simulate a retry policy across a fleet in virtual time.

    \b
    occ     AWS "Exponential Backoff And Jitter" contention: 5 backoffs x clients
    storm   an outage under steady load: immediate, exponential, full, full+budget
    budget  independent failures: none, retries, budget, breaker per client
    layers  retries nested over --depth layers above a failing bottom
    metastable  trigger depth x duration: which cells recover, per strategy
    hedging hedged reads against a latency tail (Dean & Barroso): none, fixed, p50-p99
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
    elif scenario == "metastable":
        grid = _checked(lambda: _metastable.parse_grid(depths, durations, strategies))
        config = _checked(_metastable.MetastableConfig)
        paths = _checked(
            lambda: run_metastable(out, config, *grid, seed, plot=plot, show_progress=show_progress)
        )
    elif scenario == "hedging":
        paths = _checked(
            lambda: run_hedging(
                out, _hedging.HedgingConfig(), seed, plot=plot, show_progress=show_progress
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
