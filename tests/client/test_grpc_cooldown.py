"""The gRPC interceptors' per-target cooldown: a pushback pauses the target, not the breaker."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest

from stormguard import CircuitBreaker, Constant, RateLimited, RetryPolicy, TokenBucket
from stormguard.grpc import AsyncRetryInterceptor, RetryInterceptor
from stormguard.protection import OriginGuards
from stormguard.testing import FakeClock

METHOD = "/demo.Payments/Charge"
UNAVAILABLE, OK = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK
POLICY = RetryPolicy(attempts=3, backoff=Constant(0.2, 0.2), deadline=30)
ONCE = RetryPolicy(attempts=1, deadline=30)


class Server:
    """A sync gRPC server whose one generic method answers a script of codes and
    pushbacks (the last repeats) and notes the fake clock's time of each arrival."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.steps: list[tuple[grpc.StatusCode, str | None]] = [(OK, None)]
        self.arrivals: list[float] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))

        def charge(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self._lock:
                index = len(self.arrivals)
                self.arrivals.append(self.clock.monotonic())
                code, pushback = self.steps[min(index, len(self.steps) - 1)]
            if pushback is not None:
                context.set_trailing_metadata((("grpc-retry-pushback-ms", pushback),))
            if code != OK:
                context.abort(code, f"scripted {code.name}")
            return b"charged:" + request

        handler = grpc.method_handlers_generic_handler(
            "demo.Payments", {"Charge": grpc.unary_unary_rpc_method_handler(charge)}
        )
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def play(self, *steps: tuple[grpc.StatusCode, str | None]) -> None:
        self.steps = list(steps)
        self.arrivals.clear()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock) -> Iterator[Server]:
    srv = Server(clock)
    try:
        yield srv
    finally:
        srv._server.stop(None)


def call_sync(interceptor: Any, port: int) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = grpc.intercept_channel(channel, interceptor).unary_unary(METHOD)
        try:
            stub(b"5", timeout=10)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
        return OK


def call_async(interceptor: Any, port: int) -> grpc.StatusCode:
    async def go() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=[interceptor]
        ) as channel:
            try:
                await channel.unary_unary(METHOD)(b"5", timeout=10)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return OK

    return asyncio.run(go())


KINDS = {"sync": (RetryInterceptor, call_sync), "aio": (AsyncRetryInterceptor, call_async)}


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    """(interceptor class, one call through it) for each flavour."""
    return KINDS[request.param]


def shared(clock: FakeClock) -> OriginGuards:
    """Guards holding only a cooldown, on the fake clock, to share between interceptors."""
    return OriginGuards(
        breaker=False,
        budget=False,
        bulkhead=False,
        pacing=False,
        clock=clock,
        rng=random.Random(7),
    )


def test_pushback_is_waited_then_the_call_succeeds(
    server: Server, clock: FakeClock, kind: tuple[Any, Any]
) -> None:
    """(a) UNAVAILABLE + pushback 1500 ms: the retry is sent no sooner than 1.5 s later."""
    make, call = kind
    server.play((UNAVAILABLE, "1500"), (OK, None))
    interceptor = make(policy=POLICY, idempotent=True, clock=clock, rng=random.Random(1))
    assert call(interceptor, server.port) == OK
    assert server.arrivals[0] == 0.0 and 1.5 <= server.arrivals[1] <= 1.65


def test_a_pushback_pauses_the_target_for_the_next_calls(
    server: Server, clock: FakeClock, kind: tuple[Any, Any]
) -> None:
    """(b) Another interceptor of the same target sharing the guards waits out the pause."""
    make, call = kind
    guards = shared(clock)
    server.play((UNAVAILABLE, "2000"), (OK, None))
    first = make(policy=ONCE, idempotent=True, clock=clock, target="Payments:443", guards=guards)
    assert call(first, server.port) == UNAVAILABLE  # one attempt: the pause stays
    second = make(policy=POLICY, idempotent=True, clock=clock, target="payments:443", guards=guards)
    assert call(second, server.port) == OK
    assert len(server.arrivals) == 2 and server.arrivals[1] >= 2.0
    assert clock.sleeps and 2.0 <= clock.sleeps[0] <= 2.5  # the pause, spread by at most 25 %


def test_the_same_interceptor_pauses_its_own_calls_by_default(
    server: Server, clock: FakeClock, kind: tuple[Any, Any]
) -> None:
    """Without ``target`` the cooldown covers every call through this interceptor."""
    make, call = kind
    server.play((UNAVAILABLE, "2000"), (OK, None))
    interceptor = make(policy=ONCE, idempotent=True, clock=clock)
    assert call(interceptor, server.port) == UNAVAILABLE
    assert call(interceptor, server.port) == OK
    assert server.arrivals[1] >= 2.0


