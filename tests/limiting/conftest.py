"""Limiter fixtures: one harness over memory/Redis/Redis Cluster/Sentinel x sync/async
(the contract suite)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from limiting_support import Factory, Harness, drop_keys, maybe

from stormguard import AsyncRateLimiter, RateLimiter
from stormguard.stores import MemoryStore

KINDS = [
    "memory-sync",
    "memory-async",
    "redis-sync",
    "redis-async",
    "cluster-sync",
    "cluster-async",
    "sentinel-sync",
    "sentinel-async",
]
_URL_FIXTURES = {"redis": "redis_url", "cluster": "redis_cluster_url", "sentinel": "sentinel_url"}


@pytest.fixture
def sentinel_url(redis_sentinel: Any) -> str:
    """The session Sentinel set's ``redis+sentinel://`` URL."""
    return str(redis_sentinel.url)


@pytest.fixture(params=KINDS)
async def make_limiter(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[Factory]:
    """Build limiters on one store of the parametrized kind; cleans up its keys."""
    kind = request.param
    store: Any
    if kind.startswith("memory"):
        store = MemoryStore()
    else:
        from stormguard.stores import AsyncRedisStore, RedisStore

        pytest.importorskip("redis")
        url = request.getfixturevalue(_URL_FIXTURES[kind.partition("-")[0]])
        cls = AsyncRedisStore if kind.endswith("async") else RedisStore
        # Generous timeouts: these tests check decisions, and a loaded CI host must
        # not turn a slow reply into an on_store_error answer.
        store = cls(url, prefix=key_prefix, socket_timeout=5, connect_timeout=5)

    def factory(algorithm: Any, **kwargs: Any) -> Harness:
        cls = AsyncRateLimiter if kind.endswith("async") else RateLimiter
        return Harness(cls(algorithm, store, **kwargs))

    yield factory
    if not kind.startswith("memory"):
        await drop_keys(store.client, key_prefix)
        await maybe(store.aclose() if kind.endswith("async") else store.close())
