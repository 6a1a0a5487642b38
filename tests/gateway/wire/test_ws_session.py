"""WebSocketSession: an upgraded connection served to an ASGI websocket app.

A tiny server in this file reads the request head with httptools, builds the ASGI
scope as the gateway's listener does, and hands the connection to the session; the
tests drive it with the ``websockets`` client and with raw bytes.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httptools
import pytest
import yaml
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode

from net_support import POLL_INTERVAL
from stormguard.gateway.http import _websocket
from stormguard.gateway.http._websocket import WebSocketSession
from stormguard.server._types import ASGIApp, Message, Receive, Scope, Send

MAX_SIZE = 4096
App = ASGIApp


# -- the test server ------------------------------------------------------------------


class _Head(asyncio.Protocol):
    """Reads one request head, then hands the connection to a WebSocketSession."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._hand_off(data[upgrade.args[0] :])
            return
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 0\r\n\r\n")
        self.transport.close()

    def _hand_off(self, leftover: bytes) -> None:
        transport = self.transport
        assert transport is not None
        url = httptools.parse_url(self.url)
        protocols = [
            p.strip().decode("latin-1")
            for name, value in self.headers
            if name == b"sec-websocket-protocol"
            for p in value.split(b",")
        ]
        scope: dict[str, Any] = {
            "type": "websocket",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": self.parser.get_http_version(),
            "scheme": "ws",
            "server": transport.get_extra_info("sockname")[:2],
            "client": transport.get_extra_info("peername")[:2],
            "root_path": "",
            "path": url.path.decode("latin-1"),
            "raw_path": url.path,
            "query_string": url.query or b"",
            "headers": self.headers,
            "subprotocols": protocols,
            "state": {},
            "extensions": {"websocket.http.response": {}},
        }
        loop = asyncio.get_running_loop()
        server = self.server
        session = WebSocketSession(
            server.app, scope, server.wrap(transport), loop, server.max_size, **server.options
        )
        self.server.sessions.append(session)
        transport.set_protocol(session)
        session.start(leftover)


@dataclass
class Server:
    """The test server: its app, and every session it handed a connection to."""

    app: App
    max_size: int = MAX_SIZE
    options: dict[str, Any] = field(default_factory=dict)  # WebSocketSession's keywords
    wrap: Callable[[asyncio.Transport], Any] = lambda transport: transport
    port: int = 0
    sessions: list[WebSocketSession] = field(default_factory=list)
    clients: list[asyncio.StreamWriter] = field(default_factory=list)  # closed by the fixture

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    async def session(self) -> WebSocketSession:
        """The first session, once the server has one."""
        await until(lambda: bool(self.sessions))
        return self.sessions[0]


