"""Fleet accuracy: 4 processes x 2 threads hammer one key in Redis; zero over-admission.

Runs on a single Redis and on a three-node Redis Cluster. The "pair" group mixes
two keys (per client + global), which on a cluster live in different slots and are
decided slot by slot: still exact.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from typing import Any

import pytest
from limiting_support import drop_keys

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
# The pair's keys hash to different cluster slots (checked in the test).
CLIENT_KEY, GLOBAL_KEY = "client-7", "everyone"


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
    pair_global = RateLimiter(
        TokenBucket(GROUP_LOOSE / LONG, GROUP_LOOSE), store, name="pair-global"
    )
    pair_client = RateLimiter(FixedWindow(GROUP_TIGHT, LONG), store, name="pair-client")
    pair = [(pair_global, GLOBAL_KEY), (pair_client, CLIENT_KEY)]  # global taken first
    counts = dict.fromkeys([*ALGORITHMS, "group", "pair"], 0)
    lock = threading.Lock()

    def thread() -> None:
        mine = dict.fromkeys(counts, 0)
        barrier.wait()
        for _ in range(HITS):
            for name, limiter in limiters.items():
                mine[name] += limiter.hit("fleet").allowed
            mine["group"] += RateLimiter.hit_many([(tight, "fleet"), (loose, "fleet")]).allowed
            mine["pair"] += RateLimiter.hit_many(pair).allowed
        with lock:
            for name, n in mine.items():
                counts[name] += n

    threads = [threading.Thread(target=thread) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = sum(limiter.stats.store_errors for limiter in [*limiters.values(), pair_global])
    results.put((counts, errors))
    store.close()


@pytest.mark.parametrize("server", ["redis_url", "redis_cluster_url"])
def test_fleet_admits_exactly_the_quota(
    server: str, key_prefix: str, request: pytest.FixtureRequest
) -> None:
    """8 workers in 4 processes on one key: each limit admits exactly its quota."""
    from redis.crc import key_slot

    from stormguard.stores import RedisStore

    redis_url = request.getfixturevalue(server)
    assert key_slot(CLIENT_KEY.encode()) != key_slot(GLOBAL_KEY.encode())
    ctx = multiprocessing.get_context("spawn")  # no threads inherited (gRPC, stores)
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
    assert totals == {**dict.fromkeys(ALGORITHMS, QUOTA), "group": GROUP_TIGHT, "pair": GROUP_TIGHT}

    with RedisStore(redis_url, prefix=key_prefix) as store:
        # Denied group hits took nothing from the loose limit.
        loose = RateLimiter(FixedWindow(GROUP_LOOSE, LONG), store, name="loose")
        assert loose.hit("fleet", 0).remaining == GROUP_LOOSE - GROUP_TIGHT
        # Pairs refused by the client limit gave back what they took from the global one.
        pair_global = RateLimiter(
            TokenBucket(GROUP_LOOSE / LONG, GROUP_LOOSE), store, name="pair-global"
        )
        left = pair_global.hit(GLOBAL_KEY, 0).remaining
        assert GROUP_LOOSE - GROUP_TIGHT - 0.01 < left < GROUP_LOOSE - GROUP_TIGHT + 0.01  # refill
        asyncio.run(drop_keys(store.client, key_prefix))
