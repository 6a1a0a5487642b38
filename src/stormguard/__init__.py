"""stormguard: retries, rate limits, breakers and fault injection without retry storms.

``import stormguard`` needs only the standard library; adapters for httpx, requests
and Redis live in their own modules and name the extra to install when missing.
"""

from __future__ import annotations

import logging

from ._errors import (
    BulkheadFull,
    CircuitOpen,
    ConfigError,
    MissingExtra,
    RateLimited,
    RetryError,
    ScenarioError,
    StoreError,
    StormguardError,
    Throttled,
)
from .client._attempt import attempt_headers, current_attempt
from .client._context import Attempt, Retrying, retrying
from .client._decorator import retry
from .client._driver import RetryRecord
from .core._attempts import attempt_number
from .core._backoff import (
    Backoff,
    Constant,
    DecorrelatedJitter,
    EqualJitter,
    Exponential,
    FullJitter,
    NoBackoff,
)
from .core._body_hints import wait_hint_from_body
from .core._headers import Quota, parse_rate_limits, parse_retry_after, wait_hint
from .core._hedge import HedgePolicy
from .core._limiters import (
    GCRA,
    Concurrency,
    Decision,
    FixedWindow,
    SlidingWindowCounter,
    SlidingWindowLog,
    TokenBucket,
)
from .core._policy import GiveUpReason, RetryPolicy
from .core._priority import Priority
from .limiting import AsyncRateLimiter, RateLimiter
from .protection import (
    AdaptiveLimit,
    AdaptiveThrottle,
    AdmissionControl,
    BreakerEvent,
    Bulkhead,
    CircuitBreaker,
    Cooldown,
    Pacer,
    RetryBudget,
    RetryQuota,
    RetryThrottling,
)

__version__ = "0.1.0"

__all__ = [
    "AdaptiveLimit",
    "AdaptiveThrottle",
    "AdmissionControl",
    "AsyncRateLimiter",
    "Attempt",
    "Backoff",
    "BreakerEvent",
    "Bulkhead",
    "BulkheadFull",
    "CircuitBreaker",
    "CircuitOpen",
    "Concurrency",
    "ConfigError",
    "Constant",
    "Cooldown",
    "Decision",
    "DecorrelatedJitter",
    "EqualJitter",
    "Exponential",
    "FixedWindow",
    "FullJitter",
    "GCRA",
    "GiveUpReason",
    "HedgePolicy",
    "MissingExtra",
    "NoBackoff",
    "Pacer",
    "Priority",
    "Quota",
    "RateLimited",
    "RateLimiter",
    "RetryBudget",
    "RetryError",
    "RetryPolicy",
    "RetryQuota",
    "RetryRecord",
    "RetryThrottling",
    "Retrying",
    "ScenarioError",
    "SlidingWindowCounter",
    "SlidingWindowLog",
    "StoreError",
    "StormguardError",
    "Throttled",
    "TokenBucket",
    "attempt_headers",
    "attempt_number",
    "current_attempt",
    "parse_rate_limits",
    "parse_retry_after",
    "retry",
    "retrying",
    "wait_hint",
    "wait_hint_from_body",
]

# Quiet by default: a library never prints through Python's last-resort handler
# (a breaker opening would otherwise reach stderr when logging is not configured).
# Applications that configure logging see every record as before.
logging.getLogger("stormguard").addHandler(logging.NullHandler())
