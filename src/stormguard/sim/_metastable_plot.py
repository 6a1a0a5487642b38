# The metastable sweep's picture: one panel per (trigger, strategy), trigger
# duration across and depth up; each cell coloured by its recovery time, with the
# seconds written in it; cells that never recovered are black ("stuck": the queue
# stays full) or grey ("slow": drained, callers still refused when the run ended).
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._metastable import MetastableConfig, MetastableRow
from ._plots import _DPI, _pyplot

__all__ = ["plot_metastable"]

_STUCK = (0.1, 0.1, 0.1, 1.0)
_SLOW = (0.62, 0.62, 0.62, 1.0)


def plot_metastable(rows: Sequence[MetastableRow], config: MetastableConfig, path: Path) -> Path:
    """Recovery time per (depth, duration) cell, one panel per trigger and strategy."""
    plt = _pyplot()
    strategies = list(dict.fromkeys(row.strategy for row in rows))
    triggers = list(dict.fromkeys(row.trigger for row in rows))
    depths = sorted({row.depth for row in rows})
    durations = sorted({row.duration for row in rows})
    cells = {(r.strategy, r.trigger, r.depth, r.duration): r for r in rows}
    figure, axes = plt.subplots(
        len(triggers),
        len(strategies),
        figsize=(2.6 * len(strategies) + 1.2, 2.4 * len(triggers) + 0.8),
        squeeze=False,
    )
    colours = plt.get_cmap("YlOrRd")
    top = config.tail
    for i, trigger in enumerate(triggers):
        for j, strategy in enumerate(strategies):
            ax = axes[i][j]
            grid = []
            for depth in depths:
                line = []
                for duration in durations:
                    row = cells.get((strategy, trigger, depth, duration))
                    if row is None:
                        line.append((1.0, 1.0, 1.0, 1.0))
                    elif not row.recovered:
                        line.append(_STUCK if row.state == "stuck" else _SLOW)
                    else:
                        line.append(colours(min(row.recovery_s, top) / top))
                grid.append(line)
            ax.imshow(grid, origin="lower", aspect="auto")
            for y, depth in enumerate(depths):
                for x, duration in enumerate(durations):
                    row = cells.get((strategy, trigger, depth, duration))
                    if row is None:
                        continue
                    if row.recovered:
                        text, colour = f"{row.recovery_s:.0f}", "black"
                    else:
                        text, colour = ("stuck" if row.state == "stuck" else "slow"), "white"
                    ax.text(x, y, text, ha="center", va="center", fontsize=7, color=colour)
            ax.set_xticks(range(len(durations)), [f"{d:g}" for d in durations], fontsize=7)
            ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
            if i == 0:
                ax.set_title(strategy, fontsize=9)
            if i == len(triggers) - 1:
                ax.set_xlabel("trigger duration (s)", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{trigger}: depth", fontsize=8)
    figure.suptitle(
        f"Recovery after a trigger (s; load {config.rps:g}/s, capacity {config.capacity:g}/s,"
        f" {config.attempts} attempts, timeout {config.timeout:g} s)",
        fontsize=9,
    )
    mappable = plt.cm.ScalarMappable(cmap=colours, norm=plt.Normalize(0, top))
    bar = figure.colorbar(mappable, ax=axes, shrink=0.8, pad=0.02)
    bar.set_label(f"recovery time (s); black: stuck, grey: slow (> {top:g} s)", fontsize=8)
    figure.set_layout_engine("constrained")
    return _save_constrained(plt, figure, path)


def _save_constrained(plt: Any, figure: Any, path: Path) -> Path:
    # _save() applies tight_layout, which a colorbar spanning the panels does not take.
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=_DPI, metadata={"Software": None})
    plt.close(figure)
    return path
