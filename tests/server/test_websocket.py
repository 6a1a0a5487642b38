"""WebSocket limits under uvicorn: handshake 429, message rate 1008, slots after disconnects."""

from __future__ import annotations

import base64
import os
import socket
from typing import Any
from urllib.parse import urlsplit

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from net_support import Serve
from stormguard import parse_rate_limits
from stormguard._errors import ConfigError
from stormguard.asgi import WebSocketLimits


def ws(base: str, api_key: str = "k") -> ClientConnection:
    """Open a WebSocket to ``base``/ws as client ``api_key``."""
    url = base.replace("http://", "ws://") + "/ws"
    return connect(url, additional_headers={"X-API-Key": api_key}, open_timeout=10)


def touch(base: str, api_key: str = "k") -> None:
    """Open and close a WebSocket."""
    with ws(base, api_key):
        pass


def refused_status(base: str, api_key: str = "k") -> Any:
    """The HTTP response of a refused handshake."""
    with pytest.raises(InvalidStatus) as info:
        touch(base, api_key)
    return info.value.response


def raw_open(base: str, api_key: str = "k") -> socket.socket:
    """Complete a WebSocket handshake on a bare socket (to drop it abruptly later)."""
    url = urlsplit(base)
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    nonce = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {nonce}\r\nSec-WebSocket-Version: 13\r\n"
            f"X-API-Key: {api_key}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1024)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def abort(sock: socket.socket) -> None:
    """Close with RST, no close frame: the peer vanishes."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


def test_rule_refuses_handshake_with_real_429(uvicorn_app: Serve) -> None:
    """A handshake over a rule's limit gets HTTP 429 + Retry-After + rate-limit headers."""
    base = uvicorn_app("websocket_app", SG_LIMIT="2/minute")
    for _ in range(2):
        touch(base)
    response = refused_status(base)
    assert response.status_code == 429
    assert int(response.headers["Retry-After"]) >= 1
    assert parse_rate_limits(dict(response.headers.raw_items()), now=0)[0].remaining == 0
    touch(base, "other")  # another client is unaffected


def test_connection_limit_and_slots_after_abrupt_disconnects(
    uvicorn_app: Serve, eventually: Any
) -> None:
    """Over connections_per_client: 429; after abrupt disconnects the slots come back."""
    base = uvicorn_app("websocket_app")
    socks = [raw_open(base), raw_open(base)]
    response = refused_status(base)
    assert response.status_code == 429 and response.headers["Retry-After"] == "1"
    with ws(base, "other") as conn:  # per client
        conn.send("hi")
        assert conn.recv(timeout=10) == "hi"
    for sock in socks:
        abort(sock)

    def reopened() -> bool:
        try:
            touch(base)
        except InvalidStatus:
            return False
        return True

    eventually(reopened)
    touch(base)  # and both slots, not one


def test_message_rate_closes_with_1008(uvicorn_app: Serve) -> None:
    """Past the per-connection message rate the connection is closed with 1008 + a reason."""
    base = uvicorn_app("websocket_app")
    with ws(base) as conn:
        echoed = []
        with pytest.raises(ConnectionClosed) as info:
            for i in range(10):
                conn.send(str(i))
                echoed.append(conn.recv(timeout=10))
    assert echoed == ["0", "1", "2"]  # the burst, then the close
    assert info.value.rcvd is not None
    assert (info.value.rcvd.code, info.value.rcvd.reason) == (1008, "message rate exceeded")


def test_message_rate_drop_mode_keeps_the_connection(uvicorn_app: Serve) -> None:
    """on_message_limit="drop" discards messages over the rate and keeps the socket open."""
    base = uvicorn_app("websocket_app", SG_ON_LIMIT="drop")
    with ws(base) as conn:
        for i in range(8):
            conn.send(str(i))
        received = [conn.recv(timeout=10) for _ in range(3)]
        assert received == ["0", "1", "2"]
        with pytest.raises(TimeoutError):
            conn.recv(timeout=0.3)  # the rest were dropped, the connection is alive
        conn.ping().wait(10)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"connections_per_client": 0}, "connections_per_client"),
        ({"messages_per_second": -1}, "messages_per_second"),
        ({"on_message_limit": "ignore"}, "on_message_limit"),
    ],
)
def test_invalid_limits(kwargs: dict[str, Any], field: str) -> None:
    """Invalid WebSocket limits raise ConfigError naming the field."""
    with pytest.raises(ConfigError, match=field):
        WebSocketLimits(**kwargs)


