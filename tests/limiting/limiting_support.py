"""Shared helpers of the limiter tests (algorithms sized for counting, a harness)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from stormguard import (
    GCRA,
    AsyncRateLimiter,
    Concurrency,
    Decision,
    FixedWindow,
    RateLimiter,
    SlidingWindowCounter,
    SlidingWindowLog,
    TokenBucket,
)

# Quotas of 5 that do not refill while a test runs: tests count, never time.
LONG = 1_000_000.0
ALGORITHMS = {
    "token_bucket": lambda limit: TokenBucket(rate=limit / LONG, burst=limit),
    "gcra": lambda limit: GCRA(rate=limit / LONG, burst=limit),
    "sliding_window_log": lambda limit: SlidingWindowLog(limit, LONG),
    "sliding_window_counter": lambda limit: SlidingWindowCounter(limit, LONG),
    "fixed_window": lambda limit: FixedWindow(limit, LONG),
    "concurrency": lambda limit: Concurrency(limit, LONG),
}


async def maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def redis_keys(client: Any, pattern: str) -> list[bytes]:
    """KEYS on a Redis client, sync or async; on a cluster client, of every primary."""
    if hasattr(client, "get_primaries"):
        keys: list[bytes] = await maybe(client.keys(pattern, target_nodes=client.PRIMARIES))
    else:
        keys = await maybe(client.keys(pattern))
    return keys


async def drop_keys(client: Any, prefix: str) -> None:
    """Delete every key under ``prefix`` (sync or async client, single or cluster)."""
    keys = await redis_keys(client, prefix + "*")
    if keys:
        await maybe(client.delete(*keys))


class Harness:
    """Drives a sync or async limiter through one awaitable interface."""

    def __init__(self, limiter: RateLimiter | AsyncRateLimiter) -> None:
        self.limiter = limiter

    async def hit(self, key: str, cost: float = 1) -> Decision:
        result: Decision = await maybe(self.limiter.hit(key, cost))
        return result

    async def hit_many(self, items: Sequence[tuple[Harness, str]], cost: float = 1) -> Decision:
        pairs = [(h.limiter, k) for h, k in items]
        result: Decision = await maybe(type(self.limiter).hit_many(pairs, cost))  # type: ignore[arg-type]
        return result

    async def release(self, key: str, lease: Decision) -> None:
        await maybe(self.limiter.release(key, lease))

    async def renew(self, key: str, lease: Decision) -> bool:
        result: bool = await maybe(self.limiter.renew(key, lease))
        return result


Factory = Callable[..., Harness]
