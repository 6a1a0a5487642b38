# The metastable sweep's strategies (see _metastable.py for the system they act
# in): a Strategy is told what happens to the simulated calls and may refuse.
#
#     first(now)                   a call's first attempt is made
#     client_allows(now, rng)      the client may send an attempt now
#     client_outcome(now, ok, retry)
#                                  the client learnt the outcome of an attempt it sent;
#                                  `retry`: that attempt was a retry
#     may_retry(now)               a failed call may retry (asked after its outcome,
#                                  only when the retry policy would retry)
#     server_admits(now, rng)      the server side takes the attempt
#     server_outcome(now, ok)      an attempt the server took ended
#
# Each registered strategy is the library's own code: the cores of the budget,
# SRE throttling and admission control, and for the client's token budgets
# (grpc-a6: RetryThrottling, aws-quota: RetryQuota) the very runtime objects a
# RetryPolicy(budget=...) holds, driven as core/_engine.Conversation drives them:
# record_request() before a first attempt, record_outcome(success, failed,
# retried) after every attempt, then try_retry() before a retry. A timeout is a
# transient failure for both, never a throttle: the sweep's server never refuses
# for load, it only gets slow.
from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError
from ..core._admission_control import AdmissionControlCore
from ..core._budget import RetryBudgetCore
from ..core._throttle import AdaptiveThrottleCore

if TYPE_CHECKING:
    from ._metastable import MetastableConfig

__all__ = [
    "DEFAULT_STRATEGIES",
    "STRATEGIES",
    "Strategy",
    "StrategyFactory",
    "budget_strategy",
    "register",
    "token_budget_strategy",
]


class Strategy:
    """A protection strategy's hooks into the simulated calls (the default: none).

    ``first(now)``: a call's first attempt is made; ``client_allows(now, rng)``:
    the client may send an attempt now; ``may_retry(now)``: a failed call may retry
    (asked after ``client_outcome``, only when the policy would retry);
    ``client_outcome(now, ok, retry)``: the client learnt the outcome of an attempt
    it sent, ``retry`` saying whether that attempt was a retry;
    ``server_admits(now, rng)``: the server side takes the attempt;
    ``server_outcome(now, ok)``: an attempt the server took ended.
    """

    def first(self, now: float) -> None:
        return None

    def client_allows(self, now: float, rng: random.Random) -> bool:
        return True

    def may_retry(self, now: float) -> bool:
        return True

    def client_outcome(self, now: float, ok: bool, retry: bool) -> None:
        return None

    def server_admits(self, now: float, rng: random.Random) -> bool:
        return True

    def server_outcome(self, now: float, ok: bool) -> None:
        return None


class _Budget(Strategy):
    def __init__(self, core: Any, on_outcome: Callable[[Any, float, bool], None] | None) -> None:
        self.core = core
        self.on_outcome = on_outcome

    def first(self, now: float) -> None:
        self.core.record_request(now)

    def may_retry(self, now: float) -> bool:
        return bool(self.core.try_retry(now))

    def client_outcome(self, now: float, ok: bool, retry: bool) -> None:
        if self.on_outcome is not None:
            self.on_outcome(self.core, now, ok)


def budget_strategy(
    core: Any, *, on_outcome: Callable[[Any, float, bool], None] | None = None
) -> Strategy:
    """A strategy around a retry-budget core shaped like ``RetryBudgetCore``:
    ``record_request(now)`` on every first attempt, ``try_retry(now)`` before every
    retry, and ``on_outcome(core, now, ok)`` (if given) after every attempt -- for
    token-bucket budgets (gRPC A6 throttling, the AWS retry quota) that refill on
    success and drain on failure."""
    return _Budget(core, on_outcome)


class _TokenBudget(Strategy):
    def __init__(self, budget: Any) -> None:
        self.budget = budget

    def first(self, now: float) -> None:
        self.budget.record_request()

    def may_retry(self, now: float) -> bool:
        return bool(self.budget.try_retry(throttled=False))

    def client_outcome(self, now: float, ok: bool, retry: bool) -> None:
        self.budget.record_outcome(success=ok, failed=not ok, retried=retry, throttled=False)


def token_budget_strategy(budget: Any) -> Strategy:
    """A strategy around a budget that hears every answer (``records_outcomes``:
    ``RetryQuota``, ``RetryThrottling``), driven as the client's engine drives it:
    ``record_request()`` before a first attempt, ``record_outcome(success=,
    failed=, retried=, throttled=False)`` after every attempt (a timeout is a
    failure, not a throttle), ``try_retry(throttled=False)`` before a retry."""
    if getattr(budget, "records_outcomes", False) is not True:
        raise ConfigError("budget", f"must record outcomes (records_outcomes), got {budget!r}")
    return _TokenBudget(budget)


class _Throttle(Strategy):
    def __init__(self, core: AdaptiveThrottleCore) -> None:
        self.core = core

    def client_allows(self, now: float, rng: random.Random) -> bool:
        return self.core.request(now, rng)

    def client_outcome(self, now: float, ok: bool, retry: bool) -> None:
        if ok:
            self.core.accept(now)


class _Admission(Strategy):
    def __init__(self, core: AdmissionControlCore) -> None:
        self.core = core

    def server_admits(self, now: float, rng: random.Random) -> bool:
        return self.core.admits(now, rng)

    def server_outcome(self, now: float, ok: bool) -> None:
        self.core.record(now, ok)


StrategyFactory = Callable[["MetastableConfig"], Strategy]

STRATEGIES: dict[str, StrategyFactory] = {
    "none": lambda config: Strategy(),
    "budget": lambda config: budget_strategy(
        RetryBudgetCore(
            ratio=config.budget_ratio,
            min_per_second=config.budget_min_per_second,
            window=config.budget_window,
        )
    ),
    "sre-throttle": lambda config: _Throttle(
        AdaptiveThrottleCore(k=config.throttle_k, window=config.throttle_window)
    ),
    "admission": lambda config: _Admission(
        AdmissionControlCore(
            window=config.admission_window,
            success_rate=config.admission_success_rate,
            max_reject=config.admission_max_reject,
            min_rps=1.0,
        )
    ),
    "grpc-a6": lambda config: token_budget_strategy(config.retry_throttling()),
    "aws-quota": lambda config: token_budget_strategy(config.retry_quota()),
}
DEFAULT_STRATEGIES = ("none", "budget", "sre-throttle", "admission", "grpc-a6", "aws-quota")


def register(name: str, factory: StrategyFactory) -> None:
    """Add a strategy to the sweep (``stormguard simulate metastable --strategies``)."""
    if not name or "," in name:
        raise ConfigError("strategy", f"a name without commas, got {name!r}")
    STRATEGIES[name] = factory
