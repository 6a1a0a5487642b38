"""RedisStore specifics: one round trip, hash tags, expiry, NOSCRIPT, error mapping."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest

from stormguard import (
    GCRA,
    AsyncRateLimiter,
    Concurrency,
    FixedWindow,
    RateLimiter,
    SlidingWindowCounter,
    SlidingWindowLog,
    StoreError,
    TokenBucket,
)
from stormguard.stores import AsyncRedisStore, RedisStore, from_url

pytestmark = pytest.mark.redis
redis = pytest.importorskip("redis")

ALL = [
    TokenBucket(1, 5),
    GCRA(1, 5),
    SlidingWindowLog(5, 60),
    SlidingWindowCounter(5, 60),
    FixedWindow(5, 60),
    Concurrency(5, 60),
]


@pytest.fixture
def store(redis_url: str, key_prefix: str) -> Iterator[RedisStore]:
    """A RedisStore on the shared server; deletes its keys afterwards."""
    store = RedisStore(redis_url, prefix=key_prefix, socket_timeout=5)
    yield store
    keys = store.client.keys(key_prefix + "*")
    if keys:
        store.client.delete(*keys)
    store.close()


def _count_commands(store: RedisStore) -> list[str]:
    """Record every command this thread's connection writes to the socket."""
    sent: list[str] = []
    conn = store._connection()
    send = conn.send_command

    def counting(*args: Any, **kwargs: Any) -> Any:
        sent.append(str(args[0]))
        return send(*args, **kwargs)

    conn.send_command = counting
    return sent


def test_several_limits_are_one_round_trip(store: RedisStore) -> None:
    """Deciding six limits together sends exactly one command: EVALSHA."""
    limiters = [RateLimiter(a, store) for a in ALL]
    RateLimiter.hit_many([(limiter, "warm") for limiter in limiters])  # loads the script
    sent = _count_commands(store)
    for i in range(5):
        RateLimiter.hit_many([(limiter, f"client-{i}") for limiter in limiters])
        limiters[0].hit(f"client-{i}")
    assert sent == ["EVALSHA"] * 10


def test_keys_carry_a_hash_tag_and_expire(store: RedisStore, key_prefix: str) -> None:
    """Every key is `prefix{key}:name[:aux]`: one client's limits share a slot; all expire."""
    from redis.crc import key_slot

    limiters = [RateLimiter(a, store) for a in ALL]
    RateLimiter.hit_many([(limiter, "user:42") for limiter in limiters])
    keys = [k.decode() for k in store.client.keys(key_prefix + "*")]
    assert len(keys) >= len(ALL)
    for key in keys:
        assert key.startswith(key_prefix + "{user:42}:")
        ttl = store.client.pttl(key)
        assert 0 < ttl <= 2 * 60_000 + 1000  # sliding counter: two windows
    assert len({key_slot(key.encode()) for key in keys}) == 1


def test_key_builds_a_prefixed_hash_tag(store: RedisStore, key_prefix: str) -> None:
    """key(*parts) joins the parts inside one hash tag after the prefix."""
    assert store.key("breaker", "payments") == f"{key_prefix}{{breaker:payments}}"


def test_noscript_falls_back_to_eval(owned_redis: Any) -> None:
    """After SCRIPT FLUSH (or a server restart) the next hit still succeeds."""
    with RedisStore(owned_redis.url) as store:
        limiter = RateLimiter(FixedWindow(2, 60), store)
        assert limiter.hit("k").allowed
        store.client.script_flush()
        assert limiter.hit("k").allowed
        assert not limiter.hit("k").allowed
        assert not limiter.store_down


def test_redis_errors_surface_as_store_errors(store: RedisStore) -> None:
    """A script error and a dead server both raise StoreError, never a redis error."""
    with pytest.raises(StoreError) as info:
        store.run_script("limit", [], ["no-such-mode"])
    assert isinstance(info.value.__cause__, redis.RedisError)
    dead = RedisStore("redis://127.0.0.1:1/0")
    with pytest.raises(StoreError):
        dead.run_script("limit", [], ["hit", 0])
    with pytest.raises(StoreError):
        dead.decide([])


async def test_async_redis_errors_surface_as_store_errors() -> None:
    """The async store maps connection failures to StoreError too."""
    dead = AsyncRedisStore("redis://127.0.0.1:1/0")
    with pytest.raises(StoreError):
        await dead.run_script("limit", [], ["hit", 0])
    await dead.aclose()


def test_limiter_on_a_dead_redis_does_not_raise() -> None:
    """A limiter whose Redis is unreachable answers by on_store_error, not an exception."""
    dead = RedisStore("redis://127.0.0.1:1/0")
    assert RateLimiter(FixedWindow(1, 1), dead).hit("k").allowed
    assert not RateLimiter(FixedWindow(1, 1), dead, on_store_error="closed").hit("k").allowed


