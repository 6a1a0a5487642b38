"""Redis Cluster stores: one slot per decision, slot-by-slot groups, cluster URLs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from limiting_support import LONG, drop_keys, redis_keys

from net_support import refused_port
from stormguard import AsyncRateLimiter, ConfigError, FixedWindow, RateLimiter
from stormguard.stores import AsyncRedisStore, RedisStore, from_url

pytestmark = pytest.mark.redis
pytest.importorskip("redis")


def test_fixture_cluster_serves_every_slot(redis_cluster_url: str) -> None:
    """The fixture's cluster answers with all 16384 slots covered by three masters."""
    from redis.cluster import RedisCluster

    port = int(redis_cluster_url.rsplit(":", 1)[1])
    client = RedisCluster(host="127.0.0.1", port=port)
    try:
        info = client.cluster_info()
        assert info["cluster_state"] == "ok"
        assert int(info["cluster_slots_assigned"]) == 16384
        assert len(client.get_primaries()) == 3
        client.set("{a}probe", 1)
        client.set("{b}probe", 2)
        assert client.mget("{a}probe") == [b"1"]
        client.delete("{a}probe", "{b}probe")
    finally:
        client.close()


@pytest.fixture
def store(redis_cluster_url: str, key_prefix: str) -> Iterator[RedisStore]:
    """A sync store on the cluster; its keys are removed afterwards."""
    store = RedisStore(redis_cluster_url, prefix=key_prefix, socket_timeout=5, connect_timeout=5)
    yield store
    asyncio.run(drop_keys(store.client, key_prefix))
    store.close()


def _count_scripts(monkeypatch: pytest.MonkeyPatch, cls: type[Any]) -> list[int]:
    """Count script calls (round trips) made through ``cls.run_script``."""
    calls: list[int] = []
    original = cls.run_script

    def counting(self: Any, name: str, keys: Any, args: Any) -> Any:
        calls.append(len(keys))
        return original(self, name, keys, args)

    monkeypatch.setattr(cls, "run_script", counting)
    return calls


@pytest.mark.parametrize("asyncio", [False, True])
def test_from_url_takes_a_cluster_url(redis_cluster_url: str, asyncio: bool) -> None:
    """`redis+cluster://host:port` gives a Redis store in cluster mode."""
    store = from_url(redis_cluster_url, asyncio=asyncio)
    assert isinstance(store, AsyncRedisStore if asyncio else RedisStore)
    assert store.cluster
    assert not from_url(redis_cluster_url.replace("+cluster", "")).cluster


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://127.0.0.1:notaport", "rediss+cluster://127.0.0.1:7000?socket_timeout=abc"],
)
def test_bad_cluster_url_is_a_config_error(url: str) -> None:
    """A malformed cluster URL raises ConfigError naming the url."""
    with pytest.raises(ConfigError, match="url"):
        RedisStore(url)


async def test_store_accepts_a_cluster_client_and_leaves_it_open(
    redis_cluster_url: str, key_prefix: str
) -> None:
    """A ready redis.cluster.RedisCluster works as the store's client; close() keeps it."""
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(redis_cluster_url.replace("+cluster", ""))
    try:
        with RedisStore(client, prefix=key_prefix) as store:
            assert store.cluster and store.client is client
            limiter = RateLimiter(FixedWindow(2, LONG), store, on_store_error="closed")
            assert [limiter.hit("k").allowed for _ in range(3)] == [True, True, False]
            assert limiter.stats.store_errors == 0
        assert client.ping()
        await drop_keys(client, key_prefix)
    finally:
        client.close()


async def test_async_store_accepts_a_cluster_client(
    redis_cluster_url: str, key_prefix: str
) -> None:
    """A ready redis.asyncio.cluster.RedisCluster works as the async store's client."""
    from redis.asyncio.cluster import RedisCluster

    client = RedisCluster.from_url(redis_cluster_url.replace("+cluster", ""))
    try:
        store = AsyncRedisStore(client, prefix=key_prefix)
        assert store.cluster
        limiter = AsyncRateLimiter(FixedWindow(1, LONG), store, on_store_error="closed")
        assert [(await limiter.hit("k")).allowed for _ in range(2)] == [True, False]
        await store.aclose()
        assert await client.ping()
        await drop_keys(client, key_prefix)
    finally:
        await client.aclose()


