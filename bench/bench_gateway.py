"""The gateway under wrk at 50 connections: req/s, p50/p99, as ratios in one run;
then at one connection (the latency a proxy adds to one request), and for the
Redis contender the commands it sends Redis per request (counted with MONITOR).

Contenders, all in front of the same upstream (an nginx worker answering a fixed
200, so the upstream is never the bottleneck being measured):

* the upstream directly (the ceiling);
* nginx as a reverse proxy, plain pass-through (the peer);
* nginx with ``limit_req`` (a zone per client IP, a rate nobody reaches);
* ``stormguard gateway`` with a per-client limit, a global limit and a breaker on,
  with the memory store, with Redis (a redis-server started for the run), and with
  Redis in approximate mode (``sync: {every: 0.1}`` on both limits).

Every proxy runs one worker process, started afresh for each of its runs. The
50-connection runs go in three rounds, each round running every contender in turn,
so that whatever else the machine does in a stretch of time falls on all of them.
A contender's ratio against nginx's pass-through req/s is taken within each round;
the table shows the median of the rounds' ratios and their range, and medians of
req/s and latencies. Absolute numbers are noise on shared machines. Where
wrk, nginx or redis-server is missing the bench says so and skips what needs it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from functools import partial
from pathlib import Path

CONNECTIONS = 50
# Rounds of the 50-connection runs, the contenders interleaved within each.
ROUNDS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open")


@contextmanager
def _process(cmd: list[str], port: int, **kwargs: object) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)  # type: ignore[call-overload]
    try:
        _wait_port(port, proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _nginx(workdir: Path, name: str, server: str) -> tuple[list[str], Path]:
    directory = workdir / name
    (directory / "logs").mkdir(parents=True)
    conf = directory / "nginx.conf"
    conf.write_text(
        textwrap.dedent(
            f"""\
            worker_processes 1;
            daemon off;
            pid {directory}/nginx.pid;
            error_log {directory}/logs/error.log warn;
            events {{ worker_connections 4096; }}
            http {{
                access_log off;
                client_body_temp_path {directory}/body;
                proxy_temp_path {directory}/proxy;
                fastcgi_temp_path {directory}/fastcgi;
                uwsgi_temp_path {directory}/uwsgi;
                scgi_temp_path {directory}/scgi;
                {server}
            }}
            """
        )
    )
    return ["nginx", "-p", str(directory), "-c", str(conf)], conf


def _upstream_block(port: int) -> str:
    return f"""
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 1000000;
        location / {{ return 200 "ok\\n"; }}
    }}"""


def _proxy_block(port: int, upstream: int, limit: bool) -> str:
    zone = "limit_req_zone $binary_remote_addr zone=perip:10m rate=1000000r/s;" if limit else ""
    rule = "limit_req zone=perip burst=1000000 nodelay;" if limit else ""
    return f"""
    {zone}
    upstream backend {{ server 127.0.0.1:{upstream}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 1000000;
        location / {{
            {rule}
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_pass http://backend;
        }}
    }}"""


# What the approximate contender adds to each limit (see docs/gateway/fleet.md).
APPROXIMATE = ", sync: {every: 0.1}"


def _gateway_config(
    path: Path, port: int, admin: int, upstream: int, store: str, sync: str = ""
) -> None:
    """The benchmark's gateway: a per-client and a global limit and a breaker;
    ``sync`` is added to each limit (:data:`APPROXIMATE`: the approximate mode)."""
    path.write_text(
        textwrap.dedent(
            f"""\
            listen: {{http: 127.0.0.1:{port}, admin: 127.0.0.1:{admin}}}
            store: {store}
            on_store_error: open
            access_log: false
            upstreams:
              backend:
                url: http://127.0.0.1:{upstream}
                breaker: {{failure_rate: 0.5, min_calls: 20, window: 30, open_for: 5}}
                bulkhead: {{limit: 200}}
            limits:
              per-client: {{algorithm: token_bucket, rate: 1000000, burst: 1000000{sync}}}
              global: {{algorithm: sliding_window, limit: 100000000, window: 1, per: global{sync}}}
            routes:
              - path: /
                upstream: backend
                limits: [per-client, global]
            """
        )
    )


def _wrk(
    port: int, seconds: int, connections: int = CONNECTIONS
) -> tuple[float, float, float, int]:
    """req/s, p50 ms, p99 ms and the number of requests of one wrk run."""
    out = subprocess.run(
        [
            "wrk",
            f"-t{min(2, connections)}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            f"http://127.0.0.1:{port}/",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"50%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"99%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    return rps, p50, p99, requests


def _redis_round_trips(port: int, gateway: int, seconds: int) -> float | None:
    """Commands the gateway sent Redis per request, under wrk at CONNECTIONS.

    Watched with MONITOR, which marks the commands a Lua script runs inside Redis
    (`[0 lua]`): those are not round trips, the EVALSHA that ran them is. A run of
    its own, since MONITOR slows Redis down.
    """
    if shutil.which("redis-cli") is None:
        return None
    with tempfile.TemporaryFile() as out:
        monitor = subprocess.Popen(
            ["redis-cli", "-p", str(port), "monitor"], stdout=out, stderr=subprocess.DEVNULL
        )
        try:
            time.sleep(0.3)
            *_, requests = _wrk(gateway, seconds)
            time.sleep(0.3)
        finally:
            monitor.terminate()
            monitor.wait()
        out.seek(0)
        lines = out.read().splitlines()
    commands = [line for line in lines if line[:1].isdigit() and b" lua] " not in line]
    return len(commands) / requests if requests else None


class _Row:
    """One contender: wrk at CONNECTIONS (one run per round), then at one connection,
    and store round trips."""

    def __init__(self, name: str, port: int, redis_port: int | None = None) -> None:
        self.name, self.port, self.redis_port = name, port, redis_port
        self.runs: list[tuple[float, float, float]] = []  # (req/s, p50, p99) per round
        self.p50_1 = self.p99_1 = 0.0
        self.round_trips: float | None = None

    def measure_load(self, seconds: int) -> None:
        self.runs.append(_wrk(self.port, seconds)[:3])

    def measure_one(self, seconds: int) -> None:
        _, self.p50_1, self.p99_1, _ = _wrk(self.port, max(1, seconds // 2), connections=1)
        if self.redis_port is not None:
            self.round_trips = _redis_round_trips(self.redis_port, self.port, max(1, seconds // 2))

    def median(self, field: int) -> float:
        return statistics.median(run[field] for run in self.runs)


def _ms(value: str) -> float:
    number = float(re.match(r"[\d.]+", value).group(0))  # type: ignore[union-attr]
    unit = value[len(re.match(r"[\d.]+", value).group(0)) :]  # type: ignore[union-attr]
    return number * {"us": 0.001, "ms": 1.0, "s": 1000.0}.get(unit, 1.0)


def _gateway_cmd(config: Path) -> list[str]:
    return [
        sys.executable,
        "-c",
        "from stormguard.cli import main; main()",
        "gateway",
        "--config",
        str(config),
    ]


def _warm(port: int) -> None:
    for _ in range(20):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()


def main(quick: bool) -> None:
    """Run the gateway benchmark (``quick``: one round of 2 s per contender instead of
    three rounds of 8 s)."""
    seconds, rounds = (2, 1) if quick else (8, ROUNDS)
    if shutil.which("wrk") is None:
        print("wrk is not installed (Debian package 'wrk'): gateway bench skipped")
        return
    if shutil.which("nginx") is None:
        print("nginx is not installed (Debian package 'nginx'): gateway bench skipped")
        return
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        print("redis-server is not installed: the Redis row is skipped")
    with tempfile.TemporaryDirectory(prefix="stormguard-bench-gw-") as tmp, ExitStack() as stack:
        contenders = _contenders(Path(tmp), redis_server, stack)
        rows = [row for row, _ in contenders]
        # Rounds take the contenders in turn, so that what else the machine does in a
        # stretch of time falls on all of them; each ratio is taken within a round.
        # A proxy runs only while it is measured, started afresh each time.
        for last in [False] * (rounds - 1) + [True]:
            for row, start in contenders:
                with start():
                    row.measure_load(seconds)
                    if last:
                        row.measure_one(seconds)
    _print(rows, seconds, rounds)


def _contenders(
    workdir: Path, redis_server: str | None, stack: ExitStack
) -> list[tuple[_Row, Callable[[], AbstractContextManager[object]]]]:
    """Each contender's row and how to start it (warm); the upstream and Redis are
    started here for the whole run (``stack`` stops them)."""
    up_port = _free_port()
    cmd, _ = _nginx(workdir, "upstream", _upstream_block(up_port))
    stack.enter_context(_process(cmd, up_port))
    contenders: list[tuple[_Row, Callable[[], AbstractContextManager[object]]]] = [
        (_Row("upstream direct", up_port), nullcontext)
    ]
    for name, limit in (("nginx pass-through", False), ("nginx + limit_req", True)):
        port = _free_port()
        cmd, _ = _nginx(
            workdir, name.replace(" ", "_").replace("+", ""), _proxy_block(port, up_port, limit)
        )
        contenders.append((_Row(name, port), partial(_warm_process, cmd, port)))
    stores: list[tuple[str, str, int | None, str]] = [("memory", "memory", None, "")]
    if redis_server is not None:
        redis_port = _free_port()
        redis_cmd = [redis_server, "--port", str(redis_port), "--save", "", "--appendonly", "no"]
        stack.enter_context(_process([*redis_cmd, "--dir", str(workdir)], redis_port))
        url = f"redis://127.0.0.1:{redis_port}/0"
        stores.append(("redis", url, redis_port, ""))
        stores.append(("redis, approximate", url, redis_port, APPROXIMATE))
    for label, store, redis_port, sync in stores:
        port, admin = _free_port(), _free_port()
        config = workdir / f"gateway-{label.replace(', ', '-')}.yaml"
        _gateway_config(config, port, admin, up_port, store, sync)
        row = _Row(f"stormguard gateway ({label})", port, redis_port)
        contenders.append((row, partial(_warm_process, _gateway_cmd(config), port)))
    return contenders


@contextmanager
def _warm_process(cmd: list[str], port: int) -> Iterator[None]:
    with _process(cmd, port, env={**os.environ}):
        _warm(port)
        yield


def _print(rows: list[_Row], seconds: int, rounds: int) -> None:
    peer = next(r for r in rows if r.name == "nginx pass-through")
    direct = rows[0]
    each = "one round" if rounds == 1 else f"{rounds} interleaved rounds, medians"
    print(f"wrk, {CONNECTIONS} connections, {seconds}s each, {each}; one worker per proxy")
    head = ("contender", "req/s", "p50 ms", "p99 ms", "vs nginx", "rounds", "added p50")
    print(
        f"{head[0]:38} {head[1]:>10} {head[2]:>8} {head[3]:>8} {head[4]:>9} {head[5]:>11}"
        f" {head[6]:>10}"
    )
    for r in rows:
        # The ratio of each round (both measured minutes apart at most), then their median.
        ratios = [mine[0] / theirs[0] for mine, theirs in zip(r.runs, peer.runs, strict=True)]
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
        added = r.median(1) - direct.median(1)
        print(
            f"{r.name:38} {r.median(0):10.0f} {r.median(1):8.2f} {r.median(2):8.2f}"
            f" {statistics.median(ratios):8.2f}x {spread:>11} {added:9.2f}ms"
        )
    # At 50 connections p50 is mostly queueing (Little's law: 50 / throughput); one
    # connection shows what a proxy adds to a single request.
    print(f"\nwrk, 1 connection, {max(1, seconds // 2)}s each: the latency a proxy adds")
    head = ("contender", "p50 ms", "p99 ms", "added p50", "Redis round trips/req")
    print(f"{head[0]:38} {head[1]:>8} {head[2]:>8} {head[3]:>10} {head[4]:>22}")
    for r in rows:
        trips = f"{r.round_trips:22.3f}" if r.round_trips is not None else f"{'-':>22}"
        added = (r.p50_1 - direct.p50_1) * 1000
        print(f"{r.name:38} {r.p50_1:8.3f} {r.p99_1:8.3f} {added:8.0f}us {trips}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