Serve = Callable[..., Awaitable[Server]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start test servers on 127.0.0.1 free ports; all are stopped after the test."""
    started: list[asyncio.Server] = []
    servers: list[Server] = []

    async def start(app: App, **settings: Any) -> Server:
        server = Server(app, **settings)
        servers.append(server)
        loop = asyncio.get_running_loop()
        listening = await loop.create_server(lambda: _Head(server), "127.0.0.1", 0)
        started.append(listening)
        server.port = listening.sockets[0].getsockname()[1]
        return server

    yield start
    for server in servers:
        for writer in server.clients:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass  # the server cut it
    for listening in started:
        listening.close()
        await listening.wait_closed()
    # Each session's app is told the connection is gone and given time to return;
    # one that ignores the disconnect is cancelled. None is left pending: a pending
    # task outlives the loop and is garbage-collected (and logged) in a later test.
    for server in servers:
        for session in server.sessions:
            session.transport.abort()
        tasks = [s.task for s in server.sessions if s.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def until(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Poll the in-process server until ``condition`` holds (never a backoff wait)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(POLL_INTERVAL)


def client() -> Any:
    """The ``websockets`` asyncio client's connect (13+; skipped on older versions)."""
    module = pytest.importorskip("websockets.asyncio.client")
    return module.connect


async def closed_with(ws: Any) -> tuple[int, str]:
    """The close code and reason the client received (its next recv() fails)."""
    with pytest.raises(ConnectionClosed) as info:
        await asyncio.wait_for(ws.recv(), 5)
    assert info.value.rcvd is not None
    return info.value.rcvd.code, info.value.rcvd.reason


# -- apps -----------------------------------------------------------------------------


@dataclass
class Echo:
    """Accepts (with the first offered subprotocol), echoes, records what it saw."""

    seen: list[Message] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event | None = None  # receive nothing until it is set
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            assert (await receive())["type"] == "websocket.connect"
            accept: dict[str, Any] = {"type": "websocket.accept", "headers": self.headers}
            if scope["subprotocols"]:
                accept["subprotocol"] = scope["subprotocols"][0]
            await send(accept)
            if self.gate is not None:
                await self.gate.wait()
            while True:
                message = await receive()
                self.seen.append(message)
                if message["type"] == "websocket.disconnect":
                    return
                text = message.get("text")
                if text is not None and text.startswith("close:"):
                    code, _, reason = text[6:].partition(" ")
                    await send({"type": "websocket.close", "code": int(code), "reason": reason})
                elif text == "boom":
                    raise RuntimeError("boom")
                else:
                    await send(
                        {"type": "websocket.send", **{k: message.get(k) for k in ("text", "bytes")}}
                    )
        finally:
            self.done.set()

    def disconnect(self) -> Message:
        """The disconnect message the app received."""
        assert self.seen and self.seen[-1]["type"] == "websocket.disconnect", self.seen
        return self.seen[-1]


def refusing(*messages: Message) -> App:
    """An app that answers the handshake with ``messages``."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        for message in messages:
            await send(message)

    return app


# -- raw bytes ------------------------------------------------------------------------

KEY = base64.b64encode(b"0123456789abcdef").decode()


def handshake(path: str = "/ws", drop: str = "", **extra: str) -> bytes:
    """A client handshake; ``drop`` leaves out one header, ``extra`` adds or replaces."""
    headers = {
        "Host": "127.0.0.1",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": KEY,
        "Sec-WebSocket-Version": "13",
    }
    headers.update({k.replace("_", "-"): v for k, v in extra.items()})
    headers.pop(drop, None)
    lines = [f"GET {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def frame(opcode: Opcode, data: bytes, *, fin: bool = True, mask: bool = True) -> bytes:
    """A client frame (masked unless told otherwise)."""
    return Frame(opcode, data, fin).serialize(mask=mask)


@dataclass
class Raw:
    """A raw socket client."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @classmethod
    async def open(cls, server: Server, data: bytes = b"") -> Raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        server.clients.append(writer)
        if data:
            writer.write(data)
        return cls(reader, writer)

    async def head(self) -> tuple[int, dict[str, str]]:
        """The response's status and headers (lowercase names)."""
        raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        lines = raw.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        return int(lines[0].split()[1]), headers

    async def rest(self) -> bytes:
        """Everything until the server closes the connection."""
        return await asyncio.wait_for(self.reader.read(), 5)

    async def frame(self) -> tuple[int, bytes]:
        """One server frame: (opcode, payload)."""
        first, second = await asyncio.wait_for(self.reader.readexactly(2), 5)
        assert not second & 0x80, "a server frame is never masked"
        length = second & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", await self.reader.readexactly(8))
        return first & 0x0F, await self.reader.readexactly(length)

    async def close_code(self) -> int:
        """The code of the close frame the server sends next (data frames skipped)."""
        while True:
            opcode, payload = await self.frame()
            if opcode == Opcode.CLOSE:
                return int(struct.unpack("!H", payload[:2])[0])

    async def upgraded(self) -> None:
        status, _ = await self.head()
        assert status == 101

    def close(self) -> None:
        self.writer.close()


# -- messages both ways ---------------------------------------------------------------


async def test_text_and_binary_are_echoed_with_compression(serve: Serve) -> None:
    """Text and binary messages reach the app and come back; permessage-deflate is on."""
    server = await serve(Echo())
    async with client()(server.url) as ws:
        await ws.send("hello")
        assert await ws.recv() == "hello"
        await ws.send(b"\x00\x01\xff")
        assert await ws.recv() == b"\x00\x01\xff"
        assert "permessage-deflate" in ws.response.headers["Sec-WebSocket-Extensions"]


async def test_compression_can_be_turned_off(serve: Serve) -> None:
    """compression=False negotiates no extension; messages still flow."""
    offer = "permessage-deflate; client_max_window_bits"
    for compression in (True, False):
        server = await serve(Echo(), options={"compression": compression})
        raw = await Raw.open(server, handshake(Sec_WebSocket_Extensions=offer))
        status, headers = await raw.head()
        assert status == 101
        assert ("permessage-deflate" in headers.get("sec-websocket-extensions", "")) is compression
        if not compression:
            raw.writer.write(frame(Opcode.TEXT, b"plain"))
            assert await raw.frame() == (Opcode.TEXT, b"plain")
        raw.close()


async def test_subprotocol_and_accept_headers_reach_the_client(serve: Serve) -> None:
    """The app's subprotocol and extra headers are in the 101 answer."""
    server = await serve(Echo(headers=[(b"x-served-by", b"stormguard")]))
    async with client()(server.url, subprotocols=["chat.v2", "chat.v1"]) as ws:
        assert ws.subprotocol == "chat.v2"
        assert ws.response.headers["X-Served-By"] == "stormguard"


async def test_fragmented_message_is_assembled(serve: Serve) -> None:
    """A text message in three fragments reaches the app as one message."""
    echo = Echo()
    server = await serve(echo)
    raw = await Raw.open(server, handshake())
    await raw.upgraded()
    raw.writer.write(
        frame(Opcode.TEXT, b"he", fin=False)
        + frame(Opcode.CONT, b"ll", fin=False)
        + frame(Opcode.CONT, b"o")
    )
    assert await raw.frame() == (Opcode.TEXT, b"hello")
    raw.close()


async def test_bytes_sent_with_the_handshake_are_not_lost(serve: Serve) -> None:
    """A frame in the same packet as the head (the listener's leftover) reaches the app."""
    echo = Echo()
    server = await serve(echo)
    raw = await Raw.open(server, handshake() + frame(Opcode.TEXT, b"early"))
    await raw.upgraded()
    assert await raw.frame() == (Opcode.TEXT, b"early")
    raw.close()


async def test_ping_is_answered_by_the_protocol(serve: Serve) -> None:
    """A ping gets a pong with the same payload, without the app doing anything."""
    echo = Echo(gate=asyncio.Event())  # the app never receives
    server = await serve(echo)
    raw = await Raw.open(server, handshake())
    await raw.upgraded()
    raw.writer.write(frame(Opcode.PING, b"are you there"))
    assert await raw.frame() == (Opcode.PONG, b"are you there")
    async with client()(server.url) as ws:
        await asyncio.wait_for(await ws.ping(), 5)
    raw.close()


async def test_keepalive_pings_and_fails_a_silent_peer_with_1011(serve: Serve) -> None:
    """Pings go out every ping_interval; a peer that answers none is closed with 1011."""
    echo = Echo()
    server = await serve(echo, options={"ping_interval": 0.01, "ping_timeout": 0.5})
    raw = await Raw.open(server, handshake())
    await raw.upgraded()
    for _ in range(3):  # an answering peer keeps getting pings, and stays connected
        opcode, payload = await raw.frame()
        assert opcode == Opcode.PING and len(payload) == 4
        raw.writer.write(frame(Opcode.PONG, payload))
    assert (await raw.frame())[0] == Opcode.PING  # this one goes unanswered
    assert await raw.close_code() == 1011
    await asyncio.wait_for(echo.done.wait(), 5)
    assert echo.disconnect()["code"] == 1011


# -- close codes ----------------------------------------------------------------------


async def test_app_close_code_reaches_the_client(serve: Serve) -> None:
    """The app's websocket.close (4001, reason) is the close frame the client gets."""
    echo = Echo()
    server = await serve(echo)
    async with client()(server.url) as ws:
        await ws.send("close:4001 bye")
        assert await closed_with(ws) == (4001, "bye")
    await asyncio.wait_for(echo.done.wait(), 5)
    assert echo.disconnect()["code"] == 4001  # the client's echo of it


async def test_client_close_code_reaches_the_app(serve: Serve) -> None:
    """The client's close code and reason are in the app's websocket.disconnect."""
    echo = Echo()
    server = await serve(echo)
    async with client()(server.url) as ws:
        await ws.close(4002, "done here")
    await asyncio.wait_for(echo.done.wait(), 5)
    assert (echo.disconnect()["code"], echo.disconnect()["reason"]) == (4002, "done here")


async def test_app_that_returns_closes_normally_and_a_failing_app_with_1011(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    """An app that returns after accept closes with 1000; one that raises, 1011 (logged)."""

    async def quits(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})

    server = await serve(quits)
    raw = await Raw.open(server, handshake())
    await raw.upgraded()
    assert await raw.close_code() == 1000
    raw.close()

    server = await serve(Echo())
    raw = await Raw.open(server, handshake())
    await raw.upgraded()
    raw.writer.write(frame(Opcode.TEXT, b"boom"))
    assert await raw.close_code() == 1011
    raw.close()
    assert any(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)


async def test_peer_that_vanishes_is_a_disconnect_for_the_app(serve: Serve) -> None:
    """A client that drops the TCP connection without a close frame: disconnect 1006."""
    echo = Echo()
    server = await serve(echo)
    raw = await Raw.open(server, handshake())
    await raw.upgraded()
    raw.writer.write(frame(Opcode.TEXT, b"one"))
    assert await raw.frame() == (Opcode.TEXT, b"one")
    raw.writer.transport.abort()
    await asyncio.wait_for(echo.done.wait(), 5)
    assert echo.disconnect()["code"] == 1006


async def test_send_after_the_peer_left_raises_an_oserror(serve: Serve) -> None:
    """websocket.send on a closed connection raises ClientDisconnected (an OSError)."""
    raised: list[BaseException] = []
    left = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        assert (await receive())["type"] == "websocket.disconnect"
        try:
            await send({"type": "websocket.send", "text": "late"})
        except OSError as exc:
            raised.append(exc)
        left.set()

    server = await serve(app)
    raw = await Raw.open(server, handshake())
    await raw.upgraded()
    raw.writer.transport.abort()
    await asyncio.wait_for(left.wait(), 5)
    assert isinstance(raised[0], _websocket.ClientDisconnected)


async def test_shutdown_closes_with_1001(serve: Serve) -> None:
    """shutdown() sends close 1001; the app gets the client's echo as its disconnect."""
    echo = Echo()
    server = await serve(echo)
    async with client()(server.url) as ws:
        await ws.send("hi")
        assert await ws.recv() == "hi"
        (await server.session()).shutdown()
        assert await closed_with(ws) == (1001, "server shutting down")
    await asyncio.wait_for(echo.done.wait(), 5)
    assert echo.disconnect()["code"] == 1001


@pytest.mark.parametrize("accept", [True, False], ids=["after-accept", "before-accept"])
async def test_a_cancelled_app_closes_with_1001_or_503(serve: Serve, accept: bool) -> None:
    """An app task cancelled (the gateway's hub on shutdown) closes 1001, or answers 503."""
    started = asyncio.Event()

    async def waits(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        if accept:
            await send({"type": "websocket.accept"})
        started.set()
        await asyncio.Event().wait()

    server = await serve(waits)
    raw = await Raw.open(server, handshake())
    await asyncio.wait_for(started.wait(), 5)
    task = (await server.session()).task
    assert task is not None
    task.cancel()
    if accept:
        await raw.upgraded()
        assert await raw.close_code() == 1001
    else:
        assert (await raw.head())[0] == 503
    raw.close()


async def test_shutdown_during_the_handshake_answers_503(serve: Serve) -> None:
    """shutdown() before the app accepted: 503, and the late accept raises OSError."""
    accepted = asyncio.Event()
    outcome: list[str] = []

    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await accepted.wait()
        try:
            await send({"type": "websocket.accept"})
        except OSError:
            outcome.append("refused")

    server = await serve(slow)
    raw = await Raw.open(server, handshake())
    (await server.session()).shutdown()
    status, _ = await raw.head()
    assert status == 503
    await raw.rest()
    accepted.set()
    await until(lambda: outcome == ["refused"])


# -- refusals before the handshake ----------------------------------------------------


async def test_http_response_denial_is_the_answer(serve: Serve) -> None:
    """websocket.http.response before accept: 429 + Retry-After + body, then close."""
    body = b'{"error": "too many connections"}'
    app = refusing(
        {
            "type": "websocket.http.response.start",
            "status": 429,
            "headers": [(b"retry-after", b"7"), (b"content-type", b"application/json")],
        },
        {"type": "websocket.http.response.body", "body": body[:10], "more_body": True},
        {"type": "websocket.http.response.body", "body": body[10:]},
    )
    server = await serve(app)
    raw = await Raw.open(server, handshake())
    status, headers = await raw.head()
    assert (status, headers["retry-after"], headers["content-length"]) == (429, "7", str(len(body)))
    assert await raw.rest() == body  # and the connection is closed

    with pytest.raises(InvalidStatus) as info:
        async with client()(server.url):
            pass  # pragma: no cover - the handshake is refused
    assert info.value.response.status_code == 429
    assert info.value.response.headers["Retry-After"] == "7"
    assert info.value.response.body == body


@pytest.mark.parametrize(
    ("app", "status"),
    [
        (refusing({"type": "websocket.close", "code": 1008}), 403),
        (refusing(), 500),
    ],
    ids=["close-before-accept", "returns-without-answer"],
)
async def test_app_that_does_not_accept_gets_an_http_answer(
    serve: Serve, app: App, status: int
) -> None:
    """websocket.close before accept is 403; an app that answers nothing is 500."""
    server = await serve(app)
    raw = await Raw.open(server, handshake())
    got, _ = await raw.head()
    assert got == status
    await raw.rest()


@pytest.mark.parametrize(
    ("drop", "extra", "status"),
    [
        ("Sec-WebSocket-Key", {}, 400),
        ("", {"Sec-WebSocket-Key": "c2hvcnQ="}, 400),
        ("", {"Sec-WebSocket-Version": "12"}, 400),
        ("", {"Sec-WebSocket-Key": "not base64!"}, 400),
    ],
    ids=["no-key", "short-key", "version-12", "bad-key"],
)
async def test_bad_handshake_is_refused_before_the_app_runs(
    serve: Serve, drop: str, extra: dict[str, str], status: int
) -> None:
    """A handshake websockets cannot accept is a short 4xx answer; the app never runs."""
    ran: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        ran.append(True)  # pragma: no cover - must not run

    server = await serve(app)
    raw = await Raw.open(server, handshake(drop=drop, **extra))
    got, headers = await raw.head()
    body = await raw.rest()
    assert got == status and 0 < len(body) == int(headers["content-length"]) < 300
    assert ran == []


async def test_a_head_websockets_cannot_parse_is_refused(serve: Serve) -> None:
    """A header line over websockets' 8 KiB: a short 4xx answer (431, or 400 on 12)."""
    ran: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        ran.append(True)  # pragma: no cover - must not run

    server = await serve(app)
    raw = await Raw.open(server, handshake(Cookie="c=" + "x" * 9000))
    status, headers = await raw.head()
    body = await raw.rest()
    assert status in (400, 431) and 0 < len(body) == int(headers["content-length"]) < 300
    assert ran == []


# -- hostile peers and limits ---------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(Opcode.TEXT, b"x" * (MAX_SIZE + 1)), 1009),
        (frame(Opcode.TEXT, b"x" * 3000, fin=False) + frame(Opcode.CONT, b"x" * 3000), 1009),
        (frame(Opcode.TEXT, b"unmasked", mask=False), 1002),
        (bytes([0x83, 0x80]) + os.urandom(4), 1002),  # reserved opcode
        (frame(Opcode.CONT, b"nothing to continue"), 1002),
        (frame(Opcode.TEXT, b"\xff\xfe not utf-8"), 1007),
    ],
    ids=[
        "over-max-size",
        "fragments-over-max-size",
        "unmasked",
        "bad-opcode",
        "stray-cont",
        "bad-utf8",
    ],
)
async def test_hostile_frames_close_the_connection_without_a_traceback(
    serve: Serve, caplog: pytest.LogCaptureFixture, data: bytes, code: int
) -> None:
    """Over max_size 1009, bad frames 1002, bad UTF-8 1007; the app sees it; no error log."""
    echo = Echo()
    server = await serve(echo)
    raw = await Raw.open(server, handshake())
    await raw.upgraded()
    raw.writer.write(data)
    assert await raw.close_code() == code
    assert await raw.rest() == b""  # the server closed the TCP connection
    await asyncio.wait_for(echo.done.wait(), 5)
    assert echo.disconnect()["code"] == code
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_slow_app_pauses_reading_and_gets_every_message(serve: Serve) -> None:
    """While the app takes nothing, reading pauses; then every message arrives in order."""
    gate = asyncio.Event()
    echo = Echo(gate=gate)
    server = await serve(echo)
    raw = await Raw.open(server, handshake())
    await raw.upgraded()
    count = 500
    raw.writer.write(b"".join(frame(Opcode.TEXT, f"m{i}".encode()) for i in range(count)))
    session = await server.session()
    await until(lambda: not session.transport.is_reading())
    gate.set()
    for i in range(count):
        assert await raw.frame() == (Opcode.TEXT, f"m{i}".encode())
    await until(session.transport.is_reading)
    assert [m.get("text") for m in echo.seen] == [f"m{i}" for i in range(count)]
    raw.close()


