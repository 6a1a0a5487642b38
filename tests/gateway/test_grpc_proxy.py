"""The gateway's gRPC leg as a proxy: any method, all four kinds, as raw bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from test_grpc_support import (
    SERVICE,
    Upstream,
    messages,
    trailer,
    upstream_fixture,  # noqa: F401  (the `upstream` fixture)
)

from stormguard.gateway._config import Upstream as UpstreamSettings
from stormguard.gateway._grpc_proxy import forwardable, forwarded_for
from stormguard.gateway._grpc_routes import GrpcRoute, target_of
from stormguard.gateway._grpc_server import GrpcProxyServer, start_grpc_proxy
from stormguard.gateway._upstream import UpstreamPool


def pool(url: str) -> dict[str, UpstreamPool]:
    """The gateway's upstream object for ``url``, by name."""
    return {"echo": UpstreamPool("echo", UpstreamSettings(url=url))}


@pytest.fixture
async def proxy(upstream: Upstream) -> AsyncIterator[GrpcProxyServer]:
    """A gateway gRPC listener routing ``test.Echo`` to the upstream."""
    server = await start_grpc_proxy(
        "127.0.0.1:0",
        routes=[GrpcRoute(SERVICE, "echo")],
        upstreams=pool(upstream.target),
    )
    try:
        yield server
    finally:
        await server.stop(None)


