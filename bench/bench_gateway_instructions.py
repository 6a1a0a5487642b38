"""What one proxied request costs the gateway's process in CPU instructions.

The gateway (configured as in bench_gateway.py: a per-client and a global limit
and a breaker; with the memory store, with Redis -- a redis-server started for the
run -- and with Redis in approximate mode) runs under valgrind's callgrind in front
of the same nginx upstream; a small client sends keep-alive GETs over a few connections, one
request per connection at a time. Instructions are collected only while the
client runs (callgrind_control zeroes the counters, then dumps them), for two
request counts; the difference divided by the difference in requests leaves out
what does not grow with them. Instructions do not depend on what else the machine
runs, so this is the measure to judge a change of the gateway's own work by
(within about 1 %: timers and loop passes that scale with wall time remain).

Rows (issue 24): ``memory`` (clients by address), ``memory-header`` (clients named by
``X-API-Key``, as in the README), ``memory-log`` (the same with the access log on,
written to a file), ``memory-100k`` (every request a different client, from 100,000
keys), ``redis`` and ``redis-approx``. ``BENCH_ROWS=memory,memory-header`` (a comma
list) runs only the rows named.

Needs valgrind (Debian package ``valgrind``) and nginx; else it says so and skips.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench import bench_gateway as gw

CONNECTIONS = 4
REQUESTS = (1000, 3000)  # quick: (300, 900)
# The approximate contender's sync interval. Under callgrind the gateway runs some
# fifty times slower, so an interval spans fifty times fewer requests than at full
# speed: 2 s here is about what 0.04 s is outside valgrind (bench_gateway uses 0.1).
APPROXIMATE = ", sync: {every: 2}"


# The keys of the 100k-distinct row: each request the next one, never twice in a run.
_DISTINCT = itertools.cycle(range(gw.DISTINCT_CLIENTS))


def _drive(port: int, requests: int, connections: int = CONNECTIONS, clients: str = "") -> None:
    """``requests`` keep-alive GETs over ``connections``, one in flight on each
    (``clients``: ``header``, one ``X-API-Key``; ``distinct``, a new key each)."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port
    if clients == "header":
        request += gw.API_KEY.encode() + b"\r\n"
    buffers = [b""] * connections
    done = 0
    try:
        while done < requests:
            batch = min(connections, requests - done)
            for sock in socks[:batch]:
                if clients == "distinct":
                    sock.sendall(request + b"X-API-Key: client-%d\r\n\r\n" % next(_DISTINCT))
                else:
                    sock.sendall(request + b"\r\n")
            for i in range(batch):
                buffers[i] = _answer(socks[i], buffers[i])
            done += batch
    finally:
        for sock in socks:
            sock.close()


def _answer(sock: socket.socket, buffer: bytes) -> bytes:
    """Read one answer with a Content-Length off ``sock``; what follows it."""
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            head = buffer[:end].lower()
            if not head.startswith(b"http/1.1 200"):
                raise RuntimeError(f"unexpected answer: {head[:40]!r}")
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n")[0]) if at >= 0 else 0
            if len(buffer) >= end + 4 + length:
                return buffer[end + 4 + length :]
        data = sock.recv(65536)
        if not data:
            raise RuntimeError("the gateway closed the connection")
        buffer += data


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _collected(out: Path, pid: int, requests: int, port: int, clients: str) -> int:
    """Instructions the gateway ran while serving ``requests``."""
    _control(pid, "-z")
    _drive(port, requests, clients=clients)
    before = set(glob.glob(f"{out}.{pid}*"))
    _control(pid, "-d")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        new = set(glob.glob(f"{out}.{pid}*")) - before
        for path in new:
            for line in Path(path).read_text().splitlines():
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


def _count_contender(
    workdir: Path, label: str, store: str, up: int, low: int, high: int, extra: str = ""
) -> tuple[int, int]:
    """Instructions of one gateway (``store``) at ``low`` and ``high`` requests."""
    port, admin = gw._free_port(), gw._free_port()
    config = workdir / f"gateway-{label}.yaml"
    clients = {"memory-header": "header", "memory-log": "header", "memory-100k": "distinct"}
    named = clients.get(label, "")
    gw._gateway_config(
        config,
        port,
        admin,
        up,
        store,
        extra,
        clients=gw.HEADER_CLIENTS if named else "",
        access_log=label == "memory-log",
    )
    out = workdir / f"callgrind-{label}.out"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}.%p",
        *gw._gateway_cmd(config),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with (workdir / f"gateway-{label}.log").open("wb") as log:  # the access log's file
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    try:
        gw._wait_port(port, proc, timeout=300)
        _drive(port, 300, clients=named)  # warm: upstream connections open, tables filled
        _control(proc.pid, "-i", "on")
        _drive(port, 300, clients=named)
        return (
            _collected(out, proc.pid, low, port, named),
            _collected(out, proc.pid, high, port, named),
        )
    finally:
        proc.terminate()
        proc.wait()


def main(quick: bool) -> None:
    """Count the gateway's instructions per request (``quick``: fewer requests)."""
    for tool, package in (("valgrind", "valgrind"), ("nginx", "nginx")):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed (Debian package {package!r}): count skipped")
            return
    low, high = (300, 900) if quick else REQUESTS
    redis_server = shutil.which("redis-server")
    with tempfile.TemporaryDirectory(prefix="stormguard-bench-instr-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        up = gw._free_port()
        cmd, _ = gw._nginx(workdir, "upstream", gw._upstream_block(up))
        stack.enter_context(gw._process(cmd, up))
        contenders = [
            ("memory", "memory", ""),
            ("memory-header", "memory", ""),
            ("memory-log", "memory", ""),
            ("memory-100k", "memory", ""),
        ]
        if redis_server is None:
            print("redis-server is not installed: the Redis rows are skipped")
        else:
            redis_port = gw._free_port()
            redis_cmd = [redis_server, "--port", str(redis_port), "--save", "", "--appendonly"]
            stack.enter_context(gw._process([*redis_cmd, "no", "--dir", tmp], redis_port))
            url = f"redis://127.0.0.1:{redis_port}/0"
            contenders += [("redis", url, ""), ("redis-approx", url, APPROXIMATE)]
        only = [row for row in os.environ.get("BENCH_ROWS", "").split(",") if row]
        per = {}
        for label, store, extra in contenders:
            if only and label not in only:
                continue
            counts = _count_contender(workdir, label, store, up, low, high, extra)
            per[label] = (counts[1] - counts[0]) / (high - low)
    print(f"gateway, per-client + global limits + breaker, {CONNECTIONS} keep-alive connections,")
    print("under callgrind: instructions per proxied request")
    memory = per.get("memory")
    for label, value in per.items():
        versus = f"   {value / memory:5.2f}x the memory store" if memory else ""
        print(f"  {label:14} {value:10,.0f}{versus}")
    header, distinct = per.get("memory-header"), per.get("memory-100k")
    if header and distinct:  # issue 24: 100k distinct clients <= 1.25x one client's CPU
        print(
            f"  100k distinct / one header-named client: {distinct / header:.2f}x (target <= 1.25x)"
        )
    if header and per.get("memory-log"):
        print(f"  access log on / off: {per['memory-log'] / header:.2f}x")
    if header:  # issue 24: no more than today's ~130 k per request
        print(f"  header-named clients: {header:,.0f} (target <= 130,000)")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
