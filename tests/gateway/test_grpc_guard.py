"""The gateway's gRPC leg protecting upstreams: limits, breaker, bulkhead, retries."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import grpc.aio
import pytest
from test_grpc_support import (
    RETRY_POLICY,
    SERVICE,
    Upstream,
    messages,
    trailer,
    upstream_fixture,  # noqa: F401  (the `upstream` fixture)
)

from net_support import free_port, refused_port
from stormguard import CircuitBreaker, Concurrency, RetryBudget, TokenBucket
from stormguard.gateway._clients import ClientIdentity, client_id
from stormguard.gateway._config import Upstream as UpstreamSettings
from stormguard.gateway._grpc_gateway import PUSHBACK, GrpcGateway
from stormguard.gateway._grpc_routes import CLIENT_KEY, GrpcRoute, RefuseWith
from stormguard.gateway._grpc_server import GrpcProxyServer, start_grpc_proxy
from stormguard.gateway._upstream import UpstreamPool
from stormguard.server._decide import RuleSet
from stormguard.server._overload import Ticket
from stormguard.server._priority import compile_priority
from stormguard.server._rules import Rule
from stormguard.stores import AsyncRedisStore, MemoryStore
from stormguard.testing import FakeClock

UNARY = f"/{SERVICE}/Unary"


class Gateway:
    """Starts proxies for a test and stops them all at its end."""

    def __init__(self) -> None:
        self.servers: list[GrpcProxyServer] = []

    async def start(
        self,
        upstream: UpstreamPool,
        *,
        limits: RuleSet | None = None,
        refuse_with: RefuseWith = "unavailable",
        client_keys: Sequence[str] = ("header:x-api-key", "ip"),
        classify: Any = None,
    ) -> GrpcProxyServer:
        """A proxy routing ``test.Echo`` to ``upstream`` with ``limits``."""
        route = GrpcRoute(SERVICE, upstream.name, limits, refuse_with, classify=classify)
        server = await start_grpc_proxy(
            "127.0.0.1:0",
            routes=[route],
            upstreams={upstream.name: upstream},
            client_keys=client_keys,
        )
        self.servers.append(server)
        return server


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    """Proxies started by the test, stopped after it."""
    holder = Gateway()
    try:
        yield holder
    finally:
        for server in holder.servers:
            await server.stop(None)


def by_client(raw: dict[str, str]) -> str:
    """The key the gateway's ``clients.key`` chose (how its config keys ``per: client``)."""
    return raw[CLIENT_KEY]


def limits(clock: FakeClock | None, *, rate: float = 1, per: str = "client") -> RuleSet:
    """A one-call burst refilling at ``rate`` per second, per client or global."""
    key = "global" if per == "global" else by_client
    rule = Rule(TokenBucket(rate, 1), key=key, name=f"per-{per}")
    return RuleSet([rule], store=MemoryStore(clock=clock))


def pool(url: str, **settings: object) -> UpstreamPool:
    """The gateway's upstream object for ``url`` with config ``settings``."""
    return UpstreamPool("echo", UpstreamSettings.model_validate({"url": url, **settings}))


async def unary(server: GrpcProxyServer, payload: bytes = b"a", key: str | None = None) -> bytes:
    """One unary call through ``server`` (``key`` as x-api-key)."""
    metadata = (("x-api-key", key),) if key else None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as chan:
        result: bytes = await chan.unary_unary(UNARY)(payload, metadata=metadata, timeout=20)
        return result


