"""The memory store at gateway scale: RSS of the gateway process as distinct clients
arrive, up to and past ``store_max_keys``.

A gateway with the memory store (a per-client and a global limit, as in
bench_gateway.py, the client named by ``X-API-Key``) in front of an nginx upstream;
a driver sends one request per new client key, pipelined over a few keep-alive
connections, and reads the gateway's RSS (/proc) and its store evictions (/metrics)
every step. Past the bound the store evicts its least recent keys and RSS should
stay flat. Full run: 1.2 million clients on the default bound (a million clients
per per-client limit); ``--quick``: 300 000 clients on ``store_max_keys: 100000``.
Memory figures are the process's own and do not depend on the machine's load.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

from bench import bench_gateway as gw

CONNECTIONS = 8
PIPELINE = 64  # requests written at once on a connection


def _config(path: Path, port: int, admin: int, upstream: int, max_keys: int | None) -> None:
    bound = f"store_max_keys: {max_keys}\n" if max_keys else ""
    path.write_text(
        textwrap.dedent(
            f"""\
            listen: {{http: 127.0.0.1:{port}, admin: 127.0.0.1:{admin}}}
            store: memory
            access_log: false
            clients: {{key: [header:X-API-Key, ip]}}
            upstreams:
              backend: {{url: http://127.0.0.1:{upstream}}}
            limits:
              per-client: {{algorithm: token_bucket, rate: 0.0001, burst: 100}}
              global: {{algorithm: sliding_window, limit: 100000000, window: 1, per: global}}
            routes:
              - path: /
                upstream: backend
                limits: [per-client, global]
            """
        )
        + bound
    )


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _evictions(admin: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.search(r"^stormguard_gateway_store_evictions_total (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else 0


def _drive(port: int, first: int, count: int) -> None:
    """One request for each client key first .. first + count - 1."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS)]
    try:
        key = first
        end = first + count
        while key < end:
            batches = []
            for sock in socks:
                n = min(PIPELINE, end - key)
                if n <= 0:
                    break
                payload = b"".join(
                    b"GET / HTTP/1.1\r\nHost: gw\r\nX-API-Key: client-%d\r\n\r\n" % k
                    for k in range(key, key + n)
                )
                key += n
                sock.sendall(payload)
                batches.append((sock, n))
            for sock, n in batches:
                seen = b""
                while seen.count(b"\r\n\r\n") < n or not seen.endswith(b"\n"):
                    data = sock.recv(1 << 20)
                    if not data:
                        raise RuntimeError("the gateway closed the connection")
                    seen += data
    finally:
        for sock in socks:
            sock.close()


def main(quick: bool) -> None:
    """Drive distinct clients through a memory-store gateway; print RSS per step."""
    if shutil.which("nginx") is None:
        print("nginx is not installed (Debian package 'nginx'): store-scale bench skipped")
        return
    total, step, bound = (300_000, 50_000, 100_000) if quick else (1_200_000, 100_000, None)
    with tempfile.TemporaryDirectory(prefix="stormguard-bench-scale-") as tmp:
        workdir = Path(tmp)
        up = gw._free_port()
        cmd, _ = gw._nginx(workdir, "upstream", gw._upstream_block(up))
        with gw._process(cmd, up):
            port, admin = gw._free_port(), gw._free_port()
            config = workdir / "gateway.yaml"
            _config(config, port, admin, up, bound)
            proc = subprocess.Popen(
                gw._gateway_cmd(config), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                gw._wait_port(port, proc)
                gw._wait_port(admin, proc)
                shown = f"store_max_keys: {bound}" if bound else "the default store_max_keys"
                print(f"gateway, memory store, {shown}; one request per new client key")
                print(f"{'clients':>10} {'RSS MB':>8} {'evictions':>10} {'s':>6}")
                started = time.monotonic()
                print(f"{0:>10} {_rss_mb(proc.pid):8.1f} {0:>10} {0:6.1f}")
                for first in range(0, total, step):
                    _drive(port, first, step)
                    time.sleep(0.5)  # the gauges refresh every 0.25 s
                    print(
                        f"{first + step:>10} {_rss_mb(proc.pid):8.1f} "
                        f"{_evictions(admin):>10} {time.monotonic() - started:6.1f}",
                        flush=True,
                    )
            finally:
                proc.terminate()
                proc.wait()


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
