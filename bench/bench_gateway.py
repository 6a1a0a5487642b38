"""The gateway under wrk at 50 connections: req/s, p50/p99, as ratios in one run;
then at one connection (the latency a proxy adds to one request), and for the
Redis contender the commands it sends Redis per request (counted with MONITOR).

Contenders, all in front of the same upstream (an nginx worker answering a fixed
200, so the upstream is never the bottleneck being measured):

* the upstream directly (the ceiling);
* nginx as a reverse proxy, plain pass-through (the peer);
* nginx with ``limit_req`` (a zone per client IP, a rate nobody reaches);
* nginx with its access log on (to a file, buffered: ``buffer=64k flush=1s``);
* ``stormguard gateway`` with a per-client limit, a global limit and a breaker on,
  with the memory store, with Redis (a redis-server started for the run), and with
  Redis in approximate mode (``sync: {every: 0.1}`` on both limits);
* the same gateway (memory store) with clients named by a header (``clients: {key:
  [header:X-API-Key]}``, wrk sending ``X-API-Key``), then with its access log on (to
  a file), then with every request a different client (a wrk Lua script cycling
  through 100,000 keys).

Beside req/s each row gives the CPU the contender's processes spent per request
(utime + stime from /proc, read before and after each wrk run, divided by its
requests), which holds better than req/s on a shared machine. The last table puts
the rows issue 24 sets targets for beside their targets and says whether each is met.

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
def _process(
    cmd: list[str], port: int, log: Path | None = None, **kwargs: object
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` until the context ends (its output to ``log``, else discarded)."""
    with ExitStack() as files:
        out: object = subprocess.DEVNULL
        if log is not None:
            out = files.enter_context(log.open("ab"))
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, **kwargs)  # type: ignore[call-overload]
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


def _nginx(
    workdir: Path, name: str, server: str, *, access_log: bool = False
) -> tuple[list[str], Path]:
    directory = workdir / name
    log = f"{directory}/logs/access.log combined buffer=64k flush=1s" if access_log else "off"
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
                access_log {log};
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


# Clients named by a header, as in the README's example (wrk sends it).
HEADER_CLIENTS = "clients: {key: ['header:X-API-Key']}"
API_KEY = "X-API-Key: bench-client"
DISTINCT_CLIENTS = 100_000
# Each request a different client: wrk's threads (2) take turns through their half of
# DISTINCT_CLIENTS keys each. The requests are formatted once, in init: wrk calls
# request() for each one, and on a shared machine wrk's own CPU is the gateway's loss.
DISTINCT_SCRIPT = f"""\
local threads = 0
function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end
function init(args)
  n = 0
  requests = {{}}
  for i = 1, {DISTINCT_CLIENTS // 2} do
    requests[i] = wrk.format(nil, nil, {{["X-API-Key"] = "client-" .. id .. "-" .. i}})
  end
end
function request()
  n = n % {DISTINCT_CLIENTS // 2} + 1
  return requests[n]
end
"""


NGINX_LOG = "nginx, access log on"
HEADER_ROW = "stormguard gateway (memory, header-named clients)"
LOG_ROW = "stormguard gateway (memory, header clients, log on)"
DISTINCT_ROW = "stormguard gateway (memory, 100k distinct clients)"
# Issue 24: row -> (the row it is measured against, least req/s ratio, most CPU ratio).
# The access log's targets are 15 % below the first row's (0.45 x 0.85; 2.2 / 0.85);
# 100k distinct clients at most 20 % below one client's (<= 1.25x its CPU).
TARGETS = {
    HEADER_ROW: ("nginx pass-through", 0.45, 2.2),
    LOG_ROW: (NGINX_LOG, 0.38, 2.6),
    DISTINCT_ROW: (HEADER_ROW, 0.80, 1.25),
}
REDIS_ROW = "stormguard gateway (redis)"
APPROXIMATE_ROW = "stormguard gateway (redis, approximate)"
# Issue 25 (fleet): row -> (least req/s ratio against nginx pass-through, most added
# p50 at one connection in microseconds, or None).
FLEET_TARGETS = {
    REDIS_ROW: (0.30, 500.0),
    APPROXIMATE_ROW: (0.40, None),
}