async def refused(server: GrpcProxyServer, key: str | None = None) -> grpc.aio.AioRpcError:
    """The error of a unary call expected to fail."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unary(server, key=key)
    return caught.value


@pytest.mark.parametrize(
    ("refuse_with", "code"),
    [
        ("unavailable", grpc.StatusCode.UNAVAILABLE),
        ("resource_exhausted", grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
)
async def test_over_the_limit_is_refused_with_pushback(
    gateway: Gateway,
    upstream: Upstream,
    clock: FakeClock,
    refuse_with: RefuseWith,
    code: grpc.StatusCode,
) -> None:
    """Over a limit: the route's code and a pushback trailer of the limiter's wait."""
    server = await gateway.start(
        pool(upstream.target), limits=limits(clock), refuse_with=refuse_with
    )
    assert await unary(server) == b"echo:a"
    error = await refused(server)
    assert error.code() is code
    assert trailer(error.trailing_metadata(), PUSHBACK) == "1000"
    assert len(upstream.seen) == 1
    assert server.stats[SERVICE] == {"allowed": 1, "limited:per-client": 1}


async def test_clients_are_limited_by_key_then_by_ip(
    gateway: Gateway, upstream: Upstream, clock: FakeClock
) -> None:
    """x-api-key names the client when present, the peer ip otherwise; quotas are separate."""
    server = await gateway.start(pool(upstream.target), limits=limits(clock))
    await unary(server, key="k1")
    assert (await refused(server, key="k1")).code() is grpc.StatusCode.UNAVAILABLE
    assert await unary(server, key="k2") == b"echo:a"
    assert await unary(server) == b"echo:a"  # by ip
    assert (await refused(server)).code() is grpc.StatusCode.UNAVAILABLE
    assert server.stats[SERVICE] == {"allowed": 3, "limited:per-client": 2}


async def test_global_limit_is_shared_by_every_client(
    gateway: Gateway, upstream: Upstream, clock: FakeClock
) -> None:
    """A ``per: global`` limit counts all clients together."""
    server = await gateway.start(pool(upstream.target), limits=limits(clock, per="global"))
    await unary(server, key="k1")
    error = await refused(server, key="k2")
    assert trailer(error.trailing_metadata(), PUSHBACK) == "1000"
    assert server.stats[SERVICE]["limited:per-global"] == 1


async def test_grpcio_retry_policy_waits_the_pushback_and_succeeds(
    gateway: Gateway, upstream: Upstream
) -> None:
    """A grpcio client with a retryPolicy (30 s backoff) retries after the 200 ms pushback."""
    server = await gateway.start(pool(upstream.target), limits=limits(None, rate=5))
    options = [("grpc.enable_retries", 1), ("grpc.service_config", RETRY_POLICY)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=options) as chan:
        method = chan.unary_unary(UNARY)
        assert await method(b"first", timeout=20) == b"echo:first"
        assert await method(b"second", timeout=20) == b"echo:second"
    assert [seen.requests for seen in upstream.seen] == [[b"first"], [b"second"]]
    stats = server.stats[SERVICE]
    assert stats["allowed"] == 2
    assert stats["limited:per-client"] >= 1


async def test_killed_upstream_opens_the_breaker_and_calls_fail_fast(
    gateway: Gateway, upstream: Upstream, clock: FakeClock
) -> None:
    """Upstream gone: its UNAVAILABLEs open the breaker; then UNAVAILABLE + pushback, no call."""
    upstream_pool = pool(upstream.target)
    breaker = upstream_pool.breaker = CircuitBreaker(
        min_calls=2, failure_rate=0.5, open_for=5, jitter=0, clock=clock
    )
    server = await gateway.start(upstream_pool)
    assert await unary(server) == b"echo:a"
    await upstream.stop()
    error = await refused(server)  # forwarded: the upstream's connect failure
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert trailer(error.trailing_metadata(), PUSHBACK) is None
    assert breaker.state == "open"  # 1 of 2 calls failed: rate 0.5
    for _ in range(3):
        error = await refused(server)
        assert error.code() is grpc.StatusCode.UNAVAILABLE
        assert trailer(error.trailing_metadata(), PUSHBACK) == "5000"
    assert server.stats[SERVICE] == {"allowed": 2, "breaker_open": 3}


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ],
)
async def test_caller_errors_do_not_open_the_breaker(
    gateway: Gateway, upstream: Upstream, clock: FakeClock, code: grpc.StatusCode
) -> None:
    """Caller errors pass through and leave the breaker closed."""
    upstream_pool = pool(upstream.target, breaker={"min_calls": 2})
    breaker = upstream_pool.breaker
    assert breaker is not None
    server = await gateway.start(upstream_pool)
    for _ in range(3):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await unary(server, f"fail:{code.name}".encode())
        assert caught.value.code() is code
    assert breaker.state == "closed"


async def test_upstream_unavailable_counts_for_the_breaker(
    gateway: Gateway, upstream: Upstream, clock: FakeClock
) -> None:
    """UNAVAILABLE and DEADLINE_EXCEEDED answered by the upstream are breaker failures."""
    upstream_pool = pool(upstream.target, breaker={"min_calls": 2})
    breaker = upstream_pool.breaker
    assert breaker is not None
    server = await gateway.start(upstream_pool)
    for code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        with pytest.raises(grpc.aio.AioRpcError):
            await unary(server, f"fail:{code}".encode())
    assert breaker.state == "open"


async def refused_while_one_hangs(
    server: GrpcProxyServer, upstream: Upstream
) -> grpc.aio.AioRpcError:
    """The error of a second call made while a first one hangs in the upstream."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as chan:
        hanging = chan.unary_unary(UNARY)(b"hang", timeout=20)
        await asyncio.wait_for(upstream.hanging.wait(), 10)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await chan.unary_unary(UNARY)(b"b", timeout=20)
        hanging.cancel()
    return caught.value


