"""The public surface: every promised name exists, __all__ is sorted and importable."""

from __future__ import annotations

import importlib

import pytest

import stormguard

# Names DESIGN.md promises to users. Add to this list; never remove from it.
PROMISED = {
    "stormguard": [
        "AdaptiveLimit",
        "AdaptiveThrottle",
        "AdmissionControl",
        "AsyncRateLimiter",
        "Bulkhead",
        "CircuitBreaker",
        "CircuitOpen",
        "Concurrency",
        "Constant",
        "Cooldown",
        "Decision",
        "DecorrelatedJitter",
        "EqualJitter",
        "Exponential",
        "FixedWindow",
        "FullJitter",
        "GCRA",
        "HedgePolicy",
        "NoBackoff",
        "Pacer",
        "Priority",
        "Quota",
        "RateLimiter",
        "RetryBudget",
        "RetryError",
        "RetryPolicy",
        "RetryQuota",
        "RetryThrottling",
        "SlidingWindowCounter",
        "SlidingWindowLog",
        "Throttled",
        "TokenBucket",
        "attempt_headers",
        "attempt_number",
        "current_attempt",
        "parse_rate_limits",
        "parse_retry_after",
        "retry",
        "wait_hint",
    ],
    "stormguard.httpx": ["HedgingTransport", "RetryTransport"],
    "stormguard.requests": ["RetryAdapter"],
    "stormguard.grpc": [
        "AsyncHedgingInterceptor",
        "AsyncRateLimitServerInterceptor",
        "AsyncRetryInterceptor",
        "HedgingInterceptor",
        "RateLimitServerInterceptor",
        "RetryInterceptor",
        "channel_options",
    ],
    "stormguard.asgi": [
        "ConcurrencyMiddleware",
        "IdempotencyMiddleware",
        "OverloadControl",
        "OverloadMiddleware",
        "RateLimitMiddleware",
        "Rule",
        "WebSocketLimits",
    ],
    "stormguard.fastapi": ["install", "limit", "stormguard_limit"],
    "stormguard.protection": [
        "AdaptiveLimit",
        "AdaptiveThrottle",
        "AdmissionControl",
        "BreakerEvent",
        "Bulkhead",
        "CircuitBreaker",
        "Cooldown",
        "Pacer",
        "Permit",
        "RetryBudget",
        "ThrottledBreaker",
        "RetryQuota",
        "RetryThrottling",
        "reset_process_guards",
    ],
    "stormguard.limiting": ["AsyncRateLimiter", "LimiterStats", "RateLimiter"],
    "stormguard.stores": ["AsyncRedisStore", "MemoryStore", "RedisStore", "from_url"],
    "stormguard.testing": ["FakeClock", "MockFactory", "MockServer"],
    "stormguard.mock": [
        "Checker",
        "MockServer",
        "Report",
        "Violation",
        "check_journal",
        "load_scenario",
        "vendor_scenario",
    ],
}


@pytest.mark.parametrize("module_name", sorted(PROMISED))
def test_promised_names_are_exported(module_name: str) -> None:
    """Each promised name is in the module's __all__ and importable from it."""
    module = importlib.import_module(module_name)
    missing = [name for name in PROMISED[module_name] if name not in module.__all__]
    assert missing == []
    for name in PROMISED[module_name]:
        assert getattr(module, name) is not None


def test_all_is_sorted_and_importable() -> None:
    """stormguard.__all__ is sorted, without duplicates, and every name resolves."""
    names = list(stormguard.__all__)
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(stormguard, name), name


def test_public_objects_say_where_they_live() -> None:
    """Public classes and functions are documented."""
    undocumented = [
        name for name in stormguard.__all__ if not (getattr(stormguard, name).__doc__ or "").strip()
    ]
    assert undocumented == []
