"""The HTTP adapters' success path, counted rather than timed: CPU instructions each
contender adds to a GET that needs no retry, under valgrind's callgrind.

The contenders and their base are bench_http.py's (the same prepared request, the
same ``httpx.MockTransport`` or canned urllib3 pool). Each runs in a child process
under callgrind twice, with LOW and HIGH requests after a warm-up; the difference
of the two totals over HIGH - LOW is the instructions per request, which does not
depend on what else the machine runs (``PYTHONHASHSEED=0`` pins dict and set
layouts). A figure is that minus the bare base's. Besides bench_http.py's tables:
a new request per call (built by an ``httpx.Client`` beforehand, as a client does
per call), and a response with 8 headers (pacing looks at every header name of a
success), with and without pacing.

Needs ``valgrind`` (Debian package ``valgrind``); else it says so and skips.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from bench import bench_http

# (scenario, contenders, peer): scenario names a driver below.
TABLES: list[tuple[str, list[str], str]] = [
    (
        "httpx sync",
        ["bare", "httpx-retries", "stormguard off", "stormguard defaults"],
        "httpx-retries",
    ),
    (
        "httpx async",
        ["bare", "httpx-retries", "stormguard off", "stormguard defaults"],
        "httpx-retries",
    ),
    (
        "httpx sync, a new request per call",
        ["bare", "httpx-retries", "stormguard defaults"],
        "httpx-retries",
    ),
    (
        "httpx sync, 8 response headers",
        ["bare", "httpx-retries", "stormguard defaults", "stormguard pacing=False"],
        "httpx-retries",
    ),
    (
        "requests",
        [
            "bare",
            "urllib3 Retry",
            "stormguard off",
            "stormguard defaults",
            "stormguard defaults, HTTPAdapter's request_url",
        ],
        "urllib3 Retry",
    ),
]
_WARM = 200
_HEADERS = [
    ("content-type", "application/json"),
    ("date", "Tue, 01 Dec 2026 15:00:00 GMT"),
    ("server", "nginx"),
    ("connection", "keep-alive"),
    ("cache-control", "no-store"),
    ("x-request-id", "abc"),
    ("vary", "accept"),
]


def _httpx_transport(name: str, headers: list[tuple[str, str]]) -> tuple[Any, Any]:
    import httpx

    from stormguard.httpx import RetryTransport

    mock = httpx.MockTransport(lambda request: httpx.Response(200, headers=headers, content=b"ok"))
    if name == "stormguard pacing=False":
        return RetryTransport(mock, pacing=False), bench_http._httpx_contenders(mock)[1]
    transports, request = bench_http._httpx_contenders(mock)
    return transports[name], request


def _driver(scenario: str, name: str) -> Callable[[int], None]:
    """A function making ``n`` requests through contender ``name`` of ``scenario``."""
    import httpx

    if scenario == "httpx async":

        async def answer(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, content=b"ok")

        transports, request = bench_http._httpx_contenders(httpx.MockTransport(answer))
        transport, loop = transports[name], asyncio.new_event_loop()

        async def many(n: int) -> None:
            for _ in range(n):
                await transport.handle_async_request(request)

        return lambda n: loop.run_until_complete(many(n))
    if scenario == "requests":
        import requests

        adapter = bench_http._canned_pool_adapters()[name]
        prepared = requests.Request("GET", bench_http._URL).prepare()
        return lambda n: [adapter.send(prepared, timeout=10).content for _ in range(n)] and None
    headers = _HEADERS if scenario.endswith("8 response headers") else []
    transport, request = _httpx_transport(name, headers)
    if scenario.endswith("a new request per call"):
        client = httpx.Client()

        def fresh(n: int) -> None:
            for built in [client.build_request("GET", bench_http._URL) for _ in range(n)]:
                transport.handle_request(built)

        return fresh
    return lambda n: [transport.handle_request(request) for _ in range(n)] and None


def _child(scenario: str, name: str, n: int) -> None:
    run = _driver(scenario, name)
    run(_WARM)
    run(n)


def _instructions(scenario: str, name: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={scratch}/cg.out",
                sys.executable,
                "-m",
                "bench.bench_http_counts",
                scenario,
                name,
                str(n),
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        ).stderr
    return int(re.search(r"Collected : (\d+)", out).group(1))  # type: ignore[union-attr]


def main(quick: bool = False) -> None:
    """Print each table (``quick``: 200 minus 100 requests, not 3,000 minus 1,000)."""
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian package 'valgrind'): http-counts skipped")
        return
    low, high = (100, 200) if quick else (1000, 3000)
    for scenario, names, peer in TABLES:
        per = {
            name: (_instructions(scenario, name, high) - _instructions(scenario, name, low))
            / (high - low)
            for name in names
        }
        bare = per.pop("bare")
        added = {name: value - bare for name, value in per.items()}
        print(f"\n{scenario}: instructions added per request (bare {bare / 1000:.1f} k)")
        width = max(map(len, added))
        # A peer adding next to nothing (urllib3's Retry runs in every requests
        # contender) gives no ratio: the share of the bare request says more.
        comparable = added[peer] > 0.02 * bare
        for name, value in added.items():
            shown = f"{value / added[peer]:.2f}x" if comparable else f"{value / bare:+.1%} of bare"
            print(f"  {name:<{width}} {value / 1000:>+8.1f} k  {shown}")


if __name__ == "__main__":
    if len(sys.argv) == 4:
        _child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    else:
        main("--quick" in sys.argv)
