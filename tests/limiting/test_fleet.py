"""Fleet accuracy: 4 processes x 2 threads hammer one key in Redis; zero over-admission."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import pytest

from stormguard import (
    GCRA,
    Concurrency,
    FixedWindow,
    RateLimiter,
    SlidingWindowCounter,
    SlidingWindowLog,
    TokenBucket,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]
pytest.importorskip("redis")

PROCESSES, THREADS, HITS = 4, 2, 50  # 400 attempts per limit
LONG = 1_000_000.0
QUOTA = 150
# No refill while the test runs, so every algorithm must admit exactly QUOTA
# (the sliding counter too: its previous window is empty, so it is exact here).
ALGORITHMS = {
    "token_bucket": TokenBucket(QUOTA / LONG, QUOTA),
    "gcra": GCRA(QUOTA / LONG, QUOTA),
    "sliding_window_log": SlidingWindowLog(QUOTA, LONG),
    "sliding_window_counter": SlidingWindowCounter(QUOTA, LONG),
    "fixed_window": FixedWindow(QUOTA, LONG),
    "concurrency": Concurrency(QUOTA, LONG),
}
GROUP_TIGHT, GROUP_LOOSE = 90, 300


def _process(url: str, prefix: str, barrier: Any, results: Any) -> None:
    from stormguard.stores import RedisStore

    store = RedisStore(url, prefix=prefix, socket_timeout=5, connect_timeout=5)
    limiters = {
        name: RateLimiter(a, store, on_store_error="closed") for name, a in ALGORITHMS.items()
    }
    tight = RateLimiter(
        FixedWindow(GROUP_TIGHT, LONG), store, name="tight", on_store_error="closed"
    )
    loose = RateLimiter(
        FixedWindow(GROUP_LOOSE, LONG), store, name="loose", on_store_error="closed"
    )
    counts = dict.fromkeys([*ALGORITHMS, "group"], 0)
    lock = threading.Lock()

    def thread() -> None:
        mine = dict.fromkeys(counts, 0)
        barrier.wait()
        for _ in range(HITS):
            for name, limiter in limiters.items():
                mine[name] += limiter.hit("fleet").allowed
            mine["group"] += RateLimiter.hit_many([(tight, "fleet"), (loose, "fleet")]).allowed
        with lock:
            for name, n in mine.items():
                counts[name] += n

    threads = [threading.Thread(target=thread) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = sum(limiter.stats.store_errors for limiter in limiters.values())
    results.put((counts, errors))
    store.close()


def test_fleet_admits_exactly_the_quota(redis_url: str, key_prefix: str) -> None:
    """8 workers in 4 processes on one key: each limit admits exactly its quota."""
    from stormguard.stores import RedisStore

    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(PROCESSES * THREADS), ctx.Queue()
    procs = [
        ctx.Process(target=_process, args=(redis_url, key_prefix, barrier, results))
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert all(p.exitcode == 0 for p in procs)
    assert sum(errors for _, errors in outcomes) == 0
    totals = {name: sum(c[name] for c, _ in outcomes) for name in outcomes[0][0]}
    assert totals == {**dict.fromkeys(ALGORITHMS, QUOTA), "group": GROUP_TIGHT}

    with RedisStore(redis_url, prefix=key_prefix) as store:
        # Denied group hits took nothing from the loose limit.
        loose = RateLimiter(FixedWindow(GROUP_LOOSE, LONG), store, name="loose")
        assert loose.hit("fleet", 0).remaining == GROUP_LOOSE - GROUP_TIGHT
        keys = store.client.keys(key_prefix + "*")
        store.client.delete(*keys)
