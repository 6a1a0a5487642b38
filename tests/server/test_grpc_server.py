"""gRPC server interceptors (grpc and grpc.aio) against real servers on loopback."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest

from stormguard import TokenBucket
from stormguard._errors import ConfigError
from stormguard.asgi import Rule
from stormguard.grpc import AsyncRateLimitServerInterceptor, RateLimitServerInterceptor
from stormguard.server._grpc import peer_address

SERVICE, METHOD = "demo.Payments", "/demo.Payments/Charge"


class Counter(grpc.ServerInterceptor):  # type: ignore[misc]
    """The outermost interceptor: counts every attempt that reaches the server."""

    def __init__(self) -> None:
        self.attempts = 0

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        self.attempts += 1
        return continuation(details)


class App:
    """A gRPC server with one generic unary method behind the given interceptors."""

    def __init__(self, interceptor: Any) -> None:
        self.runs: list[bytes] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.counter = Counter()
        self.fail_first = False
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8), interceptors=[self.counter, interceptor]
        )

        def charge(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.runs.append(request)
            self.entered.set()
            self.gate.wait(30)
            if self.fail_first and len(self.runs) == 1:
                context.abort(grpc.StatusCode.INTERNAL, "first attempt fails")
            return b"charged:" + request + b":" + str(len(self.runs)).encode()

        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Charge": grpc.unary_unary_rpc_method_handler(charge)}
        )
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def channel(self, retry: bool = False) -> grpc.Channel:
        """A channel to the server, optionally with a gRPC retry policy on UNAVAILABLE."""
        options: list[tuple[str, Any]] = []
        if retry:
            config = {
                "methodConfig": [
                    {
                        "name": [{"service": SERVICE}],
                        "retryPolicy": {
                            "maxAttempts": 5,
                            "initialBackoff": "0.01s",
                            "maxBackoff": "0.1s",
                            "backoffMultiplier": 2,
                            "retryableStatusCodes": ["UNAVAILABLE"],
                        },
                    }
                ]
            }
            options = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]
        return grpc.insecure_channel(f"127.0.0.1:{self.port}", options=options)


@pytest.fixture
def make_app() -> Iterator[Any]:
    """Build servers; stop them after the test."""
    apps: list[App] = []

    def make(interceptor: Any) -> App:
        app = App(interceptor)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.gate.set()
        app.server.stop(None)


def call(channel: grpc.Channel, body: bytes = b"10", **metadata: str) -> Any:
    """Call Charge; return (response, trailers) or the RpcError."""
    stub = channel.unary_unary(METHOD)
    try:
        response, rpc = stub.with_call(body, metadata=tuple(metadata.items()), timeout=30)
    except grpc.RpcError as exc:
        return exc
    return response, dict(rpc.trailing_metadata() or ())


def per_key(rate: float = 0.1, **options: Any) -> RateLimitServerInterceptor:
    """An interceptor limiting each x-api-key to 1 call, refilled ``rate`` per second."""
    rules = [Rule(TokenBucket(rate=rate, burst=1), key="header:x-api-key")]
    return RateLimitServerInterceptor(rules, **options)


def test_over_limit_is_unavailable_with_pushback(make_app: Any) -> None:
    """Over the limit: UNAVAILABLE + grpc-retry-pushback-ms; another key unaffected."""
    app = make_app(per_key())
    with app.channel() as channel:
        assert call(channel, **{"x-api-key": "a"})[0] == b"charged:10:1"
        refused = call(channel, **{"x-api-key": "a"})
        other = call(channel, **{"x-api-key": "b"})
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    pushback = int(dict(refused.trailing_metadata())["grpc-retry-pushback-ms"])
    assert 0 < pushback <= 10_000
    assert other[0] == b"charged:10:2"
    assert len(app.runs) == 2


def test_grpc_retry_policy_waits_the_pushback_and_succeeds(make_app: Any) -> None:
    """A grpcio client with a retryPolicy obeys the pushback: one refusal, then success."""
    app = make_app(per_key(rate=2))  # a token every 0.5 s: the pushback is short
    with app.channel(retry=True) as channel:
        first = call(channel, **{"x-api-key": "a"})
        second = call(channel, **{"x-api-key": "a"})
    assert first[0] == b"charged:10:1" and second[0] == b"charged:10:2"
    assert app.counter.attempts == 3  # first, refused, retried after the pushback


def test_resource_exhausted_mode(make_app: Any) -> None:
    """refuse_with="resource_exhausted" answers RESOURCE_EXHAUSTED."""
    app = make_app(per_key(refuse_with="resource_exhausted"))
    with app.channel() as channel:
        call(channel, **{"x-api-key": "a"})
        refused = call(channel, **{"x-api-key": "a"})
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_ip_key_is_the_peer_without_port(make_app: Any) -> None:
    """key="ip": calls from one host share a quota whatever their source port."""
    app = make_app(RateLimitServerInterceptor([Rule("1/minute", key="ip")]))
    with app.channel() as one, app.channel() as two:
        assert isinstance(call(one), tuple)
        refused = call(two)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:127.0.0.1:50051", "127.0.0.1"),
        ("ipv6:[::1]:50051", "::1"),
        ("ipv6:%5B::1%5D:50051", "::1"),
        ("unix:/tmp/sock", "/tmp/sock"),
    ],
)
def test_peer_address(peer: str, address: str) -> None:
    """gRPC peer strings lose their scheme and port."""
    assert peer_address(peer) == address


def test_concurrency_limit(make_app: Any) -> None:
    """Past the concurrency limit a call gets UNAVAILABLE + pushback; the slot comes back."""
    app = make_app(RateLimitServerInterceptor(concurrency=1))
    app.gate.clear()
    with app.channel() as channel:
        with futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(call, channel)
            assert app.entered.wait(30)
            refused = call(channel)
            app.gate.set()
            assert isinstance(held.result(), tuple)
        after = call(channel)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert dict(refused.trailing_metadata())["grpc-retry-pushback-ms"] == "1000"
    assert isinstance(after, tuple) and len(app.runs) == 2


def test_unary_idempotency_by_metadata_key(make_app: Any) -> None:
    """A keyed unary call runs once; a retry replays it; another request is refused."""
    app = make_app(RateLimitServerInterceptor(idempotency=True))
    with app.channel() as channel:
        first = call(channel, **{"idempotency-key": "k"})
        again = call(channel, **{"idempotency-key": "k"})
        changed = call(channel, b"11", **{"idempotency-key": "k"})
        unkeyed = [call(channel) for _ in range(2)]
    assert first[0] == again[0] == b"charged:10:1"
    assert again[1].get("idempotent-replayed") == "true"
    assert changed.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [u[0] for u in unkeyed] == [b"charged:10:2", b"charged:10:3"]


def test_failed_keyed_call_runs_again(make_app: Any) -> None:
    """A keyed call ending in an error status is released: the retry executes."""
    app = make_app(RateLimitServerInterceptor(idempotency=True))
    app.fail_first = True
    with app.channel() as channel:
        failed = call(channel, **{"idempotency-key": "k"})
        retried = call(channel, **{"idempotency-key": "k"})
    assert failed.code() == grpc.StatusCode.INTERNAL
    assert retried[0] == b"charged:10:2"


def test_invalid_refuse_with() -> None:
    """refuse_with accepts only unavailable and resource_exhausted."""
    with pytest.raises(ConfigError, match="refuse_with"):
        RateLimitServerInterceptor(refuse_with="deadline_exceeded")


async def test_aio_interceptor_limits_and_replays() -> None:
    """The grpc.aio twin: pushback over the limit, one execution per idempotency key."""
    runs: list[bytes] = []

    async def charge(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        runs.append(request)
        return b"ok:" + str(len(runs)).encode()

    interceptor = AsyncRateLimitServerInterceptor(
        [Rule(TokenBucket(rate=0.1, burst=1), key="header:x-api-key")], idempotency=True
    )
    server = grpc.aio.server(interceptors=[interceptor])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE, {"Charge": grpc.unary_unary_rpc_method_handler(charge)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = channel.unary_unary(METHOD)
            first = await stub(b"x", metadata=(("x-api-key", "a"), ("idempotency-key", "k")))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub(b"x", metadata=(("x-api-key", "a"),))
            replay = stub(b"x", metadata=(("x-api-key", "b"), ("idempotency-key", "k")))
            assert await replay == first == b"ok:1"
            trailers = dict(await replay.trailing_metadata() or ())
    finally:
        await server.stop(None)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert int(dict(info.value.trailing_metadata())["grpc-retry-pushback-ms"]) > 0
    assert trailers.get("idempotent-replayed") == "true"
    assert runs == [b"x"]


def test_keyed_duplicate_in_flight_is_aborted_with_pushback(make_app: Any) -> None:
    """A duplicate while the first keyed call runs: ABORTED + pushback, not run twice."""
    app = make_app(RateLimitServerInterceptor(idempotency=True))
    app.gate.clear()
    with app.channel() as channel, futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(call, channel, **{"idempotency-key": "k"})
        assert app.entered.wait(30)
        duplicate = call(channel, **{"idempotency-key": "k"})
        app.gate.set()
        assert first.result(30)[0] == b"charged:10:1"
    assert duplicate.code() == grpc.StatusCode.ABORTED
    assert dict(duplicate.trailing_metadata())["grpc-retry-pushback-ms"] == "1000"
    assert app.runs == [b"10"]


class AioApp:
    """A grpc.aio server whose Charge can be held (``gate``) or made to fail once."""

    def __init__(self) -> None:
        self.runs: list[bytes] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()
        self.fail_first = False
        self.server = grpc.aio.server(
            interceptors=[AsyncRateLimitServerInterceptor(idempotency=True)]
        )

        async def charge(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            self.runs.append(request)
            self.entered.set()
            await self.gate.wait()
            if self.fail_first and len(self.runs) == 1:
                await context.abort(grpc.StatusCode.INTERNAL, "first attempt fails")
            return b"ok:" + str(len(self.runs)).encode()

        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Charge": grpc.unary_unary_rpc_method_handler(charge)}
        )
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def call(self, channel: grpc.aio.Channel, key: str) -> Any:
        """Call Charge with an idempotency key; the response or the AioRpcError."""
        try:
            return await channel.unary_unary(METHOD)(b"x", metadata=(("idempotency-key", key),))
        except grpc.aio.AioRpcError as exc:
            return exc


@pytest.fixture
async def aio_app() -> AsyncIterator[AioApp]:
    """A started AioApp; stopped after the test."""
    app = AioApp()
    await app.server.start()
    yield app
    app.gate.set()
    await app.server.stop(None)


async def test_aio_keyed_duplicate_in_flight_is_aborted(aio_app: AioApp) -> None:
    """grpc.aio: a duplicate while the first keyed call runs gets ABORTED + pushback."""
    aio_app.gate.clear()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{aio_app.port}") as channel:
        first = asyncio.ensure_future(aio_app.call(channel, "k"))
        await asyncio.wait_for(aio_app.entered.wait(), 30)
        duplicate = await aio_app.call(channel, "k")
        aio_app.gate.set()
        assert await first == b"ok:1"
    assert duplicate.code() == grpc.StatusCode.ABORTED
    assert dict(duplicate.trailing_metadata())["grpc-retry-pushback-ms"] == "1000"
    assert aio_app.runs == [b"x"]


async def test_aio_failed_keyed_call_runs_again(aio_app: AioApp) -> None:
    """grpc.aio: a keyed call ending in an error status is released; the retry runs."""
    aio_app.fail_first = True
    async with grpc.aio.insecure_channel(f"127.0.0.1:{aio_app.port}") as channel:
        failed = await aio_app.call(channel, "k")
        retried = await aio_app.call(channel, "k")
        replayed = await aio_app.call(channel, "k")
    assert failed.code() == grpc.StatusCode.INTERNAL
    assert retried == replayed == b"ok:2"