async def test_full_bulkhead_refuses_with_pushback(gateway: Gateway, upstream: Upstream) -> None:
    """With every slot taken, a call is refused UNAVAILABLE + pushback without reaching upstream."""
    server = await gateway.start(pool(upstream.target, bulkhead={"limit": 1}))
    error = await refused_while_one_hangs(server, upstream)
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert trailer(error.trailing_metadata(), PUSHBACK) == "1000"
    assert [seen.requests for seen in upstream.seen] == [[b"hang"]]
    assert server.stats[SERVICE]["bulkhead_full"] == 1


async def _seen_failing(channel: grpc.aio.Channel, call: asyncio.Task[bytes]) -> None:
    # Until the gateway's channel has failed to connect (the call's first attempt
    # refused). Polled, not waited on with wait_for_state_change: a state seen
    # between two reads can be missed, and once the call has ended the channel
    # goes idle and would never change again; the bound turns a miss into a failure.
    async with asyncio.timeout(20):
        while channel.get_state() is not grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            assert not call.done(), "the call ended before its first attempt was refused"
            await asyncio.sleep(0.005)


async def test_call_that_never_reached_the_upstream_is_retried(gateway: Gateway) -> None:
    """A unary call refused at connect is sent again once the upstream is up (budget paid)."""
    port = free_port()
    upstream = pool(f"grpc://127.0.0.1:{port}", retries={"attempts": 2}, timeout={"connect": 15})
    budget = upstream.budget = RetryBudget(ratio=0.0, min_per_second=0.1, window=10)
    server = await gateway.start(upstream)
    channel = server.gateway.channel("echo")
    call = asyncio.create_task(unary(server, b"late"))
    await _seen_failing(channel, call)
    late = await Upstream(port).start()
    try:
        assert await asyncio.wait_for(call, 30) == b"echo:late"
    finally:
        await late.stop()
    assert [seen.requests for seen in late.seen] == [[b"late"]]
    assert budget.balance() < 1


@pytest.mark.parametrize(
    ("payload", "budget"),
    [
        ((b"a", b"b"), RetryBudget()),  # a stream: never replayed
        ((b"a",), RetryBudget(ratio=0.0, min_per_second=0.0)),  # budget empty
    ],
)
async def test_streams_and_unbudgeted_calls_are_not_retried(
    gateway: Gateway, payload: tuple[bytes, ...], budget: RetryBudget
) -> None:
    """A client stream of two messages, or a call the budget does not pay for, fails at once."""
    upstream = pool(
        f"grpc://127.0.0.1:{refused_port()}", retries={"attempts": 3}, timeout={"connect": 60}
    )
    upstream.budget = budget
    server = await gateway.start(upstream)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as chan:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await chan.stream_unary(f"/{SERVICE}/Client")(messages(*payload), timeout=20)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_upstream_pushback_refusal_is_not_a_breaker_failure(
    gateway: Gateway, upstream: Upstream
) -> None:
    """An upstream's own UNAVAILABLE + pushback passes through and leaves the breaker closed."""
    upstream_pool = pool(upstream.target, breaker={"min_calls": 2})
    server = await gateway.start(upstream_pool)
    for _ in range(3):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await unary(server, b"refuse")
        assert trailer(caught.value.trailing_metadata(), PUSHBACK) == "50"
    assert upstream_pool.breaker is not None
    assert upstream_pool.breaker.state == "closed"


async def test_server_first_bidi_stream_flows_before_the_client_writes(
    gateway: Gateway, upstream: Upstream
) -> None:
    """The upstream's first message reaches a client that has not sent anything yet."""
    server = await gateway.start(pool(upstream.target))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as chan:
        call = chan.stream_stream(f"/{SERVICE}/Hello")(timeout=20)
        assert await call.read() == b"hello"
        await call.write(b"ping")
        assert await call.read() == b"ping"
        await call.done_writing()
        assert await call.code() is grpc.StatusCode.OK


