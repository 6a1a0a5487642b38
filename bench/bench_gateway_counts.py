"""What one proxied request costs the proxy process, counted rather than timed.

nginx pass-through and ``stormguard gateway`` (memory store) in front of the same
upstream, configured as in bench_gateway.py, each under wrk at 50 connections while
``perf stat`` counts kernel tracepoints of the proxy's worker process only: its
syscalls (by kind), the wake-ups it issues (a write waking a sleeping reader), its
context switches, and the segments it transmits; plus its user and system CPU per
request from /proc. Counts per request hold on a shared machine where req/s does
not; the CPU figures are indicative only.

Needs ``perf`` (Debian package ``linux-perf``) with the tracepoints readable
(root, tracefs mounted at /sys/kernel/tracing); else it says so and skips.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench import bench_gateway as gw

EVENTS = {
    "syscalls": "raw_syscalls:sys_enter",
    "read/recvfrom": "syscalls:sys_enter_read,syscalls:sys_enter_recvfrom",
    "write/writev": "syscalls:sys_enter_write,syscalls:sys_enter_writev",
    "epoll wait": "syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait",
    "epoll_ctl": "syscalls:sys_enter_epoll_ctl",
    "getsockopt": "syscalls:sys_enter_getsockopt",
    "getpid": "syscalls:sys_enter_getpid",
    "wake-ups issued": "sched:sched_waking",
    "context switches": "sched:sched_switch",
    "segments sent": "net:net_dev_xmit",
}


def _perf_usable() -> str | None:
    """Why the counts cannot be taken here, or None."""
    if shutil.which("perf") is None:
        return "perf is not installed (Debian package 'linux-perf')"
    probe = subprocess.run(
        ["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return "perf cannot read the syscall tracepoints (root and tracefs needed)"
    return None


def _cpu(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])  # utime, stime in clock ticks


def _count(pid: int, port: int, seconds: int) -> dict[str, float]:
    """Per-request counts of ``pid`` while wrk loads ``port``."""
    with tempfile.NamedTemporaryFile("r", suffix=".csv") as out:
        names = ",".join(EVENTS.values())
        perf = subprocess.Popen(
            ["perf", "stat", "-x,", "-o", out.name, "-e", names, "-p", str(pid)],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
        user0, sys0 = _cpu(pid)
        *_, requests = gw._wrk(port, seconds)
        user1, sys1 = _cpu(pid)
        perf.send_signal(signal.SIGINT)
        perf.wait()
        totals: dict[str, float] = {}
        for line in out.read().splitlines():
            parts = line.split(",")
            if len(parts) > 3 and parts[0].replace(".", "").isdigit():
                totals[parts[2]] = float(parts[0])
    row = {
        label: sum(totals.get(event, 0.0) for event in events.split(",")) / requests
        for label, events in EVENTS.items()
    }
    tick = os.sysconf("SC_CLK_TCK")
    row["user CPU µs"] = 1e6 * (user1 - user0) / tick / requests
    row["system CPU µs"] = 1e6 * (sys1 - sys0) / tick / requests
    return row


def _worker(master: int) -> int:
    """nginx's worker process (the one that serves), given its master's pid."""
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout
    return int(out.split()[0])


def main(quick: bool) -> None:
    """Count what a request costs nginx and the gateway (``quick``: 2 s each, else 6)."""
    seconds = 2 if quick else 6
    for tool, package in (("wrk", "wrk"), ("nginx", "nginx")):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed (Debian package {package!r}): counts skipped")
            return
    why = _perf_usable()
    if why is not None:
        print(f"{why}: counts skipped")
        return
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="stormguard-bench-counts-") as tmp:
        workdir = Path(tmp)
        up = gw._free_port()
        cmd, _ = gw._nginx(workdir, "upstream", gw._upstream_block(up))
        with gw._process(cmd, up):
            port = gw._free_port()
            cmd, _ = gw._nginx(workdir, "proxy", gw._proxy_block(port, up, False))
            with gw._process(cmd, port) as nginx:
                gw._warm(port)
                rows["nginx pass-through"] = _count(_worker(nginx.pid), port, seconds)
            port, admin = gw._free_port(), gw._free_port()
            config = workdir / "gateway.yaml"
            gw._gateway_config(config, port, admin, up, "memory")
            with gw._process(gw._gateway_cmd(config), port) as gateway:
                gw._warm(port)
                gw._wrk(port, 1)  # the upstream connections are open and idle
                rows["stormguard gateway (memory)"] = _count(gateway.pid, port, seconds)
    names = list(rows)
    print(f"per request, wrk at {gw.CONNECTIONS} connections, {seconds}s each")
    print(f"{'':20}" + "".join(f"{name:>30}" for name in names))
    for label in next(iter(rows.values())):
        print(f"{label:20}" + "".join(f"{rows[name][label]:30.3f}" for name in names))
