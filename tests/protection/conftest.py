"""Fixtures of the protection tests: every shared object's store, under a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from protection_support import StoreFactory, fake_time_redis_store

from stormguard.stores import MemoryStore
from stormguard.testing import FakeClock


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.redis),
    ]
)
def shared_store(
    request: pytest.FixtureRequest, clock: FakeClock, key_prefix: str
) -> Iterator[StoreFactory]:
    """A factory of store handles that share state (another process's view of one store).

    Memory: the same MemoryStore every time. Redis (a single server, or the session's
    three-node Redis Cluster): a new RedisStore under one unique prefix, its scripts
    on the fake clock.
    """
    if request.param == "memory":
        store = MemoryStore(clock=clock)
        yield lambda: store
        return
    pytest.importorskip("redis")
    url: str = request.getfixturevalue(
        "redis_cluster_url" if request.param == "cluster" else "redis_url"
    )
    opened: list[Any] = []

    def make() -> Any:
        store = fake_time_redis_store(url, key_prefix, clock)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()