def _gateway_config(
    path: Path,
    port: int,
    admin: int,
    upstream: int,
    store: str,
    sync: str = "",
    *,
    clients: str = "",
    access_log: bool = False,
) -> None:
    """The benchmark's gateway: a per-client and a global limit and a breaker;
    ``sync`` is added to each limit (:data:`APPROXIMATE`: the approximate mode);
    ``clients`` names them (:data:`HEADER_CLIENTS`; default: by address)."""
    path.write_text(
        textwrap.dedent(
            f"""\
            listen: {{http: 127.0.0.1:{port}, admin: 127.0.0.1:{admin}}}
            store: {store}
            on_store_error: open
            access_log: {"true" if access_log else "false"}
            {clients}
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
    port: int, seconds: int, connections: int = CONNECTIONS, extra: tuple[str, ...] = ()
) -> tuple[float, float, float, int]:
    """req/s, p50 ms, p99 ms and the number of requests of one wrk run (``extra``:
    more wrk arguments, a header or a script)."""
    out = subprocess.run(
        [
            "wrk",
            f"-t{min(2, connections)}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            *extra,
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


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its descendants (nginx's workers), from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / _TICK
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo += [child for child, parent in parents.items() if parent == current]
    return total


class _Row:
    """One contender: wrk at CONNECTIONS (one run per round, with the CPU its
    processes spent per request), then at one connection, and store round trips."""

    def __init__(
        self, name: str, port: int, redis_port: int | None = None, extra: tuple[str, ...] = ()
    ) -> None:
        self.name, self.port, self.redis_port, self.extra = name, port, redis_port, extra
        self.runs: list[tuple[float, float, float]] = []  # (req/s, p50, p99) per round
        self.cpu: list[float] = []  # microseconds of CPU per request, per round
        self.pid: int | None = None  # the process to read CPU of (set when started)
        self.p50_1 = self.p99_1 = 0.0
        self.round_trips: float | None = None

    def measure_load(self, seconds: int, pid: int | None) -> None:
        pid = pid or self.pid
        before = _cpu_seconds(pid) if pid else 0.0
        rps, p50, p99, requests = _wrk(self.port, seconds, extra=self.extra)
        used = _cpu_seconds(pid) - before if pid else 0.0
        self.runs.append((rps, p50, p99))
        self.cpu.append(used / requests * 1e6 if requests else 0.0)

    def measure_one(self, seconds: int) -> None:
        _, self.p50_1, self.p99_1, _ = _wrk(
            self.port, max(1, seconds // 2), connections=1, extra=self.extra
        )
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
                with start() as pid:
                    row.measure_load(seconds, pid)
                    if last:
                        row.measure_one(seconds)
    _print(rows, seconds, rounds)


def _contenders(
    workdir: Path, redis_server: str | None, stack: ExitStack
) -> list[tuple[_Row, Callable[[], AbstractContextManager[int | None]]]]:
    """Each contender's row and how to start it (warm); the upstream and Redis are
    started here for the whole run (``stack`` stops them)."""
    up_port = _free_port()
    cmd, _ = _nginx(workdir, "upstream", _upstream_block(up_port))
    direct = _Row("upstream direct", up_port)
    direct.pid = stack.enter_context(_process(cmd, up_port)).pid
    contenders: list[tuple[_Row, Callable[[], AbstractContextManager[int | None]]]] = [
        (direct, partial(nullcontext, None))
    ]
    for name, limit, log in (
        ("nginx pass-through", False, False),
        ("nginx + limit_req", True, False),
        (NGINX_LOG, False, True),
    ):
        port = _free_port()
        folder = name.replace(" ", "_").replace("+", "").replace(",", "")
        cmd, _ = _nginx(workdir, folder, _proxy_block(port, up_port, limit), access_log=log)
        contenders.append((_Row(name, port), partial(_warm_process, cmd, port)))
    script = workdir / "distinct.lua"
    script.write_text(DISTINCT_SCRIPT)
    for label, log, extra in (
        (HEADER_ROW, False, ("-H", API_KEY)),
        (LOG_ROW, True, ("-H", API_KEY)),
        (DISTINCT_ROW, False, ("-s", str(script))),
    ):
        port, admin = _free_port(), _free_port()
        config = workdir / f"gateway-{len(contenders)}.yaml"
        _gateway_config(
            config, port, admin, up_port, "memory", clients=HEADER_CLIENTS, access_log=log
        )
        logfile = workdir / f"gateway-{len(contenders)}.log" if log else None
        start = partial(_warm_process, _gateway_cmd(config), port, log=logfile)
        contenders.append((_Row(label, port, extra=extra), start))
    stores: list[tuple[str, str, int | None, str]] = [("memory", "memory", None, "")]
    if redis_server is not None:
        redis_port = _free_port()
        redis_cmd = [redis_server, "--port", str(redis_port), "--save", "", "--appendonly", "no"]
        stack.enter_context(_process([*redis_cmd, "--dir", str(workdir)], redis_port))
        url = f"redis://127.0.0.1:{redis_port}/0"
        stores.append(("redis", url, redis_port, ""))
        stores.append(("redis, approximate", url, redis_port, APPROXIMATE))
    for label, store, monitored, sync in stores:
        port, admin = _free_port(), _free_port()
        config = workdir / f"gateway-{label.replace(', ', '-')}.yaml"
        _gateway_config(config, port, admin, up_port, store, sync)
        row = _Row(f"stormguard gateway ({label})", port, monitored)
        contenders.append((row, partial(_warm_process, _gateway_cmd(config), port)))
    return contenders


@contextmanager
def _warm_process(cmd: list[str], port: int, log: Path | None = None) -> Iterator[int | None]:
    with _process(cmd, port, log, env={**os.environ}) as proc:
        _warm(port)
        yield proc.pid


def _ratios(mine: _Row, theirs: _Row, field: str) -> list[float]:
    """Per round, ``mine`` over ``theirs``: req/s (``field="rps"``) or CPU per request."""
    if field == "rps":
        pairs = [(a[0], b[0]) for a, b in zip(mine.runs, theirs.runs, strict=True)]
    else:
        pairs = list(zip(mine.cpu, theirs.cpu, strict=True))
    return [a / b if b else float("nan") for a, b in pairs]


def _print(rows: list[_Row], seconds: int, rounds: int) -> None:
    peer = next(r for r in rows if r.name == "nginx pass-through")
    direct = rows[0]
    each = "one round" if rounds == 1 else f"{rounds} interleaved rounds, medians"
    print(f"wrk, {CONNECTIONS} connections, {seconds}s each, {each}; one worker per proxy")
    head = ("contender", "req/s", "p50 ms", "p99 ms", "vs nginx", "rounds", "added p50")
    print(
        f"{head[0]:50} {head[1]:>10} {head[2]:>8} {head[3]:>8} {head[4]:>9} {head[5]:>11}"
        f" {head[6]:>10} {'CPU us/req':>10} {'vs nginx':>9}"
    )
    for r in rows:
        # The ratio of each round (both measured minutes apart at most), then their median.
        ratios = _ratios(r, peer, "rps")
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
        added = r.median(1) - direct.median(1)
        cpu = statistics.median(r.cpu)
        cpu_ratio = statistics.median(_ratios(r, peer, "cpu"))
        print(
            f"{r.name:50} {r.median(0):10.0f} {r.median(1):8.2f} {r.median(2):8.2f}"
            f" {statistics.median(ratios):8.2f}x {spread:>11} {added:9.2f}ms"
            f" {cpu:10.1f} {cpu_ratio:8.2f}x"
        )
    # At 50 connections p50 is mostly queueing (Little's law: 50 / throughput); one
    # connection shows what a proxy adds to a single request.
    print(f"\nwrk, 1 connection, {max(1, seconds // 2)}s each: the latency a proxy adds")
    one = ("contender", "p50 ms", "p99 ms", "added p50", "Redis round trips/req")
    print(f"{one[0]:50} {one[1]:>8} {one[2]:>8} {one[3]:>10} {one[4]:>22}")
    for r in rows:
        trips = f"{r.round_trips:22.3f}" if r.round_trips is not None else f"{'-':>22}"
        added = (r.p50_1 - direct.p50_1) * 1000
        print(f"{r.name:50} {r.p50_1:8.3f} {r.p99_1:8.3f} {added:8.0f}us {trips}")
    _print_targets({r.name: r for r in rows})
    _print_fleet_targets({r.name: r for r in rows}, direct)


def _print_targets(rows: dict[str, _Row]) -> None:
    """Issue 24's targets beside the rows they are set for, each said met or not."""
    print("\nissue 24 targets (medians of the rounds' ratios, same run)")
    print(f"{'row':50} {'against':38} {'req/s':>7} {'target':>8}    {'CPU':>7} {'target':>8}")
    for name, (against, min_rps, max_cpu) in TARGETS.items():
        if name not in rows or against not in rows:
            continue
        rps = statistics.median(_ratios(rows[name], rows[against], "rps"))
        cpu = statistics.median(_ratios(rows[name], rows[against], "cpu"))
        rps_ok = "met" if rps >= min_rps else "NOT met"
        cpu_ok = "met" if cpu <= max_cpu else "NOT met"
        print(
            f"{name:50} {against:38} {rps:6.2f}x {'>=':>3}{min_rps:4.2f}x {rps_ok:7}"
            f" {cpu:6.2f}x {'<=':>3}{max_cpu:4.2f}x {cpu_ok}"
        )


def _print_fleet_targets(rows: dict[str, _Row], direct: _Row) -> None:
    """Issue 25's targets for the Redis rows, each said met or not."""
    peer = rows.get("nginx pass-through")
    if peer is None or not any(name in rows for name in FLEET_TARGETS):
        return
    print("\nissue 25 targets (fleet mode; medians of the rounds' ratios, same run)")
    print(f"{'row':50} {'vs nginx':>8} {'target':>8}    {'added p50':>10} {'target':>9}")
    for name, (min_rps, max_added) in FLEET_TARGETS.items():
        if name not in rows:
            continue
        rps = statistics.median(_ratios(rows[name], peer, "rps"))
        added = (rows[name].p50_1 - direct.p50_1) * 1000
        met = "met" if rps >= min_rps else "NOT met"
        line = f"{name:50} {rps:7.2f}x {'>=':>3}{min_rps:4.2f}x {met:7}"
        if max_added is not None:
            ok = "met" if added <= max_added else "NOT met"
            line += f" {added:8.0f}us {'<=':>3}{max_added:4.0f}us {ok}"
        print(line)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
