"""Protection: circuit breaker, retry budget, bulkhead, per-origin cooldown and pacing,
and overload control (adaptive concurrency limit, admission control, adaptive throttling).

The main names are re-exported from :mod:`stormguard`; this package holds the
runtime objects around the pure cores in :mod:`stormguard.core`.
"""

from __future__ import annotations

from ._adaptive import AdaptiveLimit
from ._admission_control import AdmissionControl
from ._breaker import CircuitBreaker
from ._budget import RetryBudget
from ._bulkhead import Bulkhead
from ._cooldown import Cooldown
from ._origin import OriginGuard, OriginGuards, origin_of, process_guards, reset_process_guards
from ._pacer import Pacer
from ._permit import BreakerEvent, Permit
from ._quota import RetryQuota, RetryThrottling
from ._throttle import AdaptiveThrottle, ThrottledBreaker

__all__ = [
    "AdaptiveLimit",
    "AdaptiveThrottle",
    "AdmissionControl",
    "BreakerEvent",
    "Bulkhead",
    "CircuitBreaker",
    "Cooldown",
    "OriginGuard",
    "OriginGuards",
    "Pacer",
    "Permit",
    "RetryBudget",
    "ThrottledBreaker",
    "RetryQuota",
    "RetryThrottling",
    "origin_of",
    "process_guards",
    "reset_process_guards",
]