@pytest.fixture
async def channel(proxy: GrpcProxyServer) -> AsyncIterator[grpc.aio.Channel]:
    """A client channel to the proxy."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{proxy.port}") as chan:
        yield chan


async def call_kind(channel: grpc.aio.Channel, kind: str, *payload: bytes, **kw: Any) -> Any:
    """Start a call of ``kind`` with ``payload`` as its request(s)."""
    method = f"/{SERVICE}/{kind}"
    if kind == "Unary":
        return channel.unary_unary(method)(payload[0], **kw)
    if kind == "Server":
        return channel.unary_stream(method)(payload[0], **kw)
    if kind == "Client":
        return channel.stream_unary(method)(messages(*payload), **kw)
    return channel.stream_stream(method)(messages(*payload), **kw)


async def responses(call: Any, kind: str) -> list[bytes]:
    """Every response message of a call."""
    if kind in ("Unary", "Client"):
        return [await call]
    return [message async for message in call]


EXPECTED = {
    "Unary": [b"echo:a"],
    "Server": [b"0:a", b"1:a", b"2:a"],
    "Client": [b"a+b"],
    "Bidi": [b"A", b"B"],
}
KINDS = sorted(EXPECTED)


@pytest.mark.parametrize("kind", KINDS)
async def test_every_kind_passes_through_with_metadata_and_trailers(
    channel: grpc.aio.Channel, upstream: Upstream, kind: str
) -> None:
    """Messages, request metadata, initial metadata, trailers and OK all cross the proxy."""
    payload = (b"a",) if kind in ("Unary", "Server") else (b"a", b"b")
    metadata = (("x-api-key", "k1"), ("x-blob-bin", b"\xff\x00"), ("x-forwarded-for", "6.6.6.6"))
    call = await call_kind(channel, kind, *payload, metadata=metadata, timeout=10)
    assert await responses(call, kind) == EXPECTED[kind]
    assert trailer(await call.initial_metadata(), "x-up") == "1"
    trailers = await call.trailing_metadata()
    assert trailer(trailers, "x-trail") == "done"
    assert trailer(trailers, "x-trail-bin") == b"\x00\x01"
    assert await call.code() is grpc.StatusCode.OK
    [seen] = upstream.seen
    assert (seen.method, seen.requests) == (kind, list(payload))
    assert seen.metadata["x-api-key"] == "k1"
    assert seen.metadata["x-blob-bin"] == b"\xff\x00"
    assert seen.metadata["x-forwarded-for"] == "127.0.0.1"  # the client's claim is not believed


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE],
)
async def test_upstream_status_details_and_trailers_pass_back(
    channel: grpc.aio.Channel, kind: str, code: grpc.StatusCode
) -> None:
    """An upstream error keeps its code, details and trailers (not UNKNOWN)."""
    call = await call_kind(channel, kind, f"fail:{code.name}".encode(), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await responses(call, kind)
    error = caught.value
    assert error.code() is code
    assert error.details() == f"asked for {code.name}"
    assert trailer(error.trailing_metadata(), "x-trail") == "failed"


async def test_unrouted_method_is_unimplemented(channel: grpc.aio.Channel) -> None:
    """A service no route names is answered UNIMPLEMENTED by the proxy itself."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await channel.unary_unary("/other.Service/Unary")(b"x", timeout=10)
    assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_method_route_covers_only_that_method(upstream: Upstream) -> None:
    """A ``service/method`` route forwards that method and no other of the service."""
    server = await start_grpc_proxy(
        "127.0.0.1:0",
        routes=[GrpcRoute(f"{SERVICE}/Unary", "echo")],
        upstreams=pool(upstream.target),
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as chan:
            assert await chan.unary_unary(f"/{SERVICE}/Unary")(b"a", timeout=10) == b"echo:a"
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await chan.unary_stream(f"/{SERVICE}/Server")(b"a", timeout=10).read()
            assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(None)
    assert [seen.method for seen in upstream.seen] == ["Unary"]


@pytest.mark.parametrize("kind", KINDS)
async def test_client_deadline_cancels_the_upstream_call(
    channel: grpc.aio.Channel, upstream: Upstream, kind: str
) -> None:
    """A client deadline ends the call and the upstream handler sees it cancelled (1 s:
    on a busy machine a shorter one can pass before the call reaches the upstream)."""
    call = await call_kind(channel, kind, b"hang", timeout=1.0)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await responses(call, kind)
    assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(upstream.cancelled.wait(), 10)
    [seen] = upstream.seen
    assert seen.cancelled


async def test_client_cancel_cancels_the_upstream_stream(
    channel: grpc.aio.Channel, upstream: Upstream
) -> None:
    """A client that cancels a bidi stream mid-way gets the upstream handler cancelled."""
    call = channel.stream_stream(f"/{SERVICE}/Bidi")(messages(b"hang"))
    await asyncio.wait_for(upstream.hanging.wait(), 10)
    call.cancel()
    await asyncio.wait_for(upstream.cancelled.wait(), 10)
    assert upstream.seen[0].cancelled


def test_transport_headers_are_not_forwarded() -> None:
    """Hop and grpc transport headers are dropped; application ones and pushback pass."""
    pairs = (
        ("user-agent", "x"),
        ("te", "trailers"),
        ("grpc-timeout", "1S"),
        (":authority", "a"),
        ("x-api-key", "k"),
        ("grpc-retry-pushback-ms", "10"),
    )
    assert forwardable(pairs) == (("x-api-key", "k"), ("grpc-retry-pushback-ms", "10"))


@pytest.mark.parametrize(
    ("urls", "target"),
    [
        (["grpc://127.0.0.1:50051"], "127.0.0.1:50051"),
        (["grpc://localhost:7/"], "localhost:7"),
        (["grpc://10.0.0.1:1", "grpc://10.0.0.2:2"], "ipv4:10.0.0.1:1,10.0.0.2:2"),
    ],
)
def test_upstream_urls_become_a_channel_target(urls: list[str], target: str) -> None:
    """One URL is HOST:PORT; several IPv4 ones are one balanced ipv4: target."""
    assert target_of(urls) == target


@pytest.mark.parametrize(("trusted", "value"), [(False, "10.0.0.9"), (True, "1.2.3.4, 10.0.0.9")])
def test_forwarded_for_keeps_the_chain_only_from_a_trusted_proxy(trusted: bool, value: str) -> None:
    """x-forwarded-for names the client; an incoming chain survives only from a trusted peer."""
    pairs = (("x-forwarded-for", "1.2.3.4"), ("x-api-key", "k"))
    assert forwarded_for(pairs, "10.0.0.9", trusted) == (
        ("x-api-key", "k"),
        ("x-forwarded-for", value),
    )
