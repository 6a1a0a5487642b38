"""The gRPC interceptors' overload control against real servers on loopback: calls shed
in priority order, retries (grpc-previous-rpc-attempts) after first attempts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest

from stormguard.asgi import OverloadControl
from stormguard.grpc import AsyncRateLimitServerInterceptor, RateLimitServerInterceptor

SERVICE, METHOD = "demo.Orders", "/demo.Orders/Place"


class Server:
    """A grpc.server whose Place calls wait for `gate`; `runs` lists the bodies it ran."""

    def __init__(self, interceptor: Any) -> None:
        self.runs: list[bytes] = []
        self.gate = threading.Event()
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8), interceptors=[interceptor]
        )

        def place(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.runs.append(request)
            self.gate.wait(30)
            if request == b"fail":
                context.abort(grpc.StatusCode.INTERNAL, "failed")
            if request == b"unavailable-once" and self.runs.count(request) == 1:
                context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
            return b"placed:" + request

        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Place": grpc.unary_unary_rpc_method_handler(place)}
        )
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


@pytest.fixture
def serve() -> Iterator[Callable[[Any], Server]]:
    """Start servers; stop them after the test."""
    started: list[Server] = []

    def start(interceptor: Any) -> Server:
        server = Server(interceptor)
        started.append(server)
        return server

    yield start
    for server in started:
        server.gate.set()
        server.server.stop(None)


def _call(port: int, body: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            return channel.unary_unary(METHOD)(body, metadata=metadata, timeout=30)
        except grpc.RpcError as exc:
            return exc


def _until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, "condition never reached"
        time.sleep(0.01)


def test_calls_are_served_in_shedding_order(serve: Callable[[Any], Server]) -> None:
    """Critical (by metadata header) first, first attempts next, retries last."""
    # the line is held on purpose between steps in real time: no controlled delay
    control = OverloadControl(1, max_queue=5, max_wait=30, standing_wait=None)
    interceptor = RateLimitServerInterceptor(
        overload=control, priority={"header": "x-priority", "trust": "always"}
    )
    server = serve(interceptor)
    with futures.ThreadPoolExecutor(4) as pool:
        holder = pool.submit(_call, server.port, b"holder")
        _until(lambda: server.runs == [b"holder"])
        queued = [
            (b"retry", (("retry-attempt", "2"),)),  # grpc-python drops a user's grpc-*
            (b"first", ()),
            (b"critical", (("x-priority", "critical"),)),
        ]
        calls = []
        for body, metadata in queued:
            calls.append(pool.submit(_call, server.port, body, metadata))
            count = len(calls)
            _until(lambda count=count: control.waiting == count)
        server.gate.set()
        answers = [holder.result(), *(c.result() for c in calls)]
    assert answers == [b"placed:holder", b"placed:retry", b"placed:first", b"placed:critical"]
    assert server.runs == [b"holder", b"critical", b"first", b"retry"]
    assert control.in_flight == 0 and control.admitted == 4


class Recording(OverloadControl):
    """An OverloadControl that records the attempt number of every call it ranks."""

    attempts: list[int]

    def enter(self, priority: Any = 1, attempt: int = 1, client: str | None = None) -> Any:
        self.attempts.append(attempt)
        return super().enter(priority, attempt, client)


def test_grpc_core_retries_rank_as_retries(serve: Callable[[Any], Server]) -> None:
    """A retry made by grpc core's retryPolicy carries grpc-previous-rpc-attempts: 1,
    read as attempt 2."""
    control = Recording(4)
    control.attempts = []
    server = serve(RateLimitServerInterceptor(overload=control))
    server.gate.set()
    config = {
        "methodConfig": [
            {
                "name": [{"service": SERVICE}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.01s",
                    "maxBackoff": "0.05s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
    options = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", options=options) as channel:
        answer = channel.unary_unary(METHOD)(b"unavailable-once", timeout=30)
    assert answer == b"placed:unavailable-once"
    assert control.attempts == [1, 2]


def test_refused_call_is_unavailable_with_pushback(serve: Callable[[Any], Server]) -> None:
    """No room and no waiting: UNAVAILABLE + grpc-retry-pushback-ms of retry_after."""
    control = OverloadControl(1, max_wait=0, retry_after=3)
    server = serve(RateLimitServerInterceptor(overload=control))
    with futures.ThreadPoolExecutor(1) as pool:
        holder = pool.submit(_call, server.port, b"holder")
        _until(lambda: server.runs == [b"holder"])
        refused = _call(server.port, b"late")
        server.gate.set()
        assert holder.result() == b"placed:holder"
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert dict(refused.trailing_metadata())["grpc-retry-pushback-ms"] == "3000"
    assert control.refused == {"concurrency_limit": 1} and server.runs == [b"holder"]


def test_failed_calls_feed_admission_control(serve: Callable[[Any], Server]) -> None:
    """A call ending in an error status is a failure for the admission control."""
    control = OverloadControl(4, admission={"min_rps": 0})
    server = serve(RateLimitServerInterceptor(overload=control))
    server.gate.set()
    failed = _call(server.port, b"fail")
    assert failed.code() == grpc.StatusCode.INTERNAL
    assert control.admission is not None
    assert control.admission.status()["requests"] == 1
    assert control.admission.status()["successes"] == 0
    assert control.in_flight == 0


async def test_aio_interceptor_sheds_too() -> None:
    """The grpc.aio twin refuses past the limit with UNAVAILABLE + pushback."""
    control = OverloadControl(1, max_wait=0)
    gate = threading.Event()

    async def place(request: bytes, context: Any) -> bytes:
        while not gate.is_set():
            await _sleep()
        return b"placed:" + request

    server = grpc.aio.server(interceptors=[AsyncRateLimitServerInterceptor(overload=control)])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE, {"Place": grpc.unary_unary_rpc_method_handler(place)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = channel.unary_unary(METHOD)
            held = stub(b"holder")
            while control.in_flight == 0:
                await _sleep()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub(b"late")
            gate.set()
            assert await held == b"placed:holder"
    finally:
        await server.stop(None)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "grpc-retry-pushback-ms" in dict(refused.value.trailing_metadata())
    assert control.in_flight == 0 and control.refused == {"concurrency_limit": 1}


async def _sleep() -> None:
    import asyncio

    await asyncio.sleep(0.005)  # polling a state another task changes, not a backoff
