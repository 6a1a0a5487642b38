# Scenario `metastable`: which triggers a fleet recovers from, and how fast, per
# protection strategy -- the picture of Huang et al., "Metastable Failures in the
# Wild" (OSDI 2022), made by the library's own cores in virtual time.
#
# The system. Calls arrive as a Poisson stream of `rps` per second. The server is
# one FIFO queue served at `capacity` requests per second; it does every request it
# admits, even one whose client has already given up (the wasted work that sustains
# a metastable failure). A client waits `timeout` seconds for an attempt, then
# counts it failed and retries by the library's decision (core._policy.decide with
# RetryPolicy(attempts, FullJitter(base, cap))). With the load at 2/3 of capacity
# the system is stable -- until a trigger:
#
#     capacity   the server serves capacity * (1 - depth) for `duration` seconds
#     load       the arrival rate rises by depth * capacity for `duration` seconds
#
# A short or shallow trigger leaves a queue that drains. A long enough one lets the
# queue delay pass the timeout: attempts time out, retries multiply the load past
# capacity, and the queue never drains although the trigger is over -- unless a
# strategy removes the retries' extra load:
#
#     none          retries as the policy allows (up to `attempts` per call)
#     budget        core._budget.RetryBudgetCore (ratio 0.1 + 10/s reserve over 10 s)
#                   shared by the stream
#     sre-throttle  core._throttle.AdaptiveThrottleCore (K = 2) in the client:
#                   attempts refused locally, the refused call gives up
#     admission     core._admission_control.AdmissionControlCore (Envoy's) in front
#                   of the server: refused attempts fail fast, cost the server nothing
#     grpc-a6       the client's RetryThrottling (gRPC A6): max_tokens, every failed
#                   attempt -1, every success +token_ratio; a retry only while the
#                   count is above max_tokens / 2
#     aws-quota     the client's RetryQuota (the AWS SDKs' retry quota): 500 tokens,
#                   a retry after a timeout (transient) costs retry_cost, a first
#                   attempt's success adds success_increment, a retry's success
#                   refunds its price
#
# STRATEGIES (in _metastable_strategies.py, re-exported here) is a registry of
# factories (config -> Strategy); `budget_strategy` adapts any budget core shaped
# like RetryBudgetCore and `token_budget_strategy` any budget that records
# outcomes, so further budgets join the sweep with one register() call.
#
# Figures per cell: a second is bad when more than `bad_share` of the attempt
# outcomes learnt in it are failures (timeouts, refusals, local throttling);
# recovery_s runs from the end of the trigger to the end of the last bad second. A
# cell with a bad second among its last `settle` seconds did not recover
# (recovery_s = inf), and its state says why:
#     stuck       the server's queue holds more than `timeout` of work, and no less
#                 than when the trigger ended: every attempt times out and retries
#                 keep the queue full -- metastable;
#     recovering  the queue is draining or drained but callers still fail (a long
#                 backlog, or a throttle still refusing as its window forgets the
#                 outage) -- slow, not stuck.
# `failed` is the share of calls that failed, `amplification` the attempts the
# server saw per call.
from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .._errors import ConfigError
from ..core._backoff import FullJitter
from ..core._policy import GiveUp, RetryFailure, RetryPolicy, RetryState, decide
from ..protection._quota import RetryQuota, RetryThrottling
from ._engine import py_rng
from ._metastable_strategies import (
    DEFAULT_STRATEGIES,
    STRATEGIES,
    Strategy,
    StrategyFactory,
    budget_strategy,
    register,
    token_budget_strategy,
)

__all__ = [
    "DEFAULT_STRATEGIES",
    "HEADER",
    "STRATEGIES",
    "TRIGGERS",
    "MetastableConfig",
    "MetastableRow",
    "Strategy",
    "StrategyFactory",
    "budget_strategy",
    "parse_grid",
    "register",
    "run_cell",
    "sweep",
    "token_budget_strategy",
]

TRIGGERS = ("capacity", "load")
HEADER = (
    "strategy",
    "trigger",
    "depth",
    "duration",
    "recovered",
    "recovery_s",
    "failed",
    "amplification",
    "state",
)
_REFUSED_LATENCY = 0.001  # seconds a fast refusal takes to come back


