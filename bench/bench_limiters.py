"""Rate-limiter decisions per second, as ratios against limits and pyrate-limiter.

Every figure is measured in the same run on the same machine; only the ratios
mean anything. Each contender decides hits for 1,000 clients in turn (one key
per client, as a gateway does) with a quota so large that every hit is admitted:
the hot path a gateway runs on every request, with per-key state of realistic
size (a moving window's log holds only that client's recent hits).

* memory: stormguard's fastest algorithm vs limits' fastest in-memory strategy
  and pyrate-limiter's fastest in-memory bucket (target: >= 4x limits);
* Redis, sync: one caller in a loop (target: >= 1.5x limits' moving window);
* Redis, async: 64 concurrent callers on one event loop (same target);
* the async path as a share of raw `redis-benchmark` EVALSHA throughput (a
  trivial script, 64 clients), when redis-benchmark is installed.

Redis: REDIS_URL or redis://127.0.0.1:6379/0; keys use a unique prefix and are
deleted afterwards.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlparse

HUGE = 10**9
CALLERS = 64
CLIENTS = [f"client-{i}" for i in range(1000)]


def _keys(number: int) -> list[str]:
    return list(itertools.islice(itertools.cycle(CLIENTS), number))


def _race(
    contenders: dict[str, Callable[[str], Any]], number: int, repeat: int
) -> dict[str, float]:
    """Seconds per call, best of `repeat` rounds over the clients in turn.

    Contenders are interleaved within each round, so a burst of load from other
    processes on a shared machine hits all of them rather than one.
    """
    keys = _keys(number)
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(repeat):
        for name, fn in contenders.items():
            gc.collect()
            started = time.perf_counter()
            for key in keys:
                fn(key)
            best[name] = min(best[name], (time.perf_counter() - started) / number)
    return best


def _race_async(
    makers: dict[str, Callable[[], Callable[[], Awaitable[Any]]]], number: int, repeat: int
) -> dict[str, float]:
    """Seconds per decision with CALLERS concurrent tasks, best of `repeat` interleaved rounds."""

    async def run() -> dict[str, float]:
        hits = {name: make() for name, make in makers.items()}
        for hit in hits.values():  # warm the connection pools
            await asyncio.gather(*(hit() for _ in range(CALLERS)))
        per_task = max(1, number // CALLERS)
        best = dict.fromkeys(hits, float("inf"))

        async def caller(hit: Callable[[], Awaitable[Any]]) -> None:
            for _ in range(per_task):
                await hit()

        for _ in range(repeat):
            for name, hit in hits.items():
                started = time.perf_counter()
                await asyncio.gather(*(caller(hit) for _ in range(CALLERS)))
                elapsed = (time.perf_counter() - started) / (per_task * CALLERS)
                best[name] = min(best[name], elapsed)
        return best

    return asyncio.run(run())


def _table(title: str, times: dict[str, float], baseline: str) -> None:
    base = times[baseline]
    print(f"\n{title}")
    print(
        f"  {'contender':<44} {'µs/decision':>11} {'decisions/s':>12} {'speed vs ' + baseline:>22}"
    )
    for name, seconds in sorted(times.items(), key=lambda item: item[1]):
        print(f"  {name:<44} {seconds * 1e6:>11.2f} {1 / seconds:>12,.0f} {base / seconds:>21.2f}x")


def _verdict(times: dict[str, float], peer: str) -> None:
    for ours in ("stormguard sliding_window_log", "stormguard gcra"):
        ratio = times[peer] / times[ours]
        print(f"  => {ours} vs {peer}: {ratio:.2f}x (target >= 1.5x)")


def _memory(number: int, repeat: int) -> None:
    from limits import parse, storage, strategies
    from pyrate_limiter import (
        GCRA as PyrateGCRA,
    )
    from pyrate_limiter import (
        Duration,
        InMemoryBucket,
        InMemoryStateStore,
        Limiter,
        Rate,
        StateBucket,
    )

    import stormguard as sg

    contenders: dict[str, Callable[[str], Any]] = {}
    for algorithm in (
        sg.TokenBucket(HUGE, HUGE),
        sg.GCRA(HUGE, HUGE),
        sg.FixedWindow(HUGE, 60),
        sg.SlidingWindowCounter(HUGE, 60),
    ):
        contenders[f"stormguard {algorithm.kind}"] = sg.RateLimiter(algorithm).hit

    item = parse(f"{HUGE}/minute")
    memory = storage.MemoryStorage()
    for strategy in (
        strategies.FixedWindowRateLimiter,
        strategies.SlidingWindowCounterRateLimiter,
        strategies.MovingWindowRateLimiter,
    ):
        peer = strategy(memory)
        contenders[f"limits {strategy.__name__}"] = lambda key, peer=peer: peer.hit(item, key)

    rate = [Rate(HUGE, Duration.MINUTE)]
    log = Limiter(InMemoryBucket(rate))
    contenders["pyrate-limiter InMemoryBucket"] = lambda key: log.try_acquire(key, blocking=False)
    state = Limiter(StateBucket(rate, algorithm=PyrateGCRA(), store=InMemoryStateStore()))
    contenders["pyrate-limiter StateBucket(GCRA)"] = lambda key: state.try_acquire(
        key, blocking=False
    )
    times = _race(contenders, number, repeat)

    ours = min(t for name, t in times.items() if name.startswith("stormguard"))
    limits_best = min(t for name, t in times.items() if name.startswith("limits"))
    pyrate_best = min(t for name, t in times.items() if name.startswith("pyrate"))
    fastest_limits = min(
        (name for name in times if name.startswith("limits")), key=lambda n: times[n]
    )
    _table("memory, one thread, 1,000 clients", times, fastest_limits)
    print(
        f"  => stormguard fastest vs limits fastest: {limits_best / ours:.2f}x (target >= 4x); "
        f"vs pyrate-limiter fastest: {pyrate_best / ours:.2f}x"
    )


def _redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def _redis_sync(url: str, token: str, number: int, repeat: int) -> float:
    import redis
    from limits import parse, storage, strategies
    from pyrate_limiter import Duration, Limiter, Rate, RedisBucket

    import stormguard as sg
    from stormguard.stores import RedisStore

    contenders: dict[str, Callable[[str], Any]] = {}
    store = RedisStore(url, prefix=f"sgbench:{token}:")
    for algorithm in (
        sg.GCRA(HUGE, HUGE),
        sg.TokenBucket(HUGE, HUGE),
        sg.FixedWindow(HUGE, 60),
        sg.SlidingWindowLog(HUGE, 1),
    ):
        contenders[f"stormguard {algorithm.kind}"] = sg.RateLimiter(algorithm, store).hit
    limits_store = storage.RedisStorage(url, key_prefix=f"sgbench-limits-{token}")
    item = parse(f"{HUGE}/second")
    for strategy in (strategies.MovingWindowRateLimiter, strategies.FixedWindowRateLimiter):
        peer = strategy(limits_store)
        contenders[f"limits {strategy.__name__}"] = lambda key, peer=peer, name=strategy.__name__: (
            peer.hit(item, name, key)
        )
    client = redis.Redis.from_url(url)
    bucket = RedisBucket.init([Rate(HUGE, Duration.SECOND)], client, f"sgbench-pyrate-{token}")
    pyrate = Limiter(bucket)
    contenders["pyrate-limiter RedisBucket"] = lambda key: pyrate.try_acquire(key, blocking=False)
    times = _race(contenders, number, repeat)
    _table("Redis, sync, one caller, 1,000 clients", times, "limits MovingWindowRateLimiter")
    _verdict(times, "limits MovingWindowRateLimiter")
    store.close()
    client.close()
    return times["stormguard gcra"]


def _redis_async(url: str, token: str, number: int, repeat: int) -> float:
    import stormguard as sg

    def ours(algorithm: Any) -> Callable[[], Callable[[], Awaitable[Any]]]:
        def make() -> Callable[[], Awaitable[Any]]:
            from stormguard.stores import AsyncRedisStore

            store = AsyncRedisStore(url, prefix=f"sgbench:{token}:", max_connections=CALLERS)
            limiter = sg.AsyncRateLimiter(algorithm, store)
            key = itertools.cycle(CLIENTS).__next__
            return lambda: limiter.hit(key())

        return make

    makers = {
        f"stormguard {algorithm.kind}": ours(algorithm)
        for algorithm in (sg.GCRA(HUGE, HUGE), sg.SlidingWindowLog(HUGE, 1))
    }

    def limits_moving() -> Callable[[], Awaitable[Any]]:
        from limits import parse
        from limits.aio import storage, strategies

        store = storage.RedisStorage(
            "async+" + url, implementation="redispy", key_prefix=f"sgbench-limits-{token}"
        )
        peer = strategies.MovingWindowRateLimiter(store)
        item = parse(f"{HUGE}/second")
        key = itertools.cycle(CLIENTS).__next__
        return lambda: peer.hit(item, key())

    peer = "limits MovingWindowRateLimiter (aio)"
    makers[peer] = limits_moving
    times = _race_async(makers, number, repeat)
    _table(f"Redis, async, {CALLERS} concurrent callers, 1,000 clients", times, peer)
    _verdict(times, peer)
    return min(times["stormguard gcra"], times["stormguard sliding_window_log"])


def _redis_benchmark(url: str, number: int) -> float | None:
    exe = shutil.which("redis-benchmark")
    if exe is None:
        print("\nredis-benchmark not installed: raw EVALSHA share skipped")
        return None
    import redis

    parsed = urlparse(url)
    client = redis.Redis.from_url(url)
    sha = client.script_load("return 1")
    client.close()
    out = subprocess.run(
        [
            exe,
            "-h",
            parsed.hostname or "127.0.0.1",
            "-p",
            str(parsed.port or 6379),
            "-c",
            str(CALLERS),
            "-n",
            str(number),
            "-q",
            "EVALSHA",
            sha,
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout
    match = re.search(r"([\d.]+) requests per second", out.replace(",", ""))
    return float(match.group(1)) if match else None


def _cleanup(url: str, token: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"*{token}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def main(quick: bool) -> None:
    """Run the limiter benchmark (``quick`` for a smoke run)."""
    number, repeat = (2_000, 3) if quick else (40_000, 5)
    _memory(number, repeat)

    url = _redis_url()
    try:
        import redis

        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except Exception as exc:  # no Redis: the memory figures still stand
        print(f"\nRedis at {url} unreachable ({exc}); Redis figures skipped")
        return
    token = uuid.uuid4().hex[:12]
    redis_number = 300 if quick else 3_000
    try:
        _redis_sync(url, token, redis_number, repeat)
        async_best = _redis_async(url, token, redis_number * 4, repeat)
        raw = _redis_benchmark(url, redis_number * 10)
        if raw:
            share = (1 / async_best) / raw
            print(
                f"\nraw redis-benchmark EVALSHA ('return 1', {CALLERS} clients): {raw:,.0f}/s; "
                f"stormguard async reaches {1 / async_best:,.0f}/s = {share:.0%} of it"
            )
    finally:
        _cleanup(url, token)
