# Scenario `storm`: an outage under steady load, and what retries do to it.
#
# Requests arrive as a Poisson stream of `rps` per second for `duration` seconds.
# The server fails every attempt in [outage_start, outage_start + outage). Each
# attempt is decided when it reaches the server and answered `latency` seconds
# later. What follows a failure is the library's own retry decision,
# core._policy.decide() with RetryPolicy(attempts=retries + 1, backoff=...) (its
# 60 s deadline never binds here), and the backoff objects are the library's:
#     immediate     NoBackoff()
#     exponential   Exponential(0.5, 10)        no jitter
#     full          FullJitter(0.5, 10)
#     full+budget   FullJitter(0.5, 10) and one RetryBudgetCore(ratio=0.1,
#                   min_per_second=10, window=10) shared by the whole stream, as
#                   one service instance or proxy holds it: every first attempt is
#                   recorded, every retry asks try_retry() first and the request
#                   gives up when refused.
#
# Server models (`capacity` defaults to 1.5 x rps):
#     outage    fails only during the outage.
#     capacity  also sheds what exceeds its capacity, decided by the library's
#               own limiter, TokenBucket(rate=capacity, burst=capacity * 0.1),
#               as a gateway in front of it would.
#     collapse  capacity counted in 0.1 s slots, and goodput collapses under
#               overload: a slot serves
#               capacity * 0.1 * max(0, 2 - load_prev / (capacity * 0.1)) attempts,
#               load_prev being the attempts of the slot before (the server
#               thrashes; at twice its capacity it serves nothing). A retry storm
#               can then keep it down after the outage ended.
#
# Figures: peak_rps = most attempts in one second; amplification = attempts ÷
# first attempts; failed = requests that gave up; recovery_s = from the end of the
# outage to the end of the last 0.1 s slot in which more than 1 % of attempts
# failed (0 when none did, inf when it still fails when the stream ends).
from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .._errors import ConfigError
from ..core._backoff import Backoff, Exponential, FullJitter, NoBackoff
from ..core._budget import RetryBudgetCore
from ..core._limiters import TokenBucket
from ..core._policy import RetryFailure, RetryPolicy
from ._engine import Callers, py_rng

__all__ = ["SERVERS", "STRATEGIES", "StormConfig", "StormResult", "run", "run_strategy"]

STRATEGIES = ("immediate", "exponential", "full", "full+budget")
SERVERS = ("outage", "capacity", "collapse")
SLOT = 0.1  # seconds per capacity slot and per recovery slot
BAD_SLOT = 0.01  # a slot with more than this share of failed attempts is not recovered


@dataclass(frozen=True, slots=True)
class StormConfig:
    """Parameters of the storm scenario (seconds and requests per second)."""

    rps: float = 1000.0
    outage: float = 5.0
    outage_start: float = 5.0
    duration: float = 30.0
    retries: int = 3
    server: str = "outage"
    capacity: float | None = None
    latency: float = 0.02
    base: float = 0.5
    cap: float = 10.0
    budget_ratio: float = 0.1
    budget_min_per_second: float = 10.0
    budget_window: float = 10.0

    def __post_init__(self) -> None:
        if self.server not in SERVERS:
            raise ConfigError("server", f"expected one of {SERVERS}, got {self.server!r}")
        for name in ("rps", "duration"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, f"must be > 0, got {getattr(self, name)!r}")
        for name in ("outage", "outage_start", "retries"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)!r}")

    @property
    def server_capacity(self) -> float:
        """Attempts per second the server serves (capacity and collapse models)."""
        return self.capacity if self.capacity is not None else 1.5 * self.rps


@dataclass(slots=True)
class StormResult:
    """Totals and per-second timeline of one strategy."""

    strategy: str
    server: str
    requests: int = 0
    attempts: int = 0
    failed: int = 0
    peak_rps: int = 0
    recovery_s: float = 0.0
    # per second: [first attempts, attempts, successful attempts, failed attempts]
    timeline: list[list[int]] = field(default_factory=list)

    @property
    def amplification(self) -> float:
        """Attempts per first attempt."""
        return self.attempts / self.requests if self.requests else 0.0


