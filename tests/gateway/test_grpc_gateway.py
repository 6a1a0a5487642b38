"""`stormguard gateway` processes serving `grpc:` routes on `listen.grpc`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from test_grpc_support import (
    SERVICE,
    Upstream,
    trailer,
    upstream_fixture,  # noqa: F401  (the `upstream` fixture)
)

from net_support import PortTaken, await_started, free_port, listening, stop_process
from stormguard.gateway._grpc_gateway import PUSHBACK

LIMIT = 5
CONFIG = """
listen:
  http: 127.0.0.1:{http}
  grpc: 127.0.0.1:{grpc}
  admin: 127.0.0.1:{admin}
store: {store}
max_body: {max_body}
clients:
  key: [header:x-api-key, ip]
upstreams:
  echo:
    url: {upstream}
    breaker: {{min_calls: 2, failure_rate: 0.5, open_for: 30}}
limits:
  per-client: {{algorithm: sliding_window, limit: {limit}, window: 60, per: client}}
routes:
  - grpc: {service}
    upstream: echo
    limits: [per-client]
"""


class GatewayProcess:
    """One ``stormguard gateway --config FILE`` process with a gRPC and an admin listener.

    Its output goes to a log file; :meth:`ready` fails quoting that log when the
    process exits or does not listen in time, and starts it again on fresh ports
    when another process took a "free" port between the probe and the bind.
    """

    def __init__(
        self, directory: Path, store: str, upstream: str, workers: int = 1, max_body: int = 1 << 20
    ) -> None:
        self._directory = directory
        self._settings = {
            "store": store,
            "upstream": upstream,
            "limit": LIMIT,
            "service": SERVICE,
            "max_body": max_body,
        }
        self._workers = workers
        self._spawn()

    def _spawn(self) -> None:
        self.grpc, self.admin = free_port(), free_port()
        path = self._directory / f"gateway-{self.grpc}.yaml"
        self.log = self._directory / f"gateway-{self.grpc}.log"
        path.write_text(
            CONFIG.format(http=free_port(), grpc=self.grpc, admin=self.admin, **self._settings)
        )
        command = "from stormguard.cli import main; main()"
        flags = ["--config", str(path), "--workers", str(self._workers)]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", command, "gateway", *flags],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    async def ready(self, within: float = 30) -> None:
        """Wait until the gRPC and admin listeners accept connections."""
        for tries_left in reversed(range(3)):
            try:
                await await_started(
                    lambda: listening(self.grpc) and listening(self.admin),
                    self.process,
                    "the gateway",
                    within,
                    log=self.log,
                )
                break
            except PortTaken:
                if not tries_left:
                    raise
                self._spawn()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc}") as channel:
            await asyncio.wait_for(channel.channel_ready(), within)

    def status(self) -> dict[str, Any]:
        """The admin listener's /status document."""
        url = f"http://127.0.0.1:{self.admin}/status"
        with urllib.request.urlopen(url, timeout=10) as response:
            document: dict[str, Any] = json.load(response)
        return document

    def stop(self) -> None:
        """SIGTERM, then wait (kill if it hangs)."""
        stop_process(self.process)


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """Starts gateway processes; stops them after the test."""
    started: list[GatewayProcess] = []

    def start(store: str, upstream: str, workers: int = 1, **options: int) -> GatewayProcess:
        process = GatewayProcess(tmp_path, store, upstream, workers, **options)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.stop()


async def call_through(ports: list[int], key: str, count: int) -> list[grpc.aio.AioRpcError | None]:
    """``count`` unary calls with x-api-key ``key``, alternating over ``ports``.

    Each entry of ``ports`` is its own channel (connection), even for one port twice.
    """
    outcomes: list[grpc.aio.AioRpcError | None] = []
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for port in ports]
    try:
        for index in range(count):
            method = channels[index % len(channels)].unary_unary(f"/{SERVICE}/Unary")
            try:
                await method(b"a", metadata=(("x-api-key", key),), timeout=20)
                outcomes.append(None)
            except grpc.aio.AioRpcError as error:
                outcomes.append(error)
    finally:
        for channel in channels:
            await channel.close()
    return outcomes


async def test_gateway_serves_grpc_routes_counted_in_its_status(
    start_gateway: Callable[..., GatewayProcess], upstream: Upstream
) -> None:
    """listen.grpc proxies the route; refusals carry pushback; /status counts by service."""
    gateway = start_gateway("memory", upstream.target)
    await gateway.ready()
    outcomes = await call_through([gateway.grpc], uuid.uuid4().hex, LIMIT + 2)
    refused = [error for error in outcomes if error is not None]
    assert len(refused) == 2
    assert {error.code() for error in refused} == {grpc.StatusCode.UNAVAILABLE}
    assert all(trailer(error.trailing_metadata(), PUSHBACK) for error in refused)
    status = gateway.status()
    assert status["routes"][SERVICE] == {"allowed": LIMIT, "limited:per-client": 2}
    assert status["upstreams"]["echo"]["breaker"] == "closed"
    assert len(upstream.seen) == LIMIT


@pytest.mark.redis
async def test_two_gateway_processes_on_one_redis_admit_the_limit_exactly(
    start_gateway: Callable[..., GatewayProcess], upstream: Upstream, redis_url: str
) -> None:
    """Calls alternating over two gateways: exactly LIMIT pass for a key; another key is free."""
    gateways = [start_gateway(redis_url, upstream.target) for _ in range(2)]
    for gateway in gateways:
        await gateway.ready()
    ports = [gateway.grpc for gateway in gateways]
    outcomes = await call_through(ports, uuid.uuid4().hex, 3 * LIMIT)
    assert outcomes.count(None) == LIMIT
    codes = {error.code() for error in outcomes if error is not None}
    assert codes == {grpc.StatusCode.UNAVAILABLE}
    assert await call_through(ports, uuid.uuid4().hex, 1) == [None]
    assert len(upstream.seen) == LIMIT + 1


@pytest.mark.redis
async def test_gateway_workers_serve_grpc_with_one_limit_and_one_status(
    start_gateway: Callable[..., GatewayProcess], upstream: Upstream, redis_url: str
) -> None:
    """--workers 2: connections spread over the workers; LIMIT pass; /status sums the workers."""
    gateway = start_gateway(redis_url, upstream.target, 2)
    await gateway.ready()
    outcomes = await call_through([gateway.grpc] * 4, uuid.uuid4().hex, 3 * LIMIT)
    assert outcomes.count(None) == LIMIT
    assert gateway.status()["routes"][SERVICE] == {
        "allowed": LIMIT,
        "limited:per-client": 2 * LIMIT,
    }


async def test_gateway_caps_grpc_request_messages_at_max_body(
    start_gateway: Callable[..., GatewayProcess], upstream: Upstream
) -> None:
    """A request message over max_body is refused RESOURCE_EXHAUSTED before the upstream."""
    gateway = start_gateway("memory", upstream.target, max_body=1000)
    await gateway.ready()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc}") as channel:
        method = channel.unary_unary(f"/{SERVICE}/Unary")
        assert await method(b"x" * 900, timeout=20) == b"echo:" + b"x" * 900
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(b"x" * 2000, timeout=20)
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(upstream.seen) == 1