async def test_concurrency_limit_slot_comes_back_when_the_call_ends(
    gateway: Gateway, upstream: Upstream
) -> None:
    """A Concurrency(1) limit refuses a second call while one is in flight, not after."""
    rule = Rule(Concurrency(1, 60), key=by_client, name="in-flight")
    server = await gateway.start(pool(upstream.target), limits=RuleSet([rule]))
    assert await unary(server) == b"echo:a"
    assert await unary(server) == b"echo:a"
    error = await refused_while_one_hangs(server, upstream)
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert server.stats[SERVICE]["limited:in-flight"] == 1


async def test_closed_mode_store_outage_is_unavailable_not_a_limit(
    gateway: Gateway, upstream: Upstream
) -> None:
    """With Redis down and on_store_error=closed, calls get UNAVAILABLE as store_unavailable."""
    store = AsyncRedisStore(f"redis://127.0.0.1:{refused_port()}/0")
    rule = Rule(TokenBucket(100, 100), key=by_client, name="per-client")
    rules = RuleSet([rule], store=store, on_store_error="closed")
    server = await gateway.start(
        pool(upstream.target), limits=rules, refuse_with="resource_exhausted"
    )
    error = await refused(server)
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert trailer(error.trailing_metadata(), PUSHBACK) is not None
    assert server.stats[SERVICE] == {"store_unavailable": 1}
    assert upstream.seen == []


async def test_update_swaps_routes_for_the_next_call(gateway: Gateway, upstream: Upstream) -> None:
    """After update() (a reload) the next call follows the new routes."""
    server = await gateway.start(pool(upstream.target))
    assert await unary(server) == b"echo:a"
    leg = server.gateway
    leg.update([GrpcRoute("other.Service", "echo")], leg.upstreams)
    error = await refused(server)
    assert error.code() is grpc.StatusCode.UNIMPLEMENTED
    assert len(upstream.seen) == 1


async def test_upstream_total_timeout_bounds_a_call_without_deadline(
    gateway: Gateway, upstream: Upstream
) -> None:
    """timeout.total is the upstream deadline when the client sets none; it counts as a timeout."""
    server = await gateway.start(pool(upstream.target, timeout={"total": 0.2}))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as chan:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await chan.unary_unary(UNARY)(b"hang")
    assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(upstream.cancelled.wait(), 10)
    assert server.stats[SERVICE] == {"upstream_timeout": 1}


async def test_access_log_line_names_policy_status_and_hashed_client(
    upstream: Upstream, caplog: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    """With access_log on, each call logs one JSON line; the client is a hash, never the key."""
    leg = GrpcGateway(
        routes=[GrpcRoute(SERVICE, "echo", limits(clock))],
        upstreams={"echo": pool(upstream.target)},
        identity=ClientIdentity(["header:x-api-key", "ip"], []),
        access_log=True,
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((leg,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with caplog.at_level(logging.INFO, logger="stormguard.gateway.access"):
            proxy = GrpcProxyServer(server, leg, port)
            await unary(proxy, key="secret-key")
            await refused(proxy, key="secret-key")
    finally:
        await server.stop(None)
        await leg.close()
    lines = [json.loads(r.message) for r in caplog.records if r.name.endswith("access")]
    assert [(line["status"], line["policy"]) for line in lines] == [
        ("OK", "allowed"),
        ("UNAVAILABLE", "limited:per-client"),
    ]
    assert {line["client"] for line in lines} == {client_id("h:x-api-key:secret-key")}
    assert "secret-key" not in caplog.text


async def test_overload_control_refuses_with_unavailable_and_pushback(
    gateway: Gateway, upstream: Upstream
) -> None:
    """The priority and overload stage on the gRPC leg: with the upstream's one slot
    held, a call is refused UNAVAILABLE + grpc-retry-pushback-ms (retry_after), and
    never reaches the upstream; once the slot is free the next call goes through."""
    upstream_pool = pool(upstream.target, overload={"limit": 1, "max_wait": 0, "retry_after": 3})
    control = upstream_pool.overload
    assert control is not None
    server = await gateway.start(upstream_pool, classify=compile_priority(None))
    held = await control.aenter()
    assert isinstance(held, Ticket)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unary(server, b"shed")
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert trailer(caught.value.trailing_metadata(), PUSHBACK) == "3000"
    assert control.refused["concurrency_limit"] == 1
    control.release(held)
    assert await unary(server, b"after") == b"echo:after"
    assert [seen.requests for seen in upstream.seen] == [[b"after"]]
    assert control.in_flight == 0 and control.admitted == 2
