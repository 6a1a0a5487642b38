"""WebSocketSession against random bytes from a hostile peer, on an in-memory transport."""

from __future__ import annotations

import asyncio
import base64
import gc
import logging
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from websockets.frames import Opcode

from stormguard.gateway.http._websocket import WebSocketSession
from stormguard.server._types import Message, Receive, Scope, Send

KEY = base64.b64encode(b"0123456789abcdef")
SCOPE: dict[str, Any] = {
    "type": "websocket",
    "path": "/ws",
    "raw_path": b"/ws",
    "query_string": b"",
    "headers": [
        (b"host", b"127.0.0.1"),
        (b"upgrade", b"websocket"),
        (b"connection", b"Upgrade"),
        (b"sec-websocket-key", KEY),
        (b"sec-websocket-version", b"13"),
        (b"sec-websocket-extensions", b"permessage-deflate"),
    ],
    "subprotocols": [],
    "extensions": {"websocket.http.response": {}},
}


class MemoryTransport(asyncio.Transport):
    """A transport that keeps what is written and tells when it is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "write after close"
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def get_write_buffer_size(self) -> int:
        return 0


class Collect(logging.Handler):
    """Keeps the warnings and errors logged while it is installed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for every example of a hypothesis test.

    Garbage an earlier test in this process left is collected first, so that what
    the examples' log collector sees is theirs (a pending task destroyed later is
    logged wherever the collector happens to run).
    """
    gc.collect()
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def encode(opcode: int, data: bytes, fin: bool, rsv: int, mask: bytes | None) -> bytes:
    """A frame as a client would put it on the wire, any bits allowed."""
    head = bytes([(fin << 7) | (rsv << 4) | opcode])
    flag = 0x80 if mask is not None else 0
    if len(data) < 126:
        head += bytes([flag | len(data)])
    elif len(data) < 65536:
        head += bytes([flag | 126]) + struct.pack("!H", len(data))
    else:  # pragma: no cover - payloads here stay small
        head += bytes([flag | 127]) + struct.pack("!Q", len(data))
    if mask is None:
        return head + data
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def frames() -> st.SearchStrategy[bytes]:
    """Client frames, mostly well-formed: any opcode, fin, reserved bits, mask, payload."""
    valid = st.sampled_from([int(op) for op in Opcode])
    mask = st.binary(min_size=4, max_size=4)
    return st.builds(
        encode,
        st.one_of(valid, valid, st.integers(0, 15)),
        st.one_of(st.binary(max_size=100), st.just(b"\x03\xe8bye"), st.just(b"\xff\xfe")),
        st.booleans(),
        st.one_of(st.just(0), st.just(0), st.integers(0, 7)),
        st.one_of(mask, mask, st.none()),
    )


chunks = st.lists(st.one_of(frames(), frames(), frames(), st.binary(max_size=64)), max_size=12)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(chunks=chunks)
def test_hostile_bytes_never_raise_or_log(
    loop: asyncio.AbstractEventLoop, chunks: list[bytes]
) -> None:
    """Any bytes after the handshake: no exception, no log; the app ends on a disconnect."""
    seen: list[Message] = []
    done = asyncio.Event()

    async def echo(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await receive()
            await send({"type": "websocket.accept"})
            while True:
                message = await receive()
                seen.append(message)
                if message["type"] == "websocket.disconnect":
                    return
                reply = {"text": message.get("text"), "bytes": message.get("bytes")}
                try:
                    await send({"type": "websocket.send", **reply})
                except OSError:
                    pass  # closed already (ClientDisconnected); the disconnect is queued
        finally:
            done.set()

    async def scenario() -> MemoryTransport:
        transport = MemoryTransport()
        session = WebSocketSession(echo, dict(SCOPE), transport, loop, 64)
        session.start(b"")
        for chunk in chunks:
            await asyncio.sleep(0)
            if transport.closed:
                break
            session.data_received(chunk)
        for _ in range(3):
            await asyncio.sleep(0)  # let the app answer what it received
        session.connection_lost(None)  # the peer vanishes, or the closed transport reports
        await asyncio.wait_for(done.wait(), 5)
        # The app returned: the session's task ends too (none is left pending when the
        # loop stops).
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.wait_for(asyncio.gather(*others), 5)
        return transport

    collect = Collect()
    logging.getLogger().addHandler(collect)
    try:
        transport = loop.run_until_complete(scenario())
    finally:
        logging.getLogger().removeHandler(collect)
    assert transport.written.startswith(b"HTTP/1.1 101 ")
    assert seen and seen[-1]["type"] == "websocket.disconnect"
    event(f"disconnect {seen[-1]['code']}")
    assert all(m["type"] == "websocket.receive" for m in seen[:-1])
    assert collect.records == []
