# The hedging scenario's figure (docs/img/sim-hedging.png): how often a read is
# slower than t, with and without hedging, and what each strategy costs and buys.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ._hedging import HedgingRow
from ._plots import _pyplot, _save, _style

__all__ = ["plot_hedging"]

_SHOWN = ("none", "fixed", "p95", "p99")


def plot_hedging(
    rows: Sequence[HedgingRow], samples: Mapping[str, Sequence[float]], path: Path
) -> Path:
    """Left: P(latency > t) per strategy (log-log). Right: p99.9 per strategy, with
    the extra requests each sent."""
    plt = _pyplot()
    figure, (tail, cost) = plt.subplots(1, 2, figsize=(11, 4))
    for index, strategy in enumerate(s for s in _SHOWN if s in samples):
        ordered = samples[strategy]
        count = len(ordered)
        xs = [value * 1000 for value in ordered]
        ys = [(count - i) / count for i in range(count)]
        tail.plot(xs, ys, label=strategy, markevery=max(1, count // 12), **_style(index))
    tail.set(
        title="How often a read is slower than t",
        xlabel="t (ms, log)",
        ylabel="P(latency > t) (log)",
        xscale="log",
        yscale="log",
    )
    tail.axhline(0.001, color="grey", linewidth=0.8, linestyle=":")
    tail.annotate(
        "p99.9", (0.99, 0.001), xycoords=("axes fraction", "data"), ha="right", va="bottom"
    )
    tail.legend(title="hedge after")
    names = [row.strategy for row in rows]
    bars = cost.bar(names, [row.p999_ms for row in rows], color="#4c72b0")
    for bar, row in zip(bars, rows, strict=True):
        cost.annotate(
            f"+{row.extra:.1%}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    cost.set(
        title="p99.9 latency (bars) and extra requests (labels)",
        xlabel="hedge after (fixed: 10 ms; pNN: that percentile of recent latencies)",
        ylabel="p99.9 (ms, log)",
        yscale="log",
    )
    for axes in (tail, cost):
        axes.grid(alpha=0.3)
    return _save(plt, figure, path)
