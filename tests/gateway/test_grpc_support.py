"""Support for the gRPC gateway tests: an upstream grpc.aio server with raw-bytes handlers.

No .proto files: the upstream registers generic handlers for ``test.Echo`` with one
method of each kind; messages are bytes. Nothing here is collected as a test; the
``upstream`` fixture is imported by the test modules.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest

SERVICE = "test.Echo"
Pairs = tuple[tuple[str, str | bytes], ...]

# A grpcio client retry policy (gRFC A6) that only a pushback makes fast: its own
# backoff is far longer than the test's deadline.
RETRY_POLICY = (
    '{"methodConfig": [{"name": [{"service": "test.Echo"}], "retryPolicy": {'
    '"maxAttempts": 3, "initialBackoff": "30s", "maxBackoff": "30s", '
    '"backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}'
)


@dataclass
class Seen:
    """What the upstream observed of one call."""

    method: str
    metadata: dict[str, str | bytes]
    requests: list[bytes] = field(default_factory=list)
    cancelled: bool = False


class Upstream:
    """A real grpc.aio server on 127.0.0.1 answering ``test.Echo/{Unary,Server,Client,Bidi}``.

    A request ``b"fail:CODE"`` makes the method answer that status (with details
    and a trailer); ``b"refuse"`` answers UNAVAILABLE with its own pushback trailer;
    ``b"hang"`` makes it wait until cancelled (noted in ``seen``). Every call
    answers initial metadata ``x-up: 1`` and trailer ``x-trail: done``. ``Hello``
    is a bidi method that speaks first, then echoes.
    """

    def __init__(self, port: int = 0) -> None:
        self.seen: list[Seen] = []
        self.hanging = asyncio.Event()
        self.cancelled = asyncio.Event()
        self._server = grpc.aio.server()
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(self._unary),
            "Server": grpc.unary_stream_rpc_method_handler(self._server_stream),
            "Client": grpc.stream_unary_rpc_method_handler(self._client_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(self._bidi),
            "Hello": grpc.stream_stream_rpc_method_handler(self._hello),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")

    @property
    def target(self) -> str:
        """``grpc://127.0.0.1:PORT``."""
        return f"grpc://127.0.0.1:{self.port}"

    async def start(self) -> Upstream:
        """Start serving."""
        await self._server.start()
        return self

    async def stop(self) -> None:
        """Stop at once (calls in flight are cancelled)."""
        await self._server.stop(None)

    async def _begin(self, name: str, context: Any) -> Seen:
        seen = Seen(name, dict(context.invocation_metadata() or ()))
        self.seen.append(seen)
        await context.send_initial_metadata((("x-up", "1"),))
        context.set_trailing_metadata((("x-trail", "done"), ("x-trail-bin", b"\x00\x01")))
        return seen

    async def _answer(self, seen: Seen, context: Any, request: bytes) -> None:
        seen.requests.append(request)
        if request.startswith(b"fail:"):
            code = grpc.StatusCode[request[5:].decode()]
            context.set_trailing_metadata((("x-trail", "failed"),))
            await context.abort(code, f"asked for {code.name}")
        if request == b"refuse":
            context.set_trailing_metadata((("grpc-retry-pushback-ms", "50"),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
        if request == b"hang":
            self.hanging.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                seen.cancelled = True
                self.cancelled.set()
                raise

    async def _unary(self, request: bytes, context: Any) -> bytes:
        seen = await self._begin("Unary", context)
        await self._answer(seen, context, request)
        return b"echo:" + request

    async def _server_stream(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        seen = await self._begin("Server", context)
        for index in range(3):
            yield b"%d:%s" % (index, request)
        await self._answer(seen, context, request)

    async def _client_stream(self, requests: AsyncIterator[bytes], context: Any) -> bytes:
        seen = await self._begin("Client", context)
        parts = []
        async for request in requests:
            parts.append(request)
            await self._answer(seen, context, request)
        return b"+".join(parts)

    async def _bidi(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        seen = await self._begin("Bidi", context)
        async for request in requests:
            await self._answer(seen, context, request)
            yield request.upper()

    async def _hello(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        seen = await self._begin("Hello", context)
        yield b"hello"
        async for request in requests:
            seen.requests.append(request)
            yield request


async def messages(*items: bytes) -> AsyncIterator[bytes]:
    """An async request stream."""
    for item in items:
        yield item


def trailer(metadata: Any, name: str) -> str | bytes | None:
    """A metadata value by name (None when absent).

    Iterates the (key, value) pairs: grpcio before 1.80 makes `dict(aio.Metadata)`
    look its pairs up as keys (KeyError).
    """
    return dict(iter(metadata or ())).get(name)


@pytest.fixture(name="upstream")
async def upstream_fixture() -> AsyncIterator[Upstream]:
    """The raw-bytes upstream on a free loopback port (import it into a test module)."""
    server = await Upstream().start()
    try:
        yield server
    finally:
        await server.stop()
