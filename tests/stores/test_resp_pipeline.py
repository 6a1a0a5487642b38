"""The async store's own Redis connection and its batching, on redis-servers the
tests start: timeouts that measure Redis (not this process), the flush policy,
reconnects, NOSCRIPT, AUTH and SELECT."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from stormguard import AsyncRateLimiter, FixedWindow, TokenBucket
from stormguard.core._limiters import LimitRequest
from stormguard.stores import AsyncRedisStore
from stormguard.stores._resp import Target, connect, pack

pytestmark = pytest.mark.redis
pytest.importorskip("redis")
pytest.importorskip("hiredis")

LONG = 1_000_000.0
# Busy Redis for ARGV[1] milliseconds inside one command (it answers nobody meanwhile).
BUSY = (
    "local t = redis.call('TIME'); local start = t[1] * 1000 + t[2] / 1000; "
    "repeat t = redis.call('TIME') until t[1] * 1000 + t[2] / 1000 - start >= tonumber(ARGV[1]) "
    "return 1"
)


@pytest.fixture
def redis_proc() -> Iterator[Any]:
    """A redis-server of this test's own (it may be stopped, flushed, made busy)."""
    from redis_support import RedisProcess

    server = RedisProcess()
    try:
        server.start()
    except (FileNotFoundError, RuntimeError) as exc:
        pytest.skip(f"no redis-server: {exc}")
    yield server
    server.discard()