class Socket:
    """An in-process WebSocket peer: scripted inbound messages, recorded outbound ones."""

    def __init__(self, *texts: str) -> None:
        self.inbound: list[dict[str, Any]] = [{"type": "websocket.connect"}]
        self.inbound += [{"type": "websocket.receive", "text": t} for t in texts]
        self.inbound.append({"type": "websocket.disconnect", "code": 1000})
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        return self.inbound.pop(0)

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


async def echo(scope: Any, receive: Any, send: Any) -> None:
    """Accept, echo every text message, stop at disconnect."""
    await receive()
    await send({"type": "websocket.accept"})
    while (message := await receive())["type"] == "websocket.receive":
        await send({"type": "websocket.send", "text": message["text"]})


def echoed(sock: Socket) -> list[str]:
    """Texts the app sent back."""
    return [m["text"] for m in sock.sent if m["type"] == "websocket.send"]


def closes(sock: Socket) -> list[tuple[int, str]]:
    """Close frames the guard sent."""
    return [(m["code"], m.get("reason", "")) for m in sock.sent if m["type"] == "websocket.close"]


SCOPE = {"type": "websocket", "path": "/ws", "headers": [], "extensions": {}}


async def test_per_client_message_rate_spans_connections(clock: Any) -> None:
    """client_messages_per_second counts a client's messages over all its connections."""
    from stormguard.server._websocket import WebSocketGuard

    limits = WebSocketLimits(client_messages_per_second=1, client_burst=3)
    guard = WebSocketGuard(limits, clock=clock)
    first, second = Socket("a", "b"), Socket("c", "d")
    await guard.run(echo, dict(SCOPE), first.receive, first.send, "k")
    await guard.run(echo, dict(SCOPE), second.receive, second.send, "k")
    assert (echoed(first), echoed(second)) == (["a", "b"], ["c"])
    assert closes(second) == [(1008, "message rate exceeded")]
    assert guard.connections("k") == 0


async def test_per_connection_rate_refills_with_time(clock: Any) -> None:
    """The per-connection bucket refills at messages_per_second (fake clock)."""
    from stormguard.server._websocket import WebSocketGuard

    guard = WebSocketGuard(WebSocketLimits(messages_per_second=1, burst=2), clock=clock)
    sock = Socket("a", "b", "c")
    real_receive = sock.receive

    async def receive() -> dict[str, Any]:
        message = await real_receive()
        if message.get("text") == "c":
            clock.advance(1.0)  # one token back before the third message
        return message

    await guard.run(echo, dict(SCOPE), receive, sock.send, "k")
    assert echoed(sock) == ["a", "b", "c"] and closes(sock) == []


async def test_oversized_message_closes_with_1009() -> None:
    """A message over max_message closes the connection with 1009."""
    from stormguard.server._websocket import WebSocketGuard

    guard = WebSocketGuard(WebSocketLimits(max_message=4))
    sock = Socket("tiny", "too large")
    await guard.run(echo, dict(SCOPE), sock.receive, sock.send, "k")
    assert echoed(sock) == ["tiny"]
    assert closes(sock)[0][0] == 1009


async def test_refused_handshake_without_the_extension_closes() -> None:
    """Without websocket.http.response the refusal is a close (servers answer 403)."""
    from stormguard.server._websocket import WebSocketGuard

    guard = WebSocketGuard(WebSocketLimits(connections_per_client=1))
    guard._enter("k")  # one connection already open
    sock = Socket()
    await guard.run(echo, dict(SCOPE), sock.receive, sock.send, "k")
    assert closes(sock) == [(1008, "limited:connections")]