def test_a_pause_longer_than_the_call_may_wait_fails_fast(
    server: Server, clock: FakeClock, kind: tuple[Any, Any]
) -> None:
    """(b) A call whose deadline ends before the pause never reaches the server."""
    make, call = kind
    guards = shared(clock)
    server.play((UNAVAILABLE, "60000"), (OK, None))
    first = make(policy=ONCE, idempotent=True, clock=clock, target="svc", guards=guards)
    assert call(first, server.port) == UNAVAILABLE
    hasty = RetryPolicy(attempts=3, deadline=5)
    second = make(policy=hasty, idempotent=True, clock=clock, target="svc", guards=guards)
    with pytest.raises(RateLimited) as caught:
        call(second, server.port)
    assert caught.value.retry_after == pytest.approx(60.0)
    assert len(server.arrivals) == 1 and clock.sleeps == []


def test_another_target_is_not_paused(
    server: Server, clock: FakeClock, kind: tuple[Any, Any]
) -> None:
    """(c) A pause of one target leaves calls to another target alone."""
    make, call = kind
    guards = shared(clock)
    server.play((UNAVAILABLE, "2000"), (OK, None))
    first = make(policy=ONCE, idempotent=True, clock=clock, target="a:1", guards=guards)
    assert call(first, server.port) == UNAVAILABLE
    other = make(policy=POLICY, idempotent=True, clock=clock, target="b:1", guards=guards)
    assert call(other, server.port) == OK
    assert server.arrivals == [0.0, 0.0] and clock.sleeps == []


def test_cooldown_false_turns_the_pause_off(
    server: Server, clock: FakeClock, kind: tuple[Any, Any]
) -> None:
    """``cooldown=False``: the next call is sent at once (only the call itself waits)."""
    make, call = kind
    server.play((UNAVAILABLE, "2000"), (OK, None))
    interceptor = make(policy=ONCE, idempotent=True, clock=clock, cooldown=False)
    assert call(interceptor, server.port) == UNAVAILABLE
    assert call(interceptor, server.port) == OK
    assert server.arrivals == [0.0, 0.0]


def test_pushback_refusals_never_count_for_the_breaker(
    server: Server, clock: FakeClock, kind: tuple[Any, Any]
) -> None:
    """(d) UNAVAILABLE with pushback is a refusal; without it, a server fault."""
    make, call = kind
    breaker = CircuitBreaker(min_calls=2, failure_rate=0.3, open_for=60, clock=clock)
    policy = RetryPolicy(attempts=3, backoff=Constant(0.2, 0.2), deadline=60, breaker=breaker)
    server.play((UNAVAILABLE, "100"))
    interceptor = make(policy=policy, idempotent=True, clock=clock)
    assert call(interceptor, server.port) == UNAVAILABLE
    assert call(interceptor, server.port) == UNAVAILABLE
    assert len(server.arrivals) == 6 and breaker.state == "closed"
    server.play((UNAVAILABLE, None))
    assert call(interceptor, server.port) == UNAVAILABLE
    assert breaker.state == "open"


def test_gateway_pushback_is_honoured_end_to_end(clock: FakeClock) -> None:
    """Through `stormguard gateway`'s gRPC leg: a limited call waits the gateway's
    pushback (on the same fake clock) and succeeds; the next call waits the pause."""
    from stormguard.gateway._config import Upstream as UpstreamSettings
    from stormguard.gateway._grpc_routes import GrpcRoute
    from stormguard.gateway._grpc_server import start_grpc_proxy
    from stormguard.gateway._upstream import UpstreamPool
    from stormguard.server._decide import RuleSet
    from stormguard.server._rules import Rule
    from stormguard.stores import MemoryStore

    upstream = Server(clock)
    try:

        async def go() -> list[float]:
            rules = RuleSet(
                [Rule(TokenBucket(1, 1), key="global", name="per-global")],
                store=MemoryStore(clock=clock),
            )
            settings = UpstreamSettings.model_validate({"url": f"grpc://127.0.0.1:{upstream.port}"})
            pool = UpstreamPool("pay", settings)
            proxy = await start_grpc_proxy(
                "127.0.0.1:0",
                routes=[GrpcRoute("demo.Payments", pool.name, rules, "unavailable")],
                upstreams={pool.name: pool},
                client_keys=("ip",),
            )
            try:
                interceptor = AsyncRetryInterceptor(
                    policy=POLICY, idempotent=True, clock=clock, rng=random.Random(3)
                )
                async with grpc.aio.insecure_channel(
                    f"127.0.0.1:{proxy.port}", interceptors=[interceptor]
                ) as channel:
                    method = channel.unary_unary(METHOD)
                    assert await method(b"1", timeout=10) == b"charged:1"
                    assert await method(b"2", timeout=10) == b"charged:2"  # refused, then waits
                    return list(clock.sleeps)
            finally:
                await proxy.stop(None)

        sleeps = asyncio.run(go())
    finally:
        upstream._server.stop(None)
    assert len(upstream.arrivals) == 2 and upstream.arrivals[1] >= 1.0
    assert sleeps and 1.0 <= sleeps[0] <= 1.1  # the 1000 ms pushback (+ hint jitter)
