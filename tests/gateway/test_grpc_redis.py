"""Two gRPC gateway processes on one Redis enforce one limit exactly."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import grpc
import grpc.aio
import pytest
from test_grpc_support import SERVICE, Upstream, trailer

from stormguard.gateway._grpc_gateway import PUSHBACK

pytestmark = pytest.mark.redis

LIMIT = 5

# One gateway process: the gRPC leg with a per-client fixed window of LIMIT calls
# per minute in Redis. It prints its port, serves until stdin closes, then stops.
PROCESS = """
import asyncio, sys
from stormguard import FixedWindow
from stormguard.gateway._config import Upstream
from stormguard.gateway._grpc_routes import CLIENT_KEY, GrpcRoute
from stormguard.gateway._grpc_server import start_grpc_proxy
from stormguard.gateway._upstream import UpstreamPool
from stormguard.server._decide import RuleSet
from stormguard.server._rules import Rule
from stormguard.stores import AsyncRedisStore

async def main(redis_url, prefix, upstream, limit):
    store = AsyncRedisStore(redis_url, prefix=prefix)
    rule = Rule(FixedWindow(limit, 60), key=lambda raw: raw[CLIENT_KEY], name="per-client")
    rules = RuleSet([rule], store=store, on_store_error="closed")
    pool = UpstreamPool("echo", Upstream(url=upstream))
    server = await start_grpc_proxy(
        "127.0.0.1:0",
        routes=[GrpcRoute("test.Echo", "echo", rules)],
        upstreams={"echo": pool},
        client_keys=["header:x-api-key", "ip"],
    )
    print(server.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    """The raw-bytes upstream on a free loopback port."""
    server = await Upstream().start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def gateways(redis_url: str, key_prefix: str, upstream: Upstream) -> Iterator[list[int]]:
    """Two gateway processes sharing the test Redis; their gRPC ports."""
    args = [redis_url, key_prefix, upstream.target, str(LIMIT)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        ports = []
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip().isdigit(), f"gateway process did not start: {line!r}"
            ports.append(int(line))
        yield ports
    finally:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def test_two_gateways_on_one_redis_admit_the_limit_exactly(
    gateways: list[int], upstream: Upstream
) -> None:
    """Calls alternating over two processes: exactly LIMIT pass for a key; another key is free."""
    outcomes: list[grpc.StatusCode] = []
    pushbacks: list[object] = []
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for port in gateways]
    try:
        for index in range(3 * LIMIT):
            method = channels[index % 2].unary_unary(f"/{SERVICE}/Unary")
            try:
                await method(b"a", metadata=(("x-api-key", "k1"),), timeout=20)
                outcomes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as error:
                outcomes.append(error.code())
                pushbacks.append(trailer(error.trailing_metadata(), PUSHBACK))
        other = channels[1].unary_unary(f"/{SERVICE}/Unary")
        assert await other(b"b", metadata=(("x-api-key", "k2"),), timeout=20) == b"echo:b"
    finally:
        for channel in channels:
            await channel.close()
    assert outcomes.count(grpc.StatusCode.OK) == LIMIT
    assert outcomes.count(grpc.StatusCode.UNAVAILABLE) == 2 * LIMIT
    assert None not in pushbacks
    assert len(upstream.seen) == LIMIT + 1