async def _evalsha_calls(port: int) -> int:
    from redis_support import command

    stats = command(port, "INFO", "commandstats").decode()
    for line in stats.splitlines():
        if line.startswith("cmdstat_evalsha:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


async def test_a_busy_redis_that_keeps_answering_is_not_timed_out(redis_proc: Any) -> None:
    """Another client keeps Redis busy 150 ms at a time (alive, not dead); with a
    0.25 s timeout every decision of a concurrent stream is answered by Redis."""
    import threading

    from redis_support import command

    stop = threading.Event()

    def stall() -> None:
        while not stop.is_set():
            command(redis_proc.port, "EVAL", f'"{BUSY}"', "0", "150")

    staller = threading.Thread(target=stall)
    async with AsyncRedisStore(redis_proc.url, socket_timeout=0.25, connect_timeout=1) as store:
        limiter = AsyncRateLimiter(FixedWindow(1000, LONG), store, on_store_error="closed")
        assert (await limiter.hit("k")).allowed
        staller.start()
        try:
            decisions = []
            for _ in range(15):  # waves of concurrent hits, 1.5 s in all
                wave = [limiter.hit("k") for _ in range(20)]
                decisions += await asyncio.gather(*wave)
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            staller.join()
    assert all(d.allowed for d in decisions)
    assert limiter.stats.store_errors == 0


async def test_pipelined_commands_answered_within_the_timeout_all_arrive(redis_proc: Any) -> None:
    """The connection hands each reply to its own callback, in order, however many
    commands are written at once."""
    loop = asyncio.get_running_loop()
    conn = await connect(
        loop, Target(redis_proc.url), [], connect_timeout=2, reply_timeout=1, on_lost=lambda: None
    )
    replies: list[Any] = []
    done = loop.create_future()

    def got(reply: Any) -> None:
        replies.append(reply)
        if len(replies) == 50:
            done.set_result(None)

    conn.send(b"".join(pack([b"ECHO", b"%d" % i]) for i in range(50)), [got] * 50)
    await asyncio.wait_for(done, 10)
    assert replies == [b"%d" % i for i in range(50)]
    conn.close()


async def test_a_stopped_redis_fails_the_batch_then_the_store_reconnects(redis_proc: Any) -> None:
    """A Redis that stops answering fails the waiting decisions with StoreError (no
    hang); once it answers again the next decision uses a fresh connection."""
    async with AsyncRedisStore(redis_proc.url, socket_timeout=0.2, connect_timeout=1) as store:
        assert store.own_connection
        limiter = AsyncRateLimiter(FixedWindow(5, LONG), store, on_store_error="closed")
        assert (await limiter.hit("k")).allowed
        assert redis_proc.proc is not None
        os.kill(redis_proc.proc.pid, signal.SIGSTOP)
        try:
            refused = await asyncio.wait_for(limiter.hit("k"), 5)
            assert not refused.allowed and limiter.store_down  # closed mode: the outage answer
        finally:
            os.kill(redis_proc.proc.pid, signal.SIGCONT)
        assert limiter.stats.store_errors >= 1
        # Answering again: the store's next call goes out on a new connection.
        decisions = await asyncio.wait_for(
            store.adecide([LimitRequest(FixedWindow(5, LONG), "k2", "fw")]), 5
        )
        assert decisions[0].allowed and decisions[0].remaining == 4


async def test_decisions_of_one_pass_share_a_batch_and_later_ones_wait_for_its_reply(
    redis_proc: Any,
) -> None:
    """Hits of one loop pass go out as one EVALSHA; hits made while it is in flight go
    out together when its reply arrives: two EVALSHAs for two waves."""
    from redis_support import command

    async with AsyncRedisStore(redis_proc.url, socket_timeout=5, connect_timeout=5) as store:
        limiter = AsyncRateLimiter(TokenBucket(1e-6, 100), store)
        await limiter.hit("warm")  # connected, script loaded
        before = await _evalsha_calls(redis_proc.port)
        loop = asyncio.get_running_loop()
        # Redis is busy for 300 ms: the first wave's batch stays in flight meanwhile.
        busy = loop.run_in_executor(None, command, redis_proc.port, "EVAL", f'"{BUSY}"', "0", "300")
        await asyncio.sleep(0.05)
        first = [asyncio.ensure_future(limiter.hit("a")) for _ in range(5)]
        await asyncio.sleep(0.05)  # the first batch is out, waiting for Redis
        second = [asyncio.ensure_future(limiter.hit("b")) for _ in range(7)]
        decisions = await asyncio.gather(*first, *second)
        await busy
        assert all(d.allowed for d in decisions)
        assert await _evalsha_calls(redis_proc.port) - before == 2


async def test_a_flushed_script_is_loaded_again(redis_proc: Any) -> None:
    """After SCRIPT FLUSH the next batch answers NOSCRIPT, is sent again, and decides."""
    from redis_support import command

    async with AsyncRedisStore(redis_proc.url, socket_timeout=5) as store:
        limiter = AsyncRateLimiter(FixedWindow(2, LONG), store)
        assert (await limiter.hit("k")).allowed
        assert b"OK" in command(redis_proc.port, "SCRIPT", "FLUSH")
        assert (await limiter.hit("k")).allowed
        assert not (await limiter.hit("k")).allowed
        assert not limiter.store_down


async def test_password_and_database_of_the_url_are_used() -> None:
    """redis://:PASSWORD@host:port/3: the own connection authenticates and selects db 3."""
    from redis_support import RedisProcess, command

    server = RedisProcess(password="s3cret")
    try:
        server.start()
    except (FileNotFoundError, RuntimeError) as exc:
        pytest.skip(f"no redis-server: {exc}")
    try:
        url = f"redis://:s3cret@127.0.0.1:{server.port}/3"
        async with AsyncRedisStore(url, prefix="pw:", socket_timeout=5) as store:
            assert store.own_connection
            limiter = AsyncRateLimiter(FixedWindow(1, LONG), store, on_store_error="closed")
            assert (await limiter.hit("k")).allowed
            assert not (await limiter.hit("k")).allowed
            assert not limiter.store_down
        raw = command(server.port, "INFO", "keyspace", password="s3cret")
        assert b"db3:keys=1" in raw
        wrong = AsyncRedisStore(f"redis://:nope@127.0.0.1:{server.port}/0", socket_timeout=1)
        limiter = AsyncRateLimiter(FixedWindow(1, LONG), wrong, on_store_error="closed")
        assert not (await limiter.hit("k")).allowed and limiter.store_down
        await wrong.aclose()
    finally:
        server.discard()