@dataclass(frozen=True, slots=True)
class MetastableConfig:
    """Parameters of the metastable sweep (seconds, requests per second)."""

    rps: float = 100.0
    capacity: float = 150.0
    timeout: float = 1.0
    attempts: int = 4
    base: float = 0.1
    cap: float = 2.0
    trigger_start: float = 10.0
    tail: float = 60.0
    settle: float = 10.0
    bad_share: float = 0.1
    budget_ratio: float = 0.1
    budget_min_per_second: float = 10.0
    budget_window: float = 10.0
    throttle_k: float = 2.0
    throttle_window: float = 30.0
    admission_window: float = 10.0
    admission_success_rate: float = 0.95
    admission_max_reject: float = 0.8
    a6_max_tokens: float = 10.0
    a6_token_ratio: float = 0.1
    quota_capacity: float = 500.0
    quota_retry_cost: float = 14.0
    quota_throttling_cost: float = 5.0
    quota_success_increment: float = 1.0

    def __post_init__(self) -> None:
        for name in ("rps", "capacity", "timeout", "tail", "settle"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, f"must be > 0, got {getattr(self, name)!r}")
        if self.settle > self.tail:
            raise ConfigError("settle", f"must be <= tail ({self.tail}), got {self.settle}")
        if self.attempts < 1:
            raise ConfigError("attempts", f"must be >= 1, got {self.attempts!r}")
        if not 0 < self.bad_share < 1:
            raise ConfigError("bad_share", f"must be in (0, 1), got {self.bad_share!r}")
        # The library's objects check their own settings; the error names ours.
        for prefix, build in (("a6_", self.retry_throttling), ("quota_", self.retry_quota)):
            try:
                build()
            except ConfigError as error:
                field = prefix + error.field
                raise ConfigError(field, str(error).split(": ", 1)[1]) from None

    def retry_throttling(self) -> RetryThrottling:
        """A new gRPC A6 token count with this sweep's ``a6_*`` settings."""
        return RetryThrottling(max_tokens=self.a6_max_tokens, token_ratio=self.a6_token_ratio)

    def retry_quota(self) -> RetryQuota:
        """A new AWS retry quota with this sweep's ``quota_*`` settings."""
        return RetryQuota(
            capacity=self.quota_capacity,
            retry_cost=self.quota_retry_cost,
            throttling_cost=self.quota_throttling_cost,
            success_increment=self.quota_success_increment,
        )


@dataclass(frozen=True, slots=True)
class MetastableRow:
    """One cell of the sweep: a strategy under one trigger."""

    strategy: str
    trigger: str
    depth: float
    duration: float
    recovered: bool
    recovery_s: float
    failed: float
    amplification: float
    state: str = "recovered"


