"""Redis Sentinel stores: URLs, the master the sentinels name, and failover outages."""

from __future__ import annotations

import time
from typing import Any

import pytest

from stormguard import AsyncRateLimiter, ConfigError, FixedWindow, RateLimiter
from stormguard.stores import AsyncRedisStore, RedisStore, from_url
from stormguard.stores._sentinel import parse_sentinel_url
from stormguard.testing import FakeClock

pytestmark = pytest.mark.redis
pytest.importorskip("redis")

LONG = 1_000_000.0


@pytest.mark.parametrize(
    ("url", "sentinels", "master", "db"),
    [
        ("redis+sentinel://a:26379/m", (("a", 26379),), "m", 0),
        (
            "redis+sentinel://a:1,b:2,[::1]:3/mymaster/4",
            (("a", 1), ("b", 2), ("::1", 3)),
            "mymaster",
            4,
        ),
        ("redis+sentinel://h/m/", (("h", 26379),), "m", 0),
    ],
)
def test_sentinel_urls_name_sentinels_master_and_db(
    url: str, sentinels: tuple[tuple[str, int], ...], master: str, db: int
) -> None:
    """HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB] is split into its parts."""
    parts = parse_sentinel_url(url)
    assert (parts.sentinels, parts.master, parts.db) == (sentinels, master, db)


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://a:26379",  # no master name
        "redis+sentinel://a:x/m",  # a port that is not a number
        "redis+sentinel://a:1/m/db",  # a database that is not a number
        "redis+sentinel://a:1/m/0/extra",
        "redis+sentinel://:1/m",  # no host
    ],
)
@pytest.mark.parametrize("asyncio", [False, True])
def test_malformed_sentinel_urls_fail_naming_the_url(url: str, asyncio: bool) -> None:
    """A bad Sentinel URL is a ConfigError on the url, at construction."""
    with pytest.raises(ConfigError, match="url"):
        from_url(url, asyncio=asyncio)


def test_credentials_are_the_masters_and_hidden_in_repr() -> None:
    """A password in the URL goes to the master's connections and never into repr."""
    parts = parse_sentinel_url("redis+sentinel://user:s3cret@a:1,b:2/m/1")
    assert (parts.username, parts.password) == ("user", "s3cret")
    store = RedisStore("redis+sentinel://user:s3cret@127.0.0.1:1,127.0.0.1:2/m/1")
    assert "s3cret" not in repr(store) and "127.0.0.1:1,127.0.0.1:2/m/1" in repr(store)
    assert store.client.connection_pool.connection_kwargs["password"] == "s3cret"


@pytest.mark.parametrize("asyncio", [False, True])
async def test_from_url_reaches_the_master_the_sentinels_name(
    redis_sentinel: Any, key_prefix: str, asyncio: bool
) -> None:
    """Decisions through a Sentinel URL land on the master (seen there with KEYS)."""
    import redis

    store = from_url(redis_sentinel.url, asyncio=asyncio, prefix=key_prefix)
    limiter: Any = (AsyncRateLimiter if asyncio else RateLimiter)(FixedWindow(2, LONG), store)
    answers = []
    for _ in range(3):
        decision = limiter.hit("k")
        answers.append((await decision if asyncio else decision).allowed)
    assert answers == [True, True, False]
    master = redis.Redis(port=redis_sentinel.master_port())
    assert master.keys(key_prefix + "*")
    master.delete(*master.keys(key_prefix + "*"))
    master.close()
    if asyncio:
        await store.aclose()  # type: ignore[union-attr]
    else:
        store.close()  # type: ignore[union-attr]


def _limiter(kind: str, url: str, mode: str, clock: FakeClock) -> tuple[Any, Any]:
    if kind == "sync":
        store: Any = RedisStore(url, instances=2, socket_timeout=2, connect_timeout=2)
        return RateLimiter(FixedWindow(6, LONG), store, on_store_error=mode, clock=clock), store  # type: ignore[arg-type]
    store = AsyncRedisStore(url, instances=2, socket_timeout=2, connect_timeout=2)
    return AsyncRateLimiter(FixedWindow(6, LONG), store, on_store_error=mode, clock=clock), store  # type: ignore[arg-type]


async def _hit(limiter: Any) -> bool:
    decision = limiter.hit("k")
    if isinstance(limiter, AsyncRateLimiter):
        decision = await decision
    return bool(decision.allowed)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(("mode", "during"), [("open", True), ("closed", False)])
async def test_failover_follows_on_store_error_then_the_new_master_keeps_the_count(
    owned_sentinel: Any, clock: FakeClock, kind: str, mode: str, during: bool
) -> None:
    """Master killed: answers follow on_store_error; once a replica is promoted the
    limiter rejoins it, and the count replicated before the failover still holds."""
    import redis

    limiter, store = _limiter(kind, owned_sentinel.url, mode, clock)
    assert [await _hit(limiter) for _ in range(4)] == [True] * 4
    master = redis.Redis(port=owned_sentinel.master.port)
    assert master.wait(1, 5000) == 1  # the replica has the four hits
    master.close()
    owned_sentinel.master.stop()
    # Until a replica is promoted (the sentinels wait a second before they agree the
    # master is down), every answer is the outage mode's; none raises.
    assert await _hit(limiter) is during
    assert limiter.store_down
    assert owned_sentinel.promoted() == owned_sentinel.replica.port
    deadline = time.monotonic() + 30
    while limiter.store_down:
        clock.advance(1.1)  # a probe of the store is due (retry_store_after)
        allowed = await _hit(limiter)
        assert time.monotonic() < deadline, "the limiter never rejoined the new master"
    # Rejoined on the promoted replica: 4 replicated hits + the probe that succeeded.
    assert allowed
    assert [await _hit(limiter) for _ in range(2)] == [True, False]
    if kind == "async":
        await store.aclose()
    else:
        store.close()
