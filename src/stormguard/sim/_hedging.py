# Scenario `hedging`: hedged requests against a latency tail (Dean & Barroso, "The
# Tail at Scale", CACM 2013: hedging BigTable reads after 10 ms cut the 99.9th
# percentile from 1,800 ms to 74 ms for 2 % more requests).
#
# A client sends `rate` reads per second for `duration` seconds (a Poisson
# stream). Every copy of a read is served in a latency drawn independently: a
# lognormal body (median `median`, shape `sigma`) and, with probability `tail`, a
# hiccup of uniform(`hiccup_low`, `hiccup_high`) more (a GC pause, a compaction,
# a busy neighbour: what the paper's tail is made of). The servers have capacity
# to spare, so a copy does not slow the others (the paper's setting; see
# docs/client/hedging.md for what changes near saturation).
#
# What happens to one read is the library's own core/_hedge.py: copy 1 at once;
# after HedgePolicy.delay_for(window) without an answer, copy 2 if the budget (the
# library's RetryBudgetCore with the policy's ratio and reserve) allows it; the
# first answer wins and its latency is recorded in the LatencyWindow (a loser is
# cancelled, as the async front ends do, and records nothing). Strategies:
#     none        one copy
#     fixed       a hedge after `fixed_delay` seconds
#     p50 .. p99  a hedge after that percentile of the latencies seen (the
#                 fixed delay until 100 are known)
# Every strategy sees the same draws (one generator per strategy, same seed), so
# the difference is the hedging alone. Rows: requests, the extra copies as a share
# of requests, and the p50 / p99 / p99.9 of the latency the caller saw, in ms.
from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._errors import ConfigError
from ..core._budget import RetryBudgetCore
from ..core._hedge import HedgePolicy, LatencyWindow
from ._engine import py_rng

__all__ = ["STRATEGIES", "HedgingConfig", "HedgingRow", "run", "run_strategy"]

STRATEGIES = ("none", "fixed", "p50", "p90", "p95", "p99")


@dataclass(frozen=True, slots=True)
class HedgingConfig:
    """Parameters of the hedging scenario (seconds, reads per second)."""

    rate: float = 200.0
    duration: float = 300.0
    median: float = 0.005
    sigma: float = 0.5
    tail: float = 0.01
    hiccup_low: float = 0.5
    hiccup_high: float = 2.0
    fixed_delay: float = 0.01
    ratio: float = 0.1
    min_per_second: float = 1.0

    def __post_init__(self) -> None:
        for name in ("rate", "duration", "median", "sigma", "fixed_delay"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, f"must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.tail < 1:
            raise ConfigError("tail", f"must be in [0, 1), got {self.tail!r}")
        if not 0 <= self.hiccup_low <= self.hiccup_high:
            raise ConfigError("hiccup_high", "must be >= hiccup_low >= 0")

    def latency(self, rng: random.Random) -> float:
        """One copy's service time."""
        value = rng.lognormvariate(math.log(self.median), self.sigma)
        if rng.random() < self.tail:
            value += rng.uniform(self.hiccup_low, self.hiccup_high)
        return value

    def policy(self, strategy: str) -> HedgePolicy | None:
        """The HedgePolicy a strategy stands for (None: no hedging)."""
        if strategy == "none":
            return None
        percentile = None if strategy == "fixed" else float(strategy[1:])
        return HedgePolicy(
            delay=self.fixed_delay,
            percentile=percentile,
            ratio=self.ratio,
            min_per_second=self.min_per_second,
        )


@dataclass(frozen=True, slots=True)
class HedgingRow:
    """One line of hedging.csv."""

    strategy: str
    requests: int
    extra: float
    p50_ms: float
    p99_ms: float
    p999_ms: float


def _percentile(ordered: Sequence[float], p: float) -> float:
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def run_strategy(
    strategy: str, config: HedgingConfig, rng: random.Random
) -> tuple[int, int, list[float]]:
    """One strategy's run: (requests, extra copies sent, the caller's latencies)."""
    if strategy not in STRATEGIES:
        raise ConfigError("strategy", f"expected one of {STRATEGIES}, got {strategy!r}")
    policy = config.policy(strategy)
    budget = (
        None
        if policy is None
        else RetryBudgetCore(ratio=policy.ratio, min_per_second=policy.min_per_second, window=10)
    )
    window = LatencyWindow(policy.window if policy else 1)
    latencies: list[float] = []
    extra = 0
    # Answers are recorded in the window when they arrive, in time order.
    answers: list[tuple[float, float]] = []  # (time, latency of the winning copy)
    now = rng.expovariate(config.rate)
    while now < config.duration:
        while answers and answers[0][0] <= now:
            window.record(heapq.heappop(answers)[1])
        first = config.latency(rng)
        second = config.latency(rng)  # drawn for every strategy: the same stream
        seen = first
        winner = first
        if policy is not None and budget is not None:
            budget.record_request(now)
            delay = policy.delay_for(window)
            if first > delay and budget.try_retry(now + delay):
                extra += 1
                if delay + second < first:
                    seen, winner = delay + second, second
        latencies.append(seen)
        heapq.heappush(answers, (now + seen, winner))
        now += rng.expovariate(config.rate)
    return len(latencies), extra, latencies


def run(
    config: HedgingConfig,
    seed: int,
    *,
    strategies: Sequence[str] = STRATEGIES,
    tick: Callable[[float], None] | None = None,
) -> tuple[list[HedgingRow], dict[str, list[float]]]:
    """Every strategy on the same draws: the rows, and each one's sorted latencies."""
    rows = []
    samples: dict[str, list[float]] = {}
    for strategy in strategies:
        requests, extra, latencies = run_strategy(strategy, config, py_rng(seed, "hedging"))
        ordered = sorted(latencies)
        samples[strategy] = ordered
        rows.append(
            HedgingRow(
                strategy=strategy,
                requests=requests,
                extra=extra / requests if requests else 0.0,
                p50_ms=1000 * _percentile(ordered, 50),
                p99_ms=1000 * _percentile(ordered, 99),
                p999_ms=1000 * _percentile(ordered, 99.9),
            )
        )
        if tick:
            tick(1.0)
    return rows, samples