def test_limits_on_one_key_share_a_slot_and_a_round_trip(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-second, per-minute and per-day limits of one client: one script call."""
    from redis.crc import key_slot

    limiters = [
        RateLimiter(FixedWindow(limit, window), store, name=f"w{window}")
        for limit, window in [(5, 1), (50, 60), (500, 86400)]
    ]
    calls = _count_scripts(monkeypatch, RedisStore)
    assert RateLimiter.hit_many([(limiter, "user:42") for limiter in limiters]).allowed
    assert calls == [3]  # one script call, one key per limit
    keys = [k.decode() for k in asyncio.run(redis_keys(store.client, store.prefix + "*"))]
    assert len(keys) == 3 and len({key_slot(k.encode()) for k in keys}) == 1


@pytest.mark.parametrize(
    ("client_quota", "scripts"),
    [(5, 2), (0.5, 3)],  # allowed: one call per slot; refused by the client: + a refund
)
def test_client_and_global_pair_is_one_round_trip_per_slot(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch, client_quota: float, scripts: int
) -> None:
    """A per-client + global pair spans two slots: one call each, plus a refund if refused."""
    everyone = RateLimiter(FixedWindow(100, LONG), store, name="global")
    client = RateLimiter(FixedWindow(client_quota, LONG), store, name="client")
    calls = _count_scripts(monkeypatch, RedisStore)
    decision = RateLimiter.hit_many([(everyone, "all"), (client, "u1")])
    assert decision.allowed == (client_quota >= 1)
    assert len(calls) == scripts
    monkeypatch.undo()
    assert everyone.hit("all", 0).remaining == (99 if decision.allowed else 100)


async def test_async_tick_batch_is_one_call_per_slot(
    redis_cluster_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hits of one event-loop tick on many keys: one EVALSHA per slot, all decided."""
    from redis.crc import key_slot

    store = AsyncRedisStore(
        redis_cluster_url, prefix=key_prefix, socket_timeout=5, connect_timeout=5
    )
    limiter = AsyncRateLimiter(FixedWindow(1, LONG), store, on_store_error="closed")
    calls = _count_scripts(monkeypatch, AsyncRedisStore)
    keys = [f"client-{i % 12}" for i in range(24)]
    decisions = await asyncio.gather(*(limiter.hit(key) for key in keys))
    assert sum(d.allowed for d in decisions) == 12
    assert limiter.stats.store_errors == 0
    slots = {key_slot(store.key(key).encode()) for key in keys}
    assert len(calls) == len(slots)
    monkeypatch.undo()
    await drop_keys(store.client, key_prefix)
    await store.aclose()


def test_unreachable_cluster_follows_on_store_error() -> None:
    """A store made while the cluster is down raises nothing; hits follow on_store_error."""
    store = RedisStore(f"redis+cluster://127.0.0.1:{refused_port()}")
    limiter = RateLimiter(FixedWindow(5, LONG), store, on_store_error="closed")
    assert not limiter.hit("k").allowed
    assert limiter.stats.store_errors == 1
    store.close()


def test_cluster_store_repr_hides_the_password() -> None:
    """A cluster URL's password never shows in the store's repr (outage log lines)."""
    store = RedisStore("redis+cluster://user:s3cret@127.0.0.1:1")
    assert "s3cret" not in repr(store)
    assert "redis+cluster://" in repr(store)
    store.close()


def test_store_accepts_a_plain_redis_client(redis_url: str, key_prefix: str) -> None:
    """A ready redis.Redis works as the store's client (not a cluster); close() keeps it."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        with RedisStore(client, prefix=key_prefix) as store:
            assert not store.cluster
            limiter = RateLimiter(FixedWindow(1, LONG), store, on_store_error="closed")
            assert [limiter.hit("k").allowed for _ in range(2)] == [True, False]
        assert client.ping()
        asyncio.run(drop_keys(client, key_prefix))
    finally:
        client.close()