def backoff_for(strategy: str, config: StormConfig) -> Backoff:
    """The library backoff object of a storm strategy."""
    if strategy == "immediate":
        return NoBackoff()
    if strategy == "exponential":
        return Exponential(config.base, config.cap)
    if strategy in ("full", "full+budget"):
        return FullJitter(config.base, config.cap)
    raise ConfigError("strategy", f"expected one of {STRATEGIES}, got {strategy!r}")


class _Server:
    """Decides each attempt at the time it arrives."""

    def __init__(self, config: StormConfig) -> None:
        self.kind = config.server
        self.start = config.outage_start
        self.end = config.outage_start + config.outage
        self.per_slot = config.server_capacity * SLOT
        self.slot = -1
        self.load = 0  # attempts in the current slot
        self.served = 0  # successes in the current slot
        self.allowed = self.per_slot
        capacity = config.server_capacity
        self.bucket = (
            TokenBucket(rate=capacity, burst=capacity * SLOT) if self.kind == "capacity" else None
        )
        self.tokens: object = None  # the bucket's state; None is a full bucket

    def decide(self, now: float) -> bool:
        slot = int(now / SLOT)
        if slot != self.slot:
            previous_load = self.load if slot == self.slot + 1 else 0
            self.slot, self.load, self.served = slot, 0, 0
            if self.kind == "collapse":
                self.allowed = self.per_slot * max(0.0, 2.0 - previous_load / self.per_slot)
            else:
                self.allowed = self.per_slot
        self.load += 1
        if self.start <= now < self.end:
            return False
        if self.bucket is not None:
            self.tokens, allowed, *_ = self.bucket.advance(self.tokens, now, 1.0)
            return bool(allowed)
        if self.kind == "outage" or self.served < self.allowed:
            self.served += 1
            return True
        return False


def run_strategy(strategy: str, config: StormConfig, rng: random.Random) -> StormResult:
    """Simulate one strategy: the whole stream, every attempt, in virtual time."""
    policy = RetryPolicy(attempts=config.retries + 1, backoff=backoff_for(strategy, config))
    unavailable = RetryFailure(retryable=True, reason="503 Service Unavailable")
    budget = (
        RetryBudgetCore(
            ratio=config.budget_ratio,
            min_per_second=config.budget_min_per_second,
            window=config.budget_window,
        )
        if strategy == "full+budget"
        else None
    )
    server = _Server(config)
    result = StormResult(strategy, config.server)
    seconds = math.ceil(config.duration) + 1
    timeline = [[0, 0, 0, 0] for _ in range(seconds)]
    slots: dict[int, list[int]] = {}  # slot -> [attempts, failures]
    callers = Callers(
        config.rps, config.duration, rng, policy=policy, failure=unavailable, budget=budget
    )
    latency = config.latency
    for now, state in callers:
        second = int(now)
        while second >= len(timeline):
            timeline.append([0, 0, 0, 0])
        row = timeline[second]
        if state.attempts == 1:
            row[0] += 1
        row[1] += 1
        result.attempts += 1
        ok = server.decide(now)
        counts = slots.setdefault(int(now / SLOT), [0, 0])
        counts[0] += 1
        if ok:
            row[2] += 1
            continue
        row[3] += 1
        counts[1] += 1
        if not callers.retry(state, now + latency):
            result.failed += 1
    result.requests = callers.calls
    result.timeline = timeline
    result.peak_rps = max(row[1] for row in timeline)
    result.recovery_s = _recovery(slots, config)
    return result


def _recovery(slots: dict[int, list[int]], config: StormConfig) -> float:
    outage_end = config.outage_start + config.outage
    stream_end_slot = int(config.duration / SLOT) - 1
    bad = [slot for slot, (attempts, failures) in slots.items() if failures > BAD_SLOT * attempts]
    if not bad:
        return 0.0
    last = max(bad)
    if last >= stream_end_slot and last * SLOT >= outage_end:
        return math.inf
    return max(0.0, (last + 1) * SLOT - outage_end)


def run(
    config: StormConfig,
    seed: int,
    *,
    strategies: tuple[str, ...] = STRATEGIES,
    tick: Callable[[float], None] | None = None,
) -> list[StormResult]:
    """Every strategy on the same configuration, each with its own seeded stream."""
    results = []
    for strategy in strategies:
        results.append(run_strategy(strategy, config, py_rng(seed, "storm", strategy)))
        if tick:
            tick(1.0)
    return results
