"""Protection: circuit breaker, retry budget, bulkhead, per-origin cooldown and pacing.

The main names are re-exported from :mod:`stormguard`; this package holds the
runtime objects around the pure cores in :mod:`stormguard.core`.
"""

from __future__ import annotations

from ._breaker import CircuitBreaker
from ._budget import RetryBudget
from ._bulkhead import Bulkhead
from ._cooldown import Cooldown
from ._origin import OriginGuard, OriginGuards, origin_of, process_guards, reset_process_guards
from ._pacer import Pacer
from ._permit import BreakerEvent, Permit
from ._quota import RetryQuota, RetryThrottling

__all__ = [
    "BreakerEvent",
    "Bulkhead",
    "CircuitBreaker",
    "Cooldown",
    "OriginGuard",
    "OriginGuards",
    "Pacer",
    "Permit",
    "RetryBudget",
    "RetryQuota",
    "RetryThrottling",
    "origin_of",
    "process_guards",
    "reset_process_guards",
]
