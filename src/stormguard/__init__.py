"""stormguard: retries, rate limits, breakers and fault injection without retry storms.

``import stormguard`` needs only the standard library; adapters for httpx, requests
and Redis live in their own modules and name the extra to install when missing.
"""

from __future__ import annotations

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
)
from .client._decorator import retry
from .client._driver import RetryRecord
from .core._backoff import (
    Backoff,
    Constant,
    DecorrelatedJitter,
    EqualJitter,
    Exponential,
    FullJitter,
    NoBackoff,
)
from .core._policy import GiveUpReason, RetryPolicy

__version__ = "0.1.0"

__all__ = [
    "Backoff",
    "BulkheadFull",
    "CircuitOpen",
    "ConfigError",
    "Constant",
    "DecorrelatedJitter",
    "EqualJitter",
    "Exponential",
    "FullJitter",
    "GiveUpReason",
    "MissingExtra",
    "NoBackoff",
    "RateLimited",
    "RetryError",
    "RetryPolicy",
    "RetryRecord",
    "ScenarioError",
    "StoreError",
    "StormguardError",
    "retry",
]
