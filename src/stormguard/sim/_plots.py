# PNG plots of the scenarios. matplotlib is imported only when a plot is drawn,
# with the Agg backend (no display needed), and the figures are kept small.
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._extras import require
from ._budget import BudgetRow
from ._layers import LayersRow
from ._occ import OccRow
from ._storm import StormConfig, StormResult

__all__ = ["occ_figure", "plot_budget", "plot_layers", "plot_occ", "plot_storm"]

_DPI = 80


def _pyplot() -> Any:
    matplotlib = require("matplotlib", "sim")
    matplotlib.use("Agg", force=True)
    return require("matplotlib.pyplot", "sim")


def _save(plt: Any, figure: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=_DPI, metadata={"Software": None})
    plt.close(figure)
    return path


# One line style and one marker per strategy: lines that coincide (full and equal
# jitter do nearly the same work) must stay told apart, also in black and white.
_LINE_STYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "x", "P")


def _style(index: int) -> dict[str, Any]:
    return {
        "linestyle": _LINE_STYLES[index % len(_LINE_STYLES)],
        "marker": _MARKERS[index % len(_MARKERS)],
        "markersize": 4,
        "markerfacecolor": "none",
    }


def plot_occ(rows: Sequence[OccRow], path: Path) -> Path:
    """Calls and completion time against the number of clients, one line per strategy."""
    plt = _pyplot()
    return _save(plt, occ_figure(plt, rows), path)


def occ_figure(plt: Any, rows: Sequence[OccRow]) -> Any:
    """The occ figure (two panels), not yet saved."""
    figure, (calls, time) = plt.subplots(1, 2, figsize=(10, 4))
    for index, strategy in enumerate(dict.fromkeys(row.strategy for row in rows)):
        mine = [row for row in rows if row.strategy == strategy]
        clients = [row.clients for row in mine]
        style = _style(index)
        calls.plot(clients, [row.calls_mean for row in mine], label=strategy, **style)
        time.plot(clients, [row.time_mean for row in mine], label=strategy, **style)
    calls.set(title="Work: writes the server processed", xlabel="clients", ylabel="calls")
    time.set(
        title="Completion: last success reply",
        xlabel="clients",
        ylabel="time units (log)",
        yscale="log",
    )
    for axes in (calls, time):
        axes.grid(alpha=0.3)
    calls.legend(title="backoff")
    return figure


def plot_storm(results: Sequence[StormResult], config: StormConfig, path: Path) -> Path:
    """Per-second attempts, successes and failures, one panel per strategy."""
    plt = _pyplot()
    figure, panels = plt.subplots(
        1, len(results), figsize=(3.2 * len(results), 3.6), sharey=True, squeeze=False
    )
    for axes, result in zip(panels[0], results, strict=True):
        axes.axvspan(
            config.outage_start, config.outage_start + config.outage, color="grey", alpha=0.15
        )
        # The last bin holds only the retries still pending when arrivals stopped.
        shown = [row for second, row in enumerate(result.timeline) if second < config.duration]
        seconds = list(range(len(shown)))
        axes.plot(
            seconds,
            [row[1] for row in shown],
            color="tab:blue",
            linewidth=4,
            alpha=0.35,
            label="attempts (offered load)",
        )
        axes.plot(seconds, [row[2] for row in shown], color="tab:green", label="successes")
        axes.plot(seconds, [row[3] for row in shown], color="tab:red", label="failures")
        axes.axhline(config.rps, color="black", linewidth=0.6, linestyle=":")
        axes.set(title=f"{result.strategy} ({result.server} server)", xlabel="second")
        axes.grid(alpha=0.3)
    panels[0][0].set_ylabel("per second")
    panels[0][0].legend(fontsize="small")
    return _save(plt, figure, path)


def plot_budget(rows: Sequence[BudgetRow], path: Path) -> Path:
    """Success and load against the failure rate, one line per strategy (and fleet size)."""
    plt = _pyplot()
    figure, (success, load) = plt.subplots(1, 2, figsize=(10, 4))
    fleets = list(dict.fromkeys(row.clients for row in rows))
    styles = ["-", "--", ":", "-."]
    for strategy in dict.fromkeys(row.strategy for row in rows):
        for index, clients in enumerate(fleets):
            mine = [r for r in rows if r.strategy == strategy and r.clients == clients]
            label = strategy if len(fleets) == 1 else f"{strategy}, {clients} clients"
            style = styles[index % len(styles)]
            rates = [r.failure_rate for r in mine]
            success.plot(rates, [r.success for r in mine], style, marker=".", label=label)
            load.plot(rates, [r.load for r in mine], style, marker=".", label=label)
    success.set(title="Calls that succeed", xlabel="failure rate per attempt", ylabel="success")
    load.set(title="Load: attempts ÷ calls", xlabel="failure rate per attempt", ylabel="load")
    for axes in (success, load):
        axes.grid(alpha=0.3)
    load.legend(fontsize="small")
    return _save(plt, figure, path)


def plot_layers(rows: Sequence[LayersRow], path: Path) -> Path:
    """Load reaching the bottom against depth (log scale), with attempts**depth."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6, 4))
    for policy in dict.fromkeys(row.policy for row in rows):
        mine = [row for row in rows if row.policy == policy]
        axes.plot([r.depth for r in mine], [r.load for r in mine], marker="o", label=policy)
    depths = sorted({row.depth for row in rows})
    attempts = rows[0].attempts if rows else 1
    axes.plot(depths, [attempts**d for d in depths], "k:", linewidth=0.8, label="attempts ** depth")
    axes.set(
        title=f"Nested retries, {attempts} attempts per layer",
        xlabel="depth",
        ylabel="attempts at the bottom per request",
        yscale="log",
        xticks=depths,
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return _save(plt, figure, path)