def run_cell(
    strategy: str,
    trigger: str,
    depth: float,
    duration: float,
    config: MetastableConfig,
    rng: random.Random,
) -> MetastableRow:
    """Simulate one strategy under one trigger, every attempt, in virtual time."""
    if strategy not in STRATEGIES:
        raise ConfigError("strategy", f"expected one of {tuple(STRATEGIES)}, got {strategy!r}")
    if trigger not in TRIGGERS:
        raise ConfigError("trigger", f"expected one of {TRIGGERS}, got {trigger!r}")
    guard = STRATEGIES[strategy](config)
    policy = RetryPolicy(
        attempts=config.attempts, backoff=FullJitter(config.base, config.cap), deadline=None
    )
    timed_out = RetryFailure(retryable=True, reason="timeout")
    start, end = config.trigger_start, config.trigger_start + duration
    stop = end + config.tail
    slow_service = 1.0 / (config.capacity * (1.0 - depth)) if trigger == "capacity" else 0.0
    service = 1.0 / config.capacity
    spike = config.rps + depth * config.capacity if trigger == "load" else config.rps
    seconds = math.ceil(stop) + 1
    outcomes = [0] * seconds
    failures = [0] * seconds
    calls = failed_calls = sent = 0
    free_at = 0.0
    backlog_at_end: float | None = None  # seconds of queued work when the trigger ended
    # (time, sequence, kind, state): kind 0 = attempt, 1 = outcome ok, 2 = outcome
    # failed, 3 = refused fast (an outcome the server never counted)
    events: list[tuple[float, int, int, RetryState]] = []
    sequence = 0
    next_call = rng.expovariate(config.rps)
    while True:
        if events and events[0][0] <= next_call:
            now, _, kind, state = heapq.heappop(events)
        elif next_call < stop:
            now, kind, state = next_call, 0, RetryState(started_at=next_call)
            calls += 1
            guard.first(now)
            rate = spike if start <= now < end else config.rps
            next_call += rng.expovariate(rate)
        else:
            break
        if now >= stop:
            break
        if backlog_at_end is None and now >= end:
            backlog_at_end = max(0.0, free_at - now)
        second = int(now)
        if kind == 0:
            if not guard.client_allows(now, rng):
                outcomes[second] += 1
                failures[second] += 1
                failed_calls += 1
                continue
            sent += 1
            if not guard.server_admits(now, rng):
                kind, known = 3, now + _REFUSED_LATENCY
            else:
                begin = free_at if free_at > now else now
                done = begin + (slow_service if slow_service and start <= begin < end else service)
                free_at = done
                ok = done - now <= config.timeout
                kind, known = (1, done) if ok else (2, now + config.timeout)
            sequence += 1
            heapq.heappush(events, (known, sequence, kind, state))
            continue
        ok = kind == 1
        outcomes[second] += 1
        guard.client_outcome(now, ok, state.attempts > 1)
        if kind != 3:
            guard.server_outcome(now, ok)
        if ok:
            continue
        failures[second] += 1
        decision = decide(policy, state, timed_out, now=now, rng=rng)
        if isinstance(decision, GiveUp) or not guard.may_retry(now):
            failed_calls += 1
            continue
        sequence += 1
        heapq.heappush(events, (now + decision.wait, sequence, 0, state.after_wait(decision.wait)))
    bad = [failures[s] > config.bad_share * outcomes[s] for s in range(seconds)]
    last = math.floor(stop) - 1
    recovered = not any(bad[s] for s in range(max(0, math.ceil(stop - config.settle)), last + 1))
    after = [s for s in range(math.floor(end), last + 1) if bad[s]]
    recovery = (max(after) + 1 - end) if after else 0.0
    if recovered:
        verdict = "recovered"
    else:
        backlog = free_at - stop
        stuck = backlog > config.timeout and backlog >= (backlog_at_end or 0.0)
        verdict = "stuck" if stuck else "recovering"
    return MetastableRow(
        strategy,
        trigger,
        depth,
        duration,
        recovered,
        max(0.0, recovery) if recovered else math.inf,
        failed_calls / calls if calls else 0.0,
        sent / calls if calls else 0.0,
        verdict,
    )


def sweep(
    config: MetastableConfig,
    depths: Sequence[float],
    durations: Sequence[float],
    seed: int,
    *,
    strategies: Iterable[str] = DEFAULT_STRATEGIES,
    triggers: Iterable[str] = TRIGGERS,
    tick: Callable[[float], None] | None = None,
) -> list[MetastableRow]:
    """Every cell: strategies x triggers x depths x durations, each on its own stream."""
    for depth in depths:
        if not 0 <= depth < 1:
            raise ConfigError("depths", f"each depth must be in [0, 1), got {depth!r}")
    for duration in durations:
        if not duration > 0:
            raise ConfigError("durations", f"each duration must be > 0, got {duration!r}")
    rows = []
    for strategy in strategies:
        for trigger in triggers:
            for depth in depths:
                for duration in durations:
                    rng = py_rng(seed, "metastable", strategy, trigger, depth, duration)
                    rows.append(run_cell(strategy, trigger, depth, duration, config, rng))
                    if tick:
                        tick(1.0)
    return rows


def _numbers(text: str, field: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(field, f"expected comma-separated numbers, got {text!r}") from None
    if not values or not all(math.isfinite(v) for v in values):
        raise ConfigError(field, f"expected comma-separated numbers, got {text!r}")
    return values


def parse_grid(
    depths: str, durations: str, strategies: str
) -> tuple[list[float], list[float], list[str]]:
    """The CLI's comma lists: depths in [0, 1), durations > 0, known strategy names."""
    grid_depths = _numbers(depths, "depths")
    if not all(0 <= d < 1 for d in grid_depths):
        raise ConfigError("depths", f"each depth must be in [0, 1), got {depths!r}")
    grid_durations = _numbers(durations, "durations")
    if not all(d > 0 for d in grid_durations):
        raise ConfigError("durations", f"each duration must be > 0, got {durations!r}")
    names = [name.strip() for name in strategies.split(",") if name.strip()]
    unknown = [name for name in names if name not in STRATEGIES]
    if not names or unknown:
        raise ConfigError(
            "strategies", f"expected names from {tuple(STRATEGIES)}, got {strategies!r}"
        )
    return grid_depths, grid_durations, names
