"""Limiter fixtures: one harness over memory/redis x sync/async (the contract suite)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from limiting_support import Factory, Harness, maybe

from stormguard import AsyncRateLimiter, RateLimiter
from stormguard.stores import MemoryStore


@pytest.fixture(params=["memory-sync", "memory-async", "redis-sync", "redis-async"])
async def make_limiter(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[Factory]:
    """Build limiters on one store of the parametrized kind; cleans up its keys."""
    kind = request.param
    store: Any
    if kind.startswith("memory"):
        store = MemoryStore()
    else:
        from stormguard.stores import AsyncRedisStore, RedisStore

        url = request.getfixturevalue("redis_url")
        store = RedisStore(url, prefix=key_prefix) if kind == "redis-sync" else None
        if store is None:
            store = AsyncRedisStore(url, prefix=key_prefix)

    def factory(algorithm: Any, **kwargs: Any) -> Harness:
        cls = AsyncRateLimiter if kind.endswith("async") else RateLimiter
        return Harness(cls(algorithm, store, **kwargs))

    yield factory
    if kind.startswith("redis"):
        client = store.client
        keys = await maybe(client.keys(key_prefix + "*"))
        if keys:
            await maybe(client.delete(*keys))
        await maybe(store.close() if kind == "redis-sync" else store.aclose())
