"""Rate limiters: ``RateLimiter`` (sync) and ``AsyncRateLimiter`` around core's algorithms.

A limiter names a policy (an algorithm and a name) and asks its store to decide:
``MemoryStore`` in this process, ``RedisStore`` / ``AsyncRedisStore`` for a fleet.
Also exported at the top level (``stormguard.RateLimiter``).
"""

from __future__ import annotations

from ._limiter import AsyncRateLimiter, LimiterStats, OnStoreError, RateLimiter

__all__ = ["AsyncRateLimiter", "LimiterStats", "OnStoreError", "RateLimiter"]
