"""Outage: Redis stops mid-run; every mode answers as documented and recovers."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from limiting_support import Harness

from stormguard import AsyncRateLimiter, FixedWindow, RateLimiter
from stormguard.testing import FakeClock

pytestmark = pytest.mark.redis
pytest.importorskip("redis")

LONG = 1_000_000.0


def _limiter(kind: str, url: str, mode: Any, clock: FakeClock) -> tuple[Harness, Any]:
    from stormguard.stores import AsyncRedisStore, RedisStore

    if kind == "sync":
        store: Any = RedisStore(url, instances=2, socket_timeout=5)
        limiter = RateLimiter(FixedWindow(10, LONG), store, on_store_error=mode, clock=clock)
        return Harness(limiter), store
    store = AsyncRedisStore(url, instances=2, socket_timeout=5)
    alimiter = AsyncRateLimiter(FixedWindow(10, LONG), store, on_store_error=mode, clock=clock)
    return Harness(alimiter), store


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    ("mode", "during"),
    [
        ("open", [True] * 8),
        ("closed", [False] * 8),
        # local: the quota of 10 divided by instances=2 -> 5 in this process.
        ("local", [True] * 5 + [False] * 3),
    ],
)
async def test_outage_follows_on_store_error_and_recovers(
    owned_redis: Any,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    mode: str,
    during: list[bool],
) -> None:
    """Mid-run stop: no exception escapes, one warning per outage, Redis used again after."""
    limiter, store = _limiter(kind, owned_redis.url, mode, clock)
    assert [(await limiter.hit("k")).allowed for _ in range(3)] == [True] * 3

    owned_redis.stop()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stormguard"):
        answers = []
        for _ in range(8):
            answers.append((await limiter.hit("k")).allowed)
            clock.advance(0.3)  # probes Redis again every retry_store_after (1 s)
        assert answers == during
        assert limiter.limiter.store_down
        failed = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(failed) == 1
        stats = limiter.limiter.stats
        assert stats.outages == 1
        assert stats.fallback_decisions == 8
        assert 1 <= stats.store_errors < 8

        owned_redis.start()
        clock.advance(1.0)
        back = await limiter.hit("k")
        assert not limiter.limiter.store_down
        assert any("is back" in r.getMessage() for r in caplog.records)
    # The restarted server is empty (no persistence): a fresh quota from Redis.
    assert back.allowed and back.remaining == 9
    if kind == "sync":
        store.close()
    else:
        await store.aclose()


async def test_group_outage_with_mixed_modes(owned_redis: Any, clock: FakeClock) -> None:
    """In a group, a "closed" limit denies the request; "open" and "local" parts take nothing."""
    from stormguard.stores import RedisStore

    with RedisStore(owned_redis.url, instances=1) as store:
        opened = RateLimiter(FixedWindow(5, LONG), store, name="a", clock=clock)
        local = RateLimiter(FixedWindow(2, LONG), store, name="b", on_store_error="local")
        closed = RateLimiter(FixedWindow(5, LONG), store, name="c", on_store_error="closed")
        owned_redis.stop()
        decision = RateLimiter.hit_many([(opened, "k"), (local, "k"), (closed, "k")])
        assert not decision.allowed
        assert [p.allowed for p in decision.parts] == [True, True, False]
        # Without the closed limit, local decides (2 per process) and open allows.
        results = [RateLimiter.hit_many([(opened, "k"), (local, "k")]).allowed for _ in range(3)]
        assert results == [True, True, False]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_each_limiter_counts_the_outages_it_saw(
    owned_redis: Any, clock: FakeClock, kind: str
) -> None:
    """Three limiters on one store through two outages: each counts two outages.

    (Issue 15 item 9: the outage record was the store's, so only the limiter that
    happened to fail first counted it; the others showed outages=0 next to their
    fallback decisions.)
    """
    from stormguard.stores import AsyncRedisStore, RedisStore

    cls_store: Any = RedisStore if kind == "sync" else AsyncRedisStore
    store = cls_store(owned_redis.url, socket_timeout=5)
    cls: Any = RateLimiter if kind == "sync" else AsyncRateLimiter
    limiters = [
        Harness(cls(FixedWindow(100, LONG), store, name=f"l{i}", clock=clock)) for i in range(3)
    ]
    for _ in range(2):
        for limiter in limiters:
            assert (await limiter.hit("k")).allowed
        owned_redis.stop()
        for _ in range(4):
            for limiter in limiters:
                assert (await limiter.hit("k")).allowed  # on_store_error="open"
            clock.advance(0.5)
        owned_redis.start()
        clock.advance(1.0)
    for limiter in limiters:
        assert (await limiter.hit("k")).allowed
    stats = [limiter.limiter.stats for limiter in limiters]
    assert [s.outages for s in stats] == [2, 2, 2]
    assert [s.fallback_decisions for s in stats] == [8, 8, 8]
    assert all(2 <= s.store_errors <= 8 for s in stats)
    assert not any(s.degraded for s in stats)
    if kind == "sync":
        store.close()
    else:
        await store.aclose()
