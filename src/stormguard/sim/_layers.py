# Scenario `layers`: retries nested over D layers above a bottom that always fails.
#
# Top-level requests arrive `rps` per second, evenly spaced, `requests` of them.
# Layer 0 (the top) calls layer 1, ..., layer depth-1 calls the bottom, which
# fails every call. Calls take no time. Policies:
#     every-layer          every layer makes up to `attempts` attempts.
#     budget-every-layer   the same, but each layer's retries first ask that
#                          layer's RetryBudgetCore (one per layer, as one service
#                          instance holds it; ratio 0.1, min_per_second 10,
#                          window 10: the library defaults).
#     top-only             only the top layer retries; the others try once.
# load = attempts reaching the bottom ÷ top-level requests. The closed forms are
# attempts**depth, attempts, and about (1 + ratio)**depth plus the reserves.
# every-layer does attempts**depth calls per request and has no state, so it
# simulates only as many requests as keep that under WORK_LIMIT calls; a single
# request above WORK_LIMIT is refused rather than left running for minutes.
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._errors import ConfigError
from ..core._budget import RetryBudgetCore

__all__ = ["POLICIES", "LayersConfig", "LayersRow", "run", "run_policy"]

POLICIES = ("every-layer", "budget-every-layer", "top-only")
WORK_LIMIT = 200_000


@dataclass(frozen=True, slots=True)
class LayersConfig:
    """Parameters of the layers scenario."""

    requests: int = 1000
    rps: float = 100.0
    ratio: float = 0.1
    min_per_second: float = 10.0
    window: float = 10.0

    def __post_init__(self) -> None:
        if self.requests < 1 or not self.rps > 0:
            raise ConfigError("requests/rps", "requests must be >= 1 and rps > 0")


@dataclass(frozen=True, slots=True)
class LayersRow:
    """One line of layers.csv."""

    policy: str
    depth: int
    attempts: int
    load: float


def run_policy(policy: str, depth: int, attempts: int, config: LayersConfig) -> float:
    """Attempts reaching the bottom per top-level request."""
    if policy not in POLICIES:
        raise ConfigError("policy", f"expected one of {POLICIES}, got {policy!r}")
    if depth < 1 or attempts < 1:
        raise ConfigError("depth/attempts", "must be >= 1")
    budgets = (
        [
            RetryBudgetCore(
                ratio=config.ratio, min_per_second=config.min_per_second, window=config.window
            )
            for _ in range(depth)
        ]
        if policy == "budget-every-layer"
        else None
    )
    bottom = 0

    def call(layer: int, now: float) -> bool:
        nonlocal bottom
        if layer == depth:
            bottom += 1
            return False  # the bottom always fails
        tries = attempts if policy != "top-only" or layer == 0 else 1
        budget = budgets[layer] if budgets is not None else None
        for attempt in range(tries):
            if budget is not None:
                if attempt == 0:
                    budget.record_request(now)
                elif not budget.try_retry(now):
                    return False
            if call(layer + 1, now):
                return True
        return False

    requests = config.requests
    if policy == "every-layer":
        per_request = attempts**depth
        if per_request > WORK_LIMIT:
            raise ConfigError(
                "depth/attempts",
                f"every-layer would send {per_request:,} calls per request "
                f"(attempts**depth); the simulator stops at {WORK_LIMIT:,}",
            )
        requests = max(1, min(requests, WORK_LIMIT // per_request))
    for request in range(requests):
        call(0, request / config.rps)
    return bottom / requests


def run(
    config: LayersConfig,
    depth: int,
    attempts: int,
    *,
    policies: Sequence[str] = POLICIES,
    tick: Callable[[float], None] | None = None,
) -> list[LayersRow]:
    """Every policy at every depth from 1 to ``depth``."""
    rows = []
    for policy in policies:
        for level in range(1, depth + 1):
            load = run_policy(policy, level, attempts, config)
            rows.append(LayersRow(policy, level, attempts, load))
            if tick:
                tick(1.0)
    return rows
