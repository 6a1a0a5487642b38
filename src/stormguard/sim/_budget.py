# Scenario `budget`: independent failures, and what retries, a retry budget or a
# circuit breaker per client do to success and load.
#
# Each client is a Poisson source of `rate` calls per second for `duration`
# seconds (with `total_rps`, rate = total_rps / clients, so the traffic stays the
# same while the number of clients, and so of per-client states, changes). Every
# attempt fails independently with probability `failure_rate` and is answered
# `latency` seconds after it is sent. What follows a failure is the library's own
# core._policy.decide() with RetryPolicy(attempts=retries + 1, backoff=...);
# budgets and breakers are consulted as the library's driver does, after decide()
# says Retry. Strategies, with the library's own objects:
#     none      one attempt.
#     retries   up to 3 retries after FullJitter(0.1, 2.0).
#     budget    the same, each retry first asking the client's RetryBudgetCore(
#               ratio=0.1, min_per_second=1, window=10); a refusal ends the call.
#     breaker   the same retries, every attempt first asking the client's
#               BreakerCore() (library defaults); a refusal ends the call without
#               sending anything, and each sent attempt's outcome is recorded.
# success = calls that succeeded ÷ calls; load = attempts sent ÷ first attempts
# (first attempts = calls the application made, so a breaker that refuses them
# can bring load below 1).
#
# Clients share nothing, so each is simulated on its own event queue.
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._errors import ConfigError
from ..core._backoff import FullJitter
from ..core._breaker import BreakerCore
from ..core._budget import RetryBudgetCore
from ..core._policy import RetryFailure, RetryPolicy
from ._engine import Callers, py_rng

__all__ = ["STRATEGIES", "BudgetConfig", "BudgetRow", "run", "run_client"]

STRATEGIES = ("none", "retries", "budget", "breaker")


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    """Parameters of the budget scenario (seconds, calls per second)."""

    rate: float = 10.0
    total_rps: float | None = None
    duration: float = 30.0
    retries: int = 3
    latency: float = 0.01
    base: float = 0.1
    cap: float = 2.0
    ratio: float = 0.1
    min_per_second: float = 1.0
    window: float = 10.0

    def __post_init__(self) -> None:
        for name in ("rate", "duration"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, f"must be > 0, got {getattr(self, name)!r}")
        if self.retries < 0:
            raise ConfigError("retries", f"must be >= 0, got {self.retries!r}")
        if self.total_rps is not None and not self.total_rps > 0:
            raise ConfigError("total_rps", "must be > 0")

    def client_rate(self, clients: int) -> float:
        """Calls per second of one client."""
        return self.total_rps / clients if self.total_rps is not None else self.rate


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """One line of budget.csv, with the raw counts behind it."""

    strategy: str
    clients: int
    failure_rate: float
    success: float
    load: float
    calls: int
    succeeded: int
    attempts: int


def run_client(
    strategy: str, failure_rate: float, rate: float, config: BudgetConfig, rng: random.Random
) -> tuple[int, int, int]:
    """One client's whole run: (calls, calls that succeeded, attempts sent)."""
    if strategy not in STRATEGIES:
        raise ConfigError("strategy", f"expected one of {STRATEGIES}, got {strategy!r}")
    retries = 0 if strategy == "none" else config.retries
    policy = RetryPolicy(attempts=retries + 1, backoff=FullJitter(config.base, config.cap))
    error = RetryFailure(retryable=True, reason="503 Service Unavailable")
    budget = (
        RetryBudgetCore(
            ratio=config.ratio, min_per_second=config.min_per_second, window=config.window
        )
        if strategy == "budget"
        else None
    )
    breaker = BreakerCore() if strategy == "breaker" else None
    latency = config.latency
    callers = Callers(rate, config.duration, rng, policy=policy, failure=error, budget=budget)
    succeeded = attempts = 0
    for now, state in callers:
        if breaker is not None:
            admission = breaker.try_acquire(now, rng)
            if not admission.allowed:
                continue  # CircuitOpen: the call ends, nothing is sent
        attempts += 1
        failed = rng.random() < failure_rate
        reply = now + latency
        if breaker is not None:
            breaker.record(reply, admission, failure=failed, duration=latency)
        if failed:
            callers.retry(state, reply)
        else:
            succeeded += 1
    return callers.calls, succeeded, attempts


def run(
    config: BudgetConfig,
    clients: Sequence[int],
    failure_rates: Sequence[float],
    seed: int,
    *,
    strategies: Sequence[str] = STRATEGIES,
    tick: Callable[[float], None] | None = None,
) -> list[BudgetRow]:
    """Every (strategy, clients, failure rate), each client with its own seeded stream."""
    rows = []
    for strategy in strategies:
        for count in clients:
            rate = config.client_rate(count)
            for failure_rate in failure_rates:
                calls = succeeded = attempts = 0
                for client in range(count):
                    rng = py_rng(seed, "budget", strategy, count, failure_rate, client)
                    c, s, a = run_client(strategy, failure_rate, rate, config, rng)
                    calls, succeeded, attempts = calls + c, succeeded + s, attempts + a
                rows.append(
                    BudgetRow(
                        strategy=strategy,
                        clients=count,
                        failure_rate=failure_rate,
                        success=succeeded / calls if calls else 0.0,
                        load=attempts / calls if calls else 0.0,
                        calls=calls,
                        succeeded=succeeded,
                        attempts=attempts,
                    )
                )
                if tick:
                    tick(1.0)
    return rows
