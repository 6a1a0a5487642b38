"""Redis (Lua) and memory (Python core) agree hit for hit while no time passes."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from limiting_support import ALGORITHMS

from stormguard import RateLimiter
from stormguard.stores import MemoryStore

pytestmark = pytest.mark.redis
pytest.importorskip("redis")

hits = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 4)),  # (key, cost)
    min_size=1,
    max_size=25,
)


@pytest.fixture(scope="module")
def redis_store(redis_server: object) -> Iterator[object]:
    """One RedisStore for the module; every example uses fresh keys."""
    from stormguard.stores import RedisStore

    store = RedisStore(redis_server.url, prefix=f"sgtest:{uuid.uuid4().hex[:12]}:")  # type: ignore[attr-defined]
    yield store
    keys = store.client.keys(store.prefix + "*")
    if keys:
        store.client.delete(*keys)
    store.close()


@pytest.mark.parametrize("kind", sorted(ALGORITHMS))
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(quota=st.integers(1, 6), schedule=hits)
def test_lua_and_core_agree(
    redis_store: object, kind: str, quota: int, schedule: list[tuple[str, int]]
) -> None:
    """Same admissions and remaining quota on Redis as in memory, for any costs."""
    algorithm = ALGORITHMS[kind](quota)
    name = uuid.uuid4().hex
    shared = RateLimiter(algorithm, redis_store, name=name, on_store_error="closed")  # type: ignore[arg-type]
    local = RateLimiter(algorithm, MemoryStore(), name=name)
    for key, cost in schedule:
        remote, mine = shared.hit(key, cost), local.hit(key, cost)
        assert remote.allowed == mine.allowed, (key, cost)
        assert math.floor(remote.remaining + 1e-6) == math.floor(mine.remaining + 1e-6)
        assert (remote.retry_after == math.inf) == (mine.retry_after == math.inf)
    assert shared.stats.store_errors == 0
