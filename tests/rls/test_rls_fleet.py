"""Several service processes on one Redis admit exactly N, as one service would.

Two `stormguard ratelimit-service` processes (and one with --workers 2) share a Redis
(or a Redis Cluster) under a unique key prefix; threads with their own connections
call both at once. `on_store_error: closed` and a long store timeout make any store
trouble show as a shortfall, never as extra admissions."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rls_process import Service, ServiceFactory
from rls_support import METHOD, Request, Response, codes, request

pytestmark = [pytest.mark.redis, pytest.mark.slow]
redis = pytest.importorskip("redis")

QUOTA, THREADS, CALLS = 20, 6, 10  # 60 calls for a quota of 20
CONFIG = f"""\
domain: fleet
descriptors:
  - key: fixed
    rate_limit: {{unit: day, requests_per_unit: {QUOTA}}}
  - key: sliding
    rate_limit: {{unit: day, requests_per_unit: {QUOTA}, algorithm: sliding_window}}
  - key: log
    rate_limit: {{unit: day, requests_per_unit: {QUOTA}, algorithm: sliding_log}}
"""


def _flags(url: str, prefix: str, *extra: str) -> tuple[str, ...]:
    return (
        f"--store={url}",
        f"--store-prefix={prefix}",
        "--on-store-error=closed",
        "--store-timeout=5",
        *extra,
    )


def _hammer(ports: list[int], descriptor: tuple[str, str]) -> list[str]:
    # THREADS threads, each with its own connection, round-robin over the ports.
    answers: list[str] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        target = f"127.0.0.1:{ports[n % len(ports)]}"
        with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            call = ch.unary_unary(
                METHOD,
                request_serializer=Request.SerializeToString,
                response_deserializer=Response.FromString,
            )
            for _ in range(CALLS):
                # wait_for_ready: a worker just restarted (or a listener still binding)
                # refuses a connect; the call waits for the channel instead of failing
                answer = call(request("fleet", [descriptor]), timeout=30, wait_for_ready=True)
                with lock:
                    answers.append(codes(answer)[0])

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def _drop(url: str, prefix: str) -> None:
    client: Any = (
        redis.RedisCluster.from_url(url.replace("redis+cluster://", "redis://"))
        if url.startswith("redis+cluster://")
        else redis.Redis.from_url(url)
    )
    keys = list(client.scan_iter(match=prefix + "*"))
    for key in keys:
        client.delete(key)
    client.close()


@pytest.fixture
def pair(
    redis_url: str, key_prefix: str, service_factory: ServiceFactory
) -> Iterator[list[Service]]:
    """Two service processes on the shared Redis."""
    flags = _flags(redis_url, key_prefix)
    yield [service_factory(CONFIG, flags=flags), service_factory(CONFIG, flags=flags)]
    _drop(redis_url, key_prefix)


@pytest.mark.parametrize("key", ["fixed", "sliding", "log"])
def test_two_processes_admit_exactly_the_quota(pair: list[Service], key: str) -> None:
    """60 concurrent calls through two processes: exactly 20 OK (fixed, sliding, log)."""
    answers = _hammer([s.grpc_port for s in pair], (key, "everyone"))
    assert len(answers) == THREADS * CALLS
    assert answers.count("OK") == QUOTA
    statuses = [s.status()["domains"]["fleet"]["descriptors"][f"fleet.{key}"] for s in pair]
    assert sum(row["allowed"] for row in statuses) == QUOTA
    assert sum(row["refused"] for row in statuses) == THREADS * CALLS - QUOTA
    # both processes decided (which one admitted the 20 depends on who came first:
    # that they add up to the quota, not to twice it, is the sharing)
    assert all(row["allowed"] + row["refused"] > 0 for row in statuses)


def test_workers_share_the_quota_and_one_status(
    redis_url: str, key_prefix: str, service_factory: ServiceFactory, eventually: Any
) -> None:
    """--workers 2 on Redis admits exactly the quota; the admin sums both workers."""
    service = service_factory(CONFIG, flags=_flags(redis_url, key_prefix, "--workers=2"))
    try:
        answers = _hammer([service.grpc_port], ("fixed", "workers"))
        assert answers.count("OK") == QUOTA

        def counts() -> tuple[int, int]:
            row = service.status()["domains"]["fleet"]["descriptors"]["fleet.fixed"]
            return row["allowed"], row["refused"]

        # the workers hand their counts over every half second
        eventually(lambda: counts() == (QUOTA, THREADS * CALLS - QUOTA))
    finally:
        _drop(redis_url, key_prefix)


def test_two_processes_on_a_cluster_admit_exactly_the_quota(
    redis_cluster_url: str, key_prefix: str, service_factory: ServiceFactory
) -> None:
    """The same on a three-node Redis Cluster."""
    flags = _flags(redis_cluster_url, key_prefix)
    services = [service_factory(CONFIG, flags=flags), service_factory(CONFIG, flags=flags)]
    try:
        answers = _hammer([s.grpc_port for s in services], ("fixed", "cluster"))
        assert answers.count("OK") == QUOTA
    finally:
        _drop(redis_cluster_url, key_prefix)


def _workers_of(pid: int) -> list[int]:
    # The supervisor's spawned workers (not multiprocessing's resource tracker).
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            found.append(int(entry.name))
    return found


def test_a_worker_that_dies_is_replaced(
    redis_url: str, key_prefix: str, service_factory: ServiceFactory, eventually: Any
) -> None:
    """--workers 2: a killed worker is restarted and the service keeps answering."""
    service = service_factory(CONFIG, flags=_flags(redis_url, key_prefix, "--workers=2"))
    assert service.proc is not None
    try:
        workers = eventually(lambda: (w := _workers_of(service.proc.pid)) and len(w) == 2 and w)
        os.kill(workers[0], signal.SIGKILL)
        eventually(lambda: "restarting" in service.output())
        eventually(lambda: len(set(_workers_of(service.proc.pid)) - {workers[0]}) == 2)
        assert _hammer([service.grpc_port], ("fixed", "restart")).count("OK") == QUOTA
    finally:
        _drop(redis_url, key_prefix)
