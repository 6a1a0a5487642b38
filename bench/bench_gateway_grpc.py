"""Unary gRPC calls per second: direct, through nginx (grpc_pass), through the gateway.

Every figure is measured in the same run on the same machine; only the ratios
mean anything. One client process (grpc.aio, CONCURRENCY calls in flight) drives
each target in turn for a few seconds, interleaved over several rounds so a burst
of load from other processes hits every contender:

* direct: the raw-bytes upstream (a grpc.aio server in its own process);
* nginx: `grpc_pass` to the upstream (one worker; skipped when nginx is missing);
* gateway: stormguard's gRPC leg (its own process) passing through, and with a
  per-client token bucket, a global sliding window, a breaker and a bulkhead on
  the memory store (and on Redis when REDIS_URL is set).

The table shows calls/s, p50/p99 latency, calls/s as a ratio of nginx's (or of
direct when nginx is missing) and the p50 added over direct.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CONCURRENCY = 32
METHOD = "/bench.Echo/Unary"

UPSTREAM = """
import asyncio, grpc, grpc.aio, sys
async def unary(request, context):
    return request
async def main():
    server = grpc.aio.server()
    handlers = {"Unary": grpc.unary_unary_rpc_method_handler(unary)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", handlers),))
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)
asyncio.run(main())
"""

GATEWAY = """
import asyncio, sys
from stormguard import SlidingWindowCounter, TokenBucket
from stormguard.gateway._config import Upstream
from stormguard.gateway._grpc_routes import CLIENT_KEY, GrpcRoute
from stormguard.gateway._grpc_server import start_grpc_proxy
from stormguard.gateway._upstream import UpstreamPool
from stormguard.server._decide import RuleSet
from stormguard.server._rules import Rule
from stormguard.stores import from_url

async def main(upstream, mode, store_url):
    settings = {"url": upstream}
    rules = None
    if mode != "pass":
        settings["breaker"] = {}
        settings["bulkhead"] = {"limit": 1000}
        per_client = Rule(TokenBucket(1e9, 1e9), key=lambda raw: raw[CLIENT_KEY], name="client")
        everyone = Rule(SlidingWindowCounter(1e9, 1), key="global", name="global")
        options = {"prefix": "bench-grpc:"} if store_url.startswith("redis") else {}
        store = from_url(store_url, asyncio=True, **options)
        rules = RuleSet([per_client, everyone], store=store)
    pool = UpstreamPool("echo", Upstream.model_validate(settings))
    server = await start_grpc_proxy(
        "127.0.0.1:0", routes=[GrpcRoute("bench.Echo", "echo", rules)], upstreams={"echo": pool},
        client_keys=["header:x-api-key", "ip"],
    )
    print(server.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""

NGINX = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log error;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream echo {{ server 127.0.0.1:{upstream}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port} http2;
        location / {{ grpc_pass grpc://echo; }}
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _process(code: str, *args: str) -> Iterator[int]:
    """Run a Python snippet that prints its port; stop it when stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def _nginx(upstream: int) -> Iterator[int | None]:
    exe = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None
    )
    if exe is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as directory:
        port = _free_port()
        conf = Path(directory) / "nginx.conf"
        conf.write_text(NGINX.format(dir=directory, upstream=upstream, port=port))
        proc = subprocess.Popen(
            [exe, "-c", str(conf), "-p", directory, "-e", f"{directory}/error.log"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            yield port if proc.poll() is None else None
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def _drive(port: int, seconds: float) -> tuple[int, list[float]]:
    import grpc.aio

    latencies: list[float] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        call = channel.unary_unary(METHOD)
        metadata = (("x-api-key", "bench"),)
        for _ in range(CONCURRENCY):  # warm up
            await call(b"x" * 64, metadata=metadata)
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            clock = time.perf_counter
            payload = b"x" * 64
            while (start := clock()) < stop:
                await call(payload, metadata=metadata)
                latencies.append(clock() - start)

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return len(latencies), latencies


def _measure(port: int, seconds: float) -> tuple[float, list[float]]:
    count, latencies = asyncio.run(_drive(port, seconds))
    return count / seconds, latencies


def main(quick: bool = False) -> None:
    """Print the table."""
    seconds, rounds = (1.0, 1) if quick else (3.0, 3)
    redis_url = os.environ.get("REDIS_URL")
    with _process(UPSTREAM) as upstream:
        target = f"grpc://127.0.0.1:{upstream}"
        with (
            _nginx(upstream) as nginx,
            _process(GATEWAY, target, "pass", "memory://") as passing,
            _process(GATEWAY, target, "protected", "memory://") as protected,
        ):
            targets: dict[str, int] = {"direct": upstream}
            if nginx is not None:
                targets["nginx grpc_pass"] = nginx
            else:
                print("nginx not found: its row is skipped")
            targets["stormguard pass-through"] = passing
            targets["stormguard limits+breaker (memory)"] = protected
            if redis_url:
                redis_ctx = _process(GATEWAY, target, "protected", redis_url)
                targets["stormguard limits+breaker (Redis)"] = redis_ctx.__enter__()
            else:
                redis_ctx = None
                print("REDIS_URL not set: the Redis row is skipped")
            try:
                rates: dict[str, list[float]] = {name: [] for name in targets}
                latencies: dict[str, list[float]] = {name: [] for name in targets}
                for _ in range(rounds):
                    for name, port in targets.items():
                        rate, lat = _measure(port, seconds)
                        rates[name].append(rate)
                        latencies[name].extend(lat)
            finally:
                if redis_ctx is not None:
                    redis_ctx.__exit__(None, None, None)
    base_name = "nginx grpc_pass" if "nginx grpc_pass" in rates else "direct"
    base = statistics.median(rates[base_name])
    direct_p50 = statistics.median(latencies["direct"])
    print(f"unary gRPC calls, {CONCURRENCY} in flight, {rounds} x {seconds:g} s per target")
    ratio = "x " + base_name
    print(f"{'target':38} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {ratio:>18} {'+p50 ms':>8}")
    for name in rates:
        rate = statistics.median(rates[name])
        lat = sorted(latencies[name])
        p50 = lat[len(lat) // 2]
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(
            f"{name:38} {rate:9.0f} {p50 * 1000:8.2f} {p99 * 1000:8.2f} "
            f"{rate / base:18.2f} {(p50 - direct_p50) * 1000:8.2f}"
        )


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
