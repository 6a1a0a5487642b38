# The gateway demo's timeline as a PNG: per run, the requests per second that
# reached the upstream (naive loop and stormguard clients apart), the outage shaded,
# and for the run through the gateway the breaker's state as a coloured band.
# matplotlib (Agg) through the simulator's plotting helpers.
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..sim._plots import _pyplot, _save

if TYPE_CHECKING:
    from ._demo import GatewayDemoResult

__all__ = ["timeline"]

_STEP = 0.25  # seconds per bar of the rate curves
_COLOURS = {"closed": "#116329", "half_open": "#7d4e00", "open": "#a40e26"}


def _rate(times: list[float], end: float) -> tuple[list[float], list[float]]:
    n = int(end / _STEP) + 1
    counts = [0] * n
    for t in times:
        if 0 <= t < n * _STEP:
            counts[int(t / _STEP)] += 1
    return [i * _STEP for i in range(n)], [c / _STEP for c in counts]


def timeline(results: Sequence[GatewayDemoResult], path: Path) -> Path:
    """Write the timeline of ``results`` (one panel per run, same y scale) to ``path``."""
    plt = _pyplot()
    figure, axes = plt.subplots(len(results), 1, figsize=(10, 2.6 * len(results)), sharey=True)
    axes = list(axes) if len(results) > 1 else [axes]
    end = max((max((t for t, _, _ in r.arrivals), default=0.0) for r in results), default=1.0)
    for ax, result in zip(axes, results):
        start, stop = result.outage
        ax.axvspan(start, stop, color="#f0c4c4", label="upstream failing")
        for kind, colour in (("naive", "#a40e26"), ("stormguard", "#0349b4")):
            x, y = _rate([t for t, k, _ in result.arrivals if k == kind], end)
            label = "naive loop" if kind == "naive" else "stormguard client"
            ax.step(x, y, where="post", color=colour, label=label)
        for (t0, state), (t1, _) in zip(result.breaker, result.breaker[1:]):
            ax.axvspan(t0, t1, ymin=0.93, ymax=1.0, color=_COLOURS.get(state, "#888888"))
        ax.set_title(f"{result.label}: requests/s that reached the upstream", loc="left")
        ax.set_xlim(0, end)
        ax.set_ylabel("req/s")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds (band on top: the gateway's breaker, green closed, red open)")
    axes[0].legend(loc="upper right", fontsize="small")
    return _save(plt, figure, path)