class CountingWrites:
    """A transport that counts its write() calls (everything else is the real one's)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.inner = transport
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_frames_sent_in_one_step_share_one_write(serve: Serve) -> None:
    """Fifty sends without a pause between them reach the socket in one write."""
    count = 50

    async def burst(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        for i in range(count):
            await send({"type": "websocket.send", "text": f"m{i}"})
        await receive()

    counted: list[CountingWrites] = []

    def wrap(transport: asyncio.Transport) -> CountingWrites:
        counted.append(CountingWrites(transport))
        return counted[-1]

    server = await serve(burst, wrap=wrap)
    raw = await Raw.open(server, handshake())
    await raw.upgraded()
    for i in range(count):
        assert await raw.frame() == (Opcode.TEXT, f"m{i}".encode())
    assert counted[0].writes <= 2  # the 101, then the fifty frames


async def test_send_waits_while_the_client_does_not_read(serve: Serve) -> None:
    """A client that reads nothing stalls the app's sends; memory stays bounded."""
    sent: list[int] = []
    chunk = b"z" * 65536
    total = 400  # 25 MiB: more than the socket buffers hold

    async def producer(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        for i in range(total):
            await send({"type": "websocket.send", "bytes": chunk})
            sent.append(i)

    server = await serve(producer)
    raw = await Raw.open(server, handshake())
    await raw.upgraded()
    session = await server.session()
    await until(lambda: len(sent) > 0)
    for _ in range(20):  # let the app run as far as it can
        await asyncio.sleep(POLL_INTERVAL)
    assert len(sent) < total
    assert session.transport.get_write_buffer_size() < 4 * len(chunk)
    received = 0
    while received < total:
        opcode, payload = await raw.frame()
        assert opcode == Opcode.BINARY and len(payload) == len(chunk)
        received += 1
    assert len(sent) == total
    raw.close()


# -- the gateway's own WebSocket leg --------------------------------------------------


async def test_the_gateway_websocket_leg_runs_on_the_session(
    serve: Serve, upstream_factory: Callable[..., Any]
) -> None:
    """handle_websocket (through Gateway) proxies messages and close codes via the session."""
    from stormguard.gateway._app import Gateway
    from stormguard.gateway._config import parse_config

    up = upstream_factory()
    config = {
        "upstreams": {"a": {"url": up.url}},
        "routes": [{"path": "/ws", "upstream": "a", "websocket": {"connections_per_client": 1}}],
    }
    gateway = Gateway(parse_config(yaml.safe_dump(config)))
    server = await serve(gateway)
    try:
        async with client()(server.url) as ws:
            await ws.send("hello")
            assert await ws.recv() == "hello"
            await ws.send(b"\x00\x01")
            assert await ws.recv() == b"\x00\x01"
            raw = await Raw.open(server, handshake())  # over connections_per_client
            status, headers = await raw.head()
            assert status == 429 and int(headers["retry-after"]) >= 1
            await raw.rest()
            await ws.send("close:4001")
            assert (await closed_with(ws))[0] == 4001
    finally:
        await gateway.stop()
