"""Hedged requests (HedgingTransport, the gRPC hedging interceptors) against real
slow servers on loopback: the first answer wins, losers are dropped or cancelled,
extra copies come from the budget. Counts and order, never latencies."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import httpx
import pytest
from http_support import ScriptedServer, Step

from stormguard import HedgePolicy, RetryPolicy
from stormguard.grpc import (
    AsyncHedgingInterceptor,
    HedgingInterceptor,
    channel_options,
)
from stormguard.httpx import HedgingTransport, RetryTransport

QUICK = HedgePolicy(delay=0.05)
SLOW = 3.0  # seconds the first copy is held: far past any hedge delay here


def _get(transport: HedgingTransport, url: str, kind: str, method: str = "GET") -> httpx.Response:
    if kind == "sync":
        with httpx.Client(transport=transport, timeout=10) as client:
            response = client.request(method, url)
            response.read()
            return response

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            response = await client.request(method, url)
            await response.aread()
            return response

    return asyncio.run(go())


KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


@KINDS
def test_a_slow_first_copy_loses_to_the_hedge(server: ScriptedServer, kind: str) -> None:
    """The first copy is held 3 s; the hedge sent after 0.05 s answers first and is
    returned; it says Retry-Attempt: 2 (it is extra load)."""
    server.script(Step(delay=SLOW, body=b"slow"), Step(body=b"fast"))
    response = _get(HedgingTransport(policy=QUICK), server.url, kind)
    assert response.content == b"fast"
    assert len(server.received) == 2
    assert server.received[1].headers.get("Retry-Attempt") == "2"
    assert "Retry-Attempt" not in server.received[0].headers


@KINDS
def test_a_fast_answer_sends_no_hedge(server: ScriptedServer, kind: str) -> None:
    """An answer within the delay: one copy only."""
    server.script(Step(body=b"ok"))
    response = _get(HedgingTransport(policy=HedgePolicy(delay=5.0)), server.url, kind)
    assert response.content == b"ok" and len(server.received) == 1


@KINDS
def test_a_failing_copy_sends_the_next_at_once(server: ScriptedServer, kind: str) -> None:
    """503 is not final: the next copy goes without waiting the (long) delay."""
    server.script(Step(503), Step(body=b"second"))
    response = _get(HedgingTransport(policy=HedgePolicy(delay=30.0)), server.url, kind)
    assert response.content == b"second" and len(server.received) == 2


@KINDS
def test_when_every_copy_fails_the_last_failure_is_the_answer(
    server: ScriptedServer, kind: str
) -> None:
    """Three copies, all 503: the caller gets a 503 after exactly three requests."""
    server.script(Step(503))
    policy = HedgePolicy(attempts=3, delay=30.0)
    assert _get(HedgingTransport(policy=policy), server.url, kind).status_code == 503
    assert len(server.received) == 3


@KINDS
def test_an_empty_budget_sends_no_hedge(server: ScriptedServer, kind: str) -> None:
    """ratio 0 and no reserve: the slow copy is waited for; one request."""
    server.script(Step(delay=0.3, body=b"slow"), Step(body=b"fast"))
    policy = HedgePolicy(delay=0.05, ratio=0.0, min_per_second=0.0)
    assert _get(HedgingTransport(policy=policy), server.url, kind).content == b"slow"
    assert len(server.received) == 1


@KINDS
def test_writes_are_never_hedged(server: ScriptedServer, kind: str) -> None:
    """A POST goes straight through: one request, however slow."""
    server.script(Step(delay=0.3, status=201), Step(status=201))
    assert _get(HedgingTransport(policy=QUICK), server.url, kind, "POST").status_code == 201
    assert len(server.received) == 1


def test_hedging_under_retries_retries_what_the_race_lost(server: ScriptedServer) -> None:
    """RetryTransport over HedgingTransport: two 503 copies end the race, the retry
    (its own race) gets the 200."""
    server.script(Step(503), Step(503), Step(body=b"ok"))
    from stormguard import Constant
    from stormguard.testing import FakeClock

    hedging = HedgingTransport(policy=HedgePolicy(delay=30.0))
    policy = RetryPolicy(backoff=Constant(0.1, 0.1))
    transport = RetryTransport(hedging, policy=policy, clock=FakeClock(), breaker=False)
    with httpx.Client(transport=transport, timeout=10) as client:
        assert client.get(server.url).content == b"ok"
    assert len(server.received) == 3


# -- gRPC -----------------------------------------------------------------------------

METHOD = "/demo.Catalog/Get"


class SlowServer:
    """A gRPC server whose first call is held until cancelled or 3 s have passed."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.cancelled = 0
        self.lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))

        def get(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self.lock:
                index = len(self.seen)
                self.seen.append(dict(context.invocation_metadata()))
            if index == 0:
                deadline = time.monotonic() + SLOW
                while context.is_active() and time.monotonic() < deadline:
                    time.sleep(0.01)
                if not context.is_active():
                    with self.lock:
                        self.cancelled += 1
                return b"slow"
            return b"fast"

        handler = grpc.method_handlers_generic_handler(
            "demo.Catalog", {"Get": grpc.unary_unary_rpc_method_handler(get)}
        )
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def stop(self) -> None:
        self._server.stop(None)


@pytest.fixture
def slow_server() -> Iterator[SlowServer]:
    """A gRPC server with one slow first call, on 127.0.0.1."""
    srv = SlowServer()
    try:
        yield srv
    finally:
        srv.stop()


def test_grpc_sync_hedge_wins_and_is_numbered(slow_server: SlowServer) -> None:
    """Sync: the hedge answers first; it carries grpc-previous-rpc-attempts: 1."""
    interceptor = HedgingInterceptor(policy=QUICK, methods={METHOD})
    target = f"127.0.0.1:{slow_server.port}"
    with grpc.insecure_channel(target, options=channel_options()) as channel:
        stub = grpc.intercept_channel(channel, interceptor).unary_unary(METHOD)
        assert stub(b"x", timeout=10) == b"fast"
    assert len(slow_server.seen) == 2
    assert slow_server.seen[1].get("grpc-previous-rpc-attempts") == "1"
    assert "grpc-previous-rpc-attempts" not in slow_server.seen[0]


def test_grpc_aio_hedge_wins_and_the_loser_is_cancelled(
    slow_server: SlowServer, eventually: Any
) -> None:
    """aio: the hedge answers first, and the slow copy's RPC is cancelled."""

    async def go() -> bytes:
        interceptor = AsyncHedgingInterceptor(policy=QUICK, methods=True)
        target = f"127.0.0.1:{slow_server.port}"
        async with grpc.aio.insecure_channel(
            target, interceptors=[interceptor], options=channel_options()
        ) as channel:
            answer: bytes = await channel.unary_unary(METHOD)(b"x", timeout=10)
            return answer

    assert asyncio.run(go()) == b"fast"
    assert len(slow_server.seen) == 2
    eventually(lambda: slow_server.cancelled == 1)


def test_grpc_hedging_policy_from_the_service_config(slow_server: SlowServer) -> None:
    """A method's hedgingPolicy (maxAttempts, hedgingDelay) makes it hedged; methods
    the config does not name go straight through."""
    config = {
        "methodConfig": [
            {
                "name": [{"service": "demo.Catalog", "method": "Get"}],
                "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"},
            }
        ]
    }
    interceptor = HedgingInterceptor(service_config=config)
    target = f"127.0.0.1:{slow_server.port}"
    with grpc.insecure_channel(target, options=channel_options(config)) as channel:
        stub = grpc.intercept_channel(channel, interceptor).unary_unary(METHOD)
        assert stub(b"x", timeout=10) == b"fast"
    assert len(slow_server.seen) == 2