def test_from_url_builds_redis_stores(redis_url: str) -> None:
    """from_url picks the Redis stores for redis:// (asyncio=True for the async one)."""
    sync_store = from_url(redis_url, prefix="x:")
    async_store = from_url(redis_url, asyncio=True)
    assert isinstance(sync_store, RedisStore) and sync_store.prefix == "x:"
    assert isinstance(async_store, AsyncRedisStore)
    assert isinstance(from_url("rediss://127.0.0.1:6380/0"), RedisStore)
    sync_store.close()


def test_repr_hides_the_password_and_bad_urls_are_config_errors() -> None:
    """Log lines show the store without its password; a malformed URL fails at once."""
    from stormguard import ConfigError

    store = RedisStore("redis://user:s3cret@127.0.0.1:1/0")
    assert "s3cret" not in repr(store)
    with pytest.raises(ConfigError, match="url"):
        RedisStore("redis://127.0.0.1:notaport/0")


def test_sync_and_async_stores_are_not_mixed_up(redis_url: str) -> None:
    """A sync limiter refuses an async store and vice versa, at construction."""
    from stormguard import ConfigError

    with pytest.raises(ConfigError, match="store"):
        RateLimiter(FixedWindow(1, 1), AsyncRedisStore(redis_url))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="store"):
        AsyncRateLimiter(FixedWindow(1, 1), RedisStore(redis_url))  # type: ignore[arg-type]


def test_timeouts_are_bounded_by_default(redis_url: str) -> None:
    """Connect and read timeouts default to 0.25 s and redis-py retries are off."""
    store = RedisStore(redis_url)
    kwargs = store.client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.25
    assert kwargs["socket_connect_timeout"] == 0.25
    assert kwargs["retry"].get_retries() == 0
    store.close()


def test_lua_scripts_ship_as_package_data() -> None:
    """Each algorithm's Lua file is readable through importlib.resources."""
    lua = resources.files("stormguard.stores").joinpath("lua")
    names = {p.name for p in lua.iterdir()}
    for algorithm in ALL:
        assert f"{algorithm.kind}.lua" in names
    assert "limit.lua" in names


async def _evalsha_calls(client: Any) -> int:
    """EVALSHA commands the server ran so far (INFO commandstats)."""
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_async_hits_in_one_tick_share_a_round_trip(owned_redis: Any, key_prefix: str) -> None:
    """Concurrent async hits are coalesced; each group is still decided exactly."""
    # Generous timeouts: with max_batch=1 twenty batches queue at once, and on a
    # loaded machine one may take longer than the default 0.25 s (the local
    # fallback would then decide, which is not what this test is about).
    patient = {"socket_timeout": 5.0, "connect_timeout": 5.0}
    import asyncio

    async with AsyncRedisStore(owned_redis.url, prefix=key_prefix, **patient) as store:
        assert store.own_connection
        before = await _evalsha_calls(store.client)
        limiter = AsyncRateLimiter(TokenBucket(0.001, 50), store)
        decisions = await asyncio.gather(*(limiter.hit("hot") for _ in range(200)))
        assert sum(d.allowed for d in decisions) == 50
        calls = await _evalsha_calls(store.client) - before
        assert 1 <= calls <= 4  # 200 hits in batches of at most 128
    async with AsyncRedisStore(owned_redis.url, prefix=key_prefix, max_batch=1, **patient) as store:
        before = await _evalsha_calls(store.client)
        limiter = AsyncRateLimiter(TokenBucket(0.001, 5), store)
        decisions = await asyncio.gather(*(limiter.hit("other") for _ in range(20)))
        assert sum(d.allowed for d in decisions) == 5
        assert await _evalsha_calls(store.client) - before == 20  # one EVALSHA each


async def test_async_store_decides_groups_in_one_call(redis_url: str, key_prefix: str) -> None:
    """AsyncRedisStore decides a group all or nothing."""
    async with AsyncRedisStore(redis_url, prefix=key_prefix) as store:
        tight = AsyncRateLimiter(FixedWindow(1, 60), store, name="tight")
        loose = AsyncRateLimiter(FixedWindow(9, 60), store, name="loose")
        assert (await AsyncRateLimiter.hit_many([(tight, "k"), (loose, "k")])).allowed
        assert not (await AsyncRateLimiter.hit_many([(tight, "k"), (loose, "k")])).allowed
        assert (await loose.hit("k", 0)).remaining == 8
        keys = await store.client.keys(key_prefix + "*")
        await store.client.delete(*keys)


def test_decisions_use_redis_time_not_the_client_clock(store: RedisStore) -> None:
    """A limiter's own clock (even far off) does not change Redis-backed decisions."""
    from stormguard.testing import FakeClock

    skewed = RateLimiter(TokenBucket(0.001, 2), store, clock=FakeClock(1e9))
    honest = RateLimiter(TokenBucket(0.001, 2), store)
    assert skewed.hit("k").allowed
    assert honest.hit("k").allowed
    assert not skewed.hit("k").allowed
