"""The rate-limit service: decisions per second and p50/p99, over gRPC and in-process.

    python -m bench rls [--quick]

For each store (memory; Redis when REDIS_URL is set, else a redis-server this bench
starts on a free port, else skipped) and for 1 and 50 concurrent calls ("streams"
of one HTTP/2 connection, as Envoy sends them), the same RateLimitRequest -- two
descriptors, a per-client token bucket and a global fixed window, both far from
their limits -- is answered two ways in the same run:

* in-process: the service's Decider called directly (the decision alone);
* service: a `stormguard ratelimit-service` process called by a grpc.aio client.

Rounds interleave the contenders so a burst of load from other processes hits them
all. The table shows decisions/s, p50 and p99, and for the service its decisions/s
as a ratio of in-process and the p50 it adds. Target: at one stream the service adds
at most 1 ms p50 over the in-process decision.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.bench_breaker import _redis  # REDIS_URL, else a redis-server of our own
from bench.bench_gateway import _free_port, _process

CONFIG = """\
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: token_bucket}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
"""
STREAMS = (1, 50)
TARGET_MS = 1.0
SRC = Path(__file__).resolve().parent.parent / "src"


@contextmanager
def _service(config: Path, store: str, prefix: str) -> Iterator[int]:
    port = _free_port()
    cmd = [sys.executable, "-c", "from stormguard.cli import main; main()", "ratelimit-service"]
    cmd += [f"--config={config}", f"--listen=127.0.0.1:{port}", "--admin=off"]
    cmd += [f"--store={store}", f"--store-prefix={prefix}", "--store-timeout=5"]
    with _process(cmd, port, env={**os.environ, "PYTHONPATH": str(SRC)}):
        yield port


def _request(n: int) -> Any:
    from stormguard.gateway.rls._pb import ratelimit_pb2, rls_pb2

    entry = ratelimit_pb2.RateLimitDescriptor.Entry
    return rls_pb2.RateLimitRequest(
        domain="bench",
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(entries=[entry(key="client", value=f"c{n % 100}")]),
            ratelimit_pb2.RateLimitDescriptor(entries=[entry(key="path", value="/orders")]),
        ],
    )


async def _drive(call: Callable[[Any], Any], streams: int, seconds: float) -> list[float]:
    requests = [_request(n) for n in range(100)]
    for request in requests[:streams]:  # warm up
        await call(request)
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        clock = time.perf_counter
        n = offset
        while (start := clock()) < stop:
            await call(requests[n % 100])
            latencies.append(clock() - start)
            n += 1

    await asyncio.gather(*(worker(i) for i in range(streams)))
    return latencies


async def _in_process(config: str, store: str, prefix: str, streams: int, seconds: float) -> Any:
    from stormguard.gateway.rls._config import parse_domain
    from stormguard.gateway.rls._decide import Decider
    from stormguard.gateway.rls._service import ServiceOptions, open_store

    domain = parse_domain(config)
    backend = open_store(ServiceOptions(store=store, store_prefix=prefix, store_timeout=5))
    decider = Decider({domain.name: domain}, backend)
    try:
        return await _drive(decider.decide, streams, seconds)
    finally:
        closer = getattr(backend, "aclose", None)
        if closer is not None:
            await closer()


async def _over_grpc(port: int, streams: int, seconds: float) -> list[float]:
    import grpc.aio

    from stormguard.gateway.rls._pb import rls_pb2

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        call = channel.unary_unary(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            request_serializer=rls_pb2.RateLimitRequest.SerializeToString,
            response_deserializer=rls_pb2.RateLimitResponse.FromString,
        )
        return await _drive(call, streams, seconds)


def _drop(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(match=prefix + "*"):
        client.delete(key)
    client.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main(quick: bool = False) -> None:
    """Print the table."""
    seconds, rounds = (1.0, 1) if quick else (3.0, 3)
    prefix = f"bench-rls:{uuid.uuid4().hex[:8]}:"
    rows: dict[tuple[str, str, int], tuple[list[float], list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-rls-") as directory, _redis() as redis_url:
        config = Path(directory) / "bench.yaml"
        config.write_text(CONFIG)
        stores = {"memory": "memory"}
        if redis_url is not None:
            stores["redis"] = redis_url
        else:
            print("no Redis (REDIS_URL unset, no redis-server): the Redis rows are skipped")
        try:
            for store_name, store in stores.items():
                with _service(config, store, prefix) as port:
                    for _ in range(rounds):
                        for streams in STREAMS:
                            contenders = {
                                "in-process": _in_process(CONFIG, store, prefix, streams, seconds),
                                "service": _over_grpc(port, streams, seconds),
                            }
                            for mode, run in contenders.items():
                                lat = asyncio.run(run)
                                rates, kept = rows.setdefault((store_name, mode, streams), ([], []))
                                rates.append(len(lat) / seconds)
                                kept.extend(lat)
        finally:
            if redis_url is not None:
                _drop(redis_url, prefix)
    _print(rows, seconds, rounds)


def _print(
    rows: dict[tuple[str, str, int], tuple[list[float], list[float]]], seconds: float, rounds: int
) -> None:
    print(f"ShouldRateLimit, 2 descriptors per call, {rounds} x {seconds:g} s per row")
    header = (
        f"{'store':7} {'mode':11} {'streams':>7} {'decisions/s':>12} {'p50 ms':>8} {'p99 ms':>8}"
    )
    print(f"{header} {'x in-process':>13} {'+p50 ms':>8}")
    verdicts = []
    for (store, mode, streams), (rates, lat) in rows.items():
        rate = statistics.median(rates)
        p50, p99 = _percentile(lat, 0.5), _percentile(lat, 0.99)
        line = f"{store:7} {mode:11} {streams:7d} {rate:12.0f} {p50 * 1000:8.3f} {p99 * 1000:8.3f}"
        if mode == "service":
            base_rates, base_lat = rows[(store, "in-process", streams)]
            added = (p50 - _percentile(base_lat, 0.5)) * 1000
            line += f" {rate / statistics.median(base_rates):13.2f} {added:8.3f}"
            if streams == 1:
                verdicts.append((store, added))
        print(line)
    for store, added in verdicts:
        reached = "reached" if added <= TARGET_MS else "NOT reached"
        print(
            f"{store}: the service adds {added:.3f} ms p50 at one stream "
            f"(target <= {TARGET_MS:g} ms: {reached})"
        )


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
