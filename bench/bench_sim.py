"""The full occ sweep (5 strategies x N = 10..190 x 100 runs) against a plain heapq loop.

Figures:

* fast sweep, all cores: wall time, writes, message events (4 per write: read
  request, read reply, write request, write reply) and events per second;
* fast sweep, one core (skipped with --quick): the algorithmic part of the gain;
* baseline: the straightforward heapq message loop (``stormguard.sim._occ.run_events``,
  one event per message, calling the library backoff objects) on every one of the
  same 95 configurations but only ``BASELINE_RUNS`` runs each, in the same process
  run. Its time is extrapolated linearly to 100 runs (runs are independent and of
  equal expected cost, so time scales with the run count) and the ratio is printed
  against one core and against a perfect split over all cores.
"""

from __future__ import annotations

import os
import random
import time

from stormguard.sim import _occ

CLIENTS = list(range(10, 200, 10))
RUNS = 100
BASELINE_RUNS = 3
TARGET_SECONDS = 15.0


def _baseline(runs: int) -> tuple[float, int]:
    rng = random.Random(1)
    started = time.perf_counter()
    writes = 0
    for strategy in _occ.STRATEGIES:
        for clients in CLIENTS:
            for _ in range(runs):
                writes += _occ.run_events(strategy, clients, rng)[0]
    return time.perf_counter() - started, writes


def _sweep(runs: int, jobs: int) -> tuple[float, int]:
    started = time.perf_counter()
    rows = _occ.sweep(_occ.STRATEGIES, CLIENTS, runs, seed=1, jobs=jobs)
    return time.perf_counter() - started, sum(row.writes for row in rows)


def main(quick: bool) -> None:
    """Run the occ sweep and the baseline slice; print times, events/s and ratios."""
    cores = os.cpu_count() or 1
    runs = 10 if quick else RUNS
    baseline_runs = 1 if quick else BASELINE_RUNS
    per = _occ.EVENTS_PER_CALL
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {cores} cores, load average {load:.2f} at start")
    print(f"occ sweep: {len(_occ.STRATEGIES)} strategies x N=10..190 x {runs} runs")

    wall, writes = _sweep(runs, cores)
    verdict = "met" if wall < TARGET_SECONDS else "MISSED"
    status = "" if quick else f" (target < {TARGET_SECONDS:g} s: {verdict})"
    print(
        f"  fast, {cores} processes : {wall:7.2f} s  {writes:,} writes  {writes * per:,} events"
        f"  {writes * per / wall:,.0f} events/s{status}"
    )
    if not quick:
        one_wall, one_writes = _sweep(runs, 1)
        print(
            f"  fast, 1 process    : {one_wall:7.2f} s  {one_writes * per / one_wall:,.0f} events/s"
        )

    base_wall, base_writes = _baseline(baseline_runs)
    scale = runs / baseline_runs
    estimate = base_wall * scale
    print(
        f"  heapq baseline     : {base_wall:7.2f} s for {baseline_runs} run(s) per configuration"
        f" ({base_writes * per / base_wall:,.0f} events/s) -> {estimate:.1f} s for {runs} runs"
        f" (x{scale:g}, 1 process)"
    )
    print(
        f"  ratio: fast sweep is {estimate / wall:.1f}x the heapq loop on one core, "
        f"{estimate / cores / wall:.1f}x a perfect {cores}-core split of it"
    )


if __name__ == "__main__":  # pragma: no cover
    main(quick=False)
