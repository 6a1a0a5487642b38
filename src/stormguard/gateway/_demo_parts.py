# The pieces of `stormguard demo gateway` (see _demo.py): the upstream that records
# every arrival, the two kinds of clients, and the gateway child process.
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import httpx
import yaml
from aiohttp import web

import stormguard
from stormguard.httpx import RetryTransport

__all__ = [
    "GUARDED_KEY",
    "NAIVE_KEY",
    "DemoUpstream",
    "GatewayProcess",
    "gateway_config",
    "serve_loopback",
]

NAIVE_KEY, GUARDED_KEY = "naive-loop-key", "stormguard-client-key"
_THINK = 0.05  # seconds a client waits between two successful calls


# --- the upstream ---------------------------------------------------------------


class DemoUpstream:
    """An aiohttp upstream on 127.0.0.1 that records every arrival."""

    def __init__(self) -> None:
        self.failing = False
        self.t0 = time.monotonic()
        self.arrivals: list[tuple[float, str, bool]] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        key = request.headers.get("X-API-Key", "")
        kind = "naive" if key == NAIVE_KEY else "stormguard"
        failing = self.failing
        self.arrivals.append((time.monotonic() - self.t0, kind, not failing))
        if failing:
            return web.Response(status=500, text="upstream is down")
        await asyncio.sleep(0.003)
        return web.json_response({"ok": True})

    async def start(self) -> None:
        """Listen on a free loopback port."""
        self._runner, self.port = await serve_loopback(self._handle)

    def reset(self) -> None:
        """Start a new run: healthy, no arrivals, time zero now."""
        self.failing = False
        self.arrivals = []
        self.t0 = time.monotonic()

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def serve_loopback(handler: Any) -> tuple[web.AppRunner, int]:
    """Serve every path with ``handler`` on a free 127.0.0.1 port: (runner, port)."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    return runner, int(sock.getsockname()[1])


# --- the clients ----------------------------------------------------------------


@dataclass(slots=True)
class _Tally:
    successes: int = 0
    retry_after: int = 0

    def saw(self, response: httpx.Response) -> None:
        if response.status_code < 300:
            self.successes += 1
        elif response.status_code in (429, 503) and "retry-after" in response.headers:
            self.retry_after += 1


async def _naive(client: httpx.AsyncClient, url: str, tally: _Tally, stop: asyncio.Event) -> None:
    # The anti-pattern: on any error, ask again at once; no backoff, no limit.
    while not stop.is_set():
        try:
            response = await client.get(url)
        except httpx.TransportError:
            continue
        tally.saw(response)
        if response.status_code < 300:
            await asyncio.sleep(_THINK)


async def _guarded(client: httpx.AsyncClient, url: str, tally: _Tally, stop: asyncio.Event) -> None:
    # All the retrying (backoff, Retry-After, breaker, budget) is inside RetryTransport.
    while not stop.is_set():
        try:
            tally.saw(await client.get(url))
        except (httpx.HTTPError, stormguard.StormguardError):  # CircuitOpen, RateLimited
            pass
        await asyncio.sleep(_THINK)


def _clients(naive: int, guarded: int) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    # One pooled client per kind, built before the clock starts (TLS contexts are
    # costly to create); the stormguard one gets a fresh set of guards per run.
    from ..protection import OriginGuards

    transport = RetryTransport(
        httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=guarded)),
        policy=stormguard.RetryPolicy(attempts=4),
        guards=OriginGuards(),
    )
    return (
        httpx.AsyncClient(
            headers={"X-API-Key": NAIVE_KEY},
            timeout=5.0,
            limits=httpx.Limits(max_connections=naive),
        ),
        httpx.AsyncClient(transport=transport, headers={"X-API-Key": GUARDED_KEY}, timeout=5.0),
    )


# --- the gateway ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_config(upstream_port: int, http_port: int, admin_port: int) -> dict[str, Any]:
    """The demo's gateway configuration (also an example of the format)."""
    return {
        "listen": {"http": f"127.0.0.1:{http_port}", "admin": f"127.0.0.1:{admin_port}"},
        "access_log": False,
        "clients": {"key": ["header:X-API-Key", "ip"]},
        "upstreams": {
            "api": {
                "url": f"http://127.0.0.1:{upstream_port}",
                "timeout": {"connect": 0.5, "read": 2.0},
                "breaker": {
                    "failure_rate": 0.5,
                    "min_calls": 10,
                    "window": 2,
                    "open_for": 1.5,
                    "open_for_max": 3,
                    "half_open_probes": 1,
                },
                "bulkhead": {"limit": 64, "per_client": 48, "max_wait": 0.1},
            }
        },
        "limits": {
            "per-client": {"algorithm": "token_bucket", "rate": 250, "burst": 250, "per": "client"},
            "global": {"algorithm": "sliding_window", "limit": 1000, "window": 1, "per": "global"},
        },
        "routes": [{"path": "/api", "upstream": "api", "limits": ["per-client", "global"]}],
    }


class GatewayProcess:
    """A `stormguard gateway` child process on free loopback ports."""

    def __init__(
        self,
        upstream_port: int,
        directory: Path,
        config: Callable[[int, int, int], dict[str, Any]] = gateway_config,
    ) -> None:
        self.http_port, self.admin_port = _free_port(), _free_port()
        # config(upstream port, http port, admin port): the configuration to run
        self.config = config(upstream_port, self.http_port, self.admin_port)
        self.path = directory / "gateway.yaml"
        self.path.write_text(yaml.safe_dump(self.config))
        self.log = directory / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The proxy listener."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def admin(self) -> str:
        """The admin listener (dashboard, /status)."""
        return f"http://127.0.0.1:{self.admin_port}"

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "stormguard.cli", "gateway", "--config", str(self.path)]
        with self.log.open("wb") as log:
            return subprocess.Popen(cmd, stdout=log, stderr=log, env=dict(os.environ))

    async def start(self) -> None:
        """Start and wait until /readyz answers 200."""
        self.proc = self._spawn()
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(timeout=1.0) as client:
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if (await client.get(self.admin + "/readyz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
        self.stop()
        raise click.ClickException(f"the gateway did not start:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
