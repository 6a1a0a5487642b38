# One WebSocket connection after the listener saw an upgrade: an asyncio.Protocol over
# `websockets`' public sans-I/O ServerProtocol, serving an ASGI websocket app.
#
# The rules, in order of the connection's life:
# * Hand-off. The listener parsed the request head with httptools and built the ASGI
#   scope; the head is rendered again from the scope and fed to ServerProtocol, which
#   parses it into its own Request (so its parser state is the real one) and checks it
#   with accept(). A bad handshake (no Sec-WebSocket-Key, version 12, ...) is answered
#   there with websockets' short 4xx text and closed; the app never runs. websockets'
#   own head limits apply too (a header line over 8 KiB, as nginx's default buffers:
#   431, or 400 on websockets 12).
# * Before the app answers, bytes the client sends are kept, not parsed, and reading
#   pauses (a client is not supposed to send frames before the 101).
#   `websocket.accept` sends the prepared 101 (plus the app's subprotocol and headers),
#   then the kept bytes are parsed. `websocket.close` before accept is 403;
#   `websocket.http.response.start`/`.body` is that HTTP answer, then close. An app that
#   returns (or fails) without either is 500; one cancelled (the server stopping), 503.
# * Open. Frames are assembled into `websocket.receive` messages; pings are answered by
#   the protocol; a message over `max_size` closes with 1009, a bad frame with 1002,
#   invalid UTF-8 with 1007 -- the protocol fails the connection, the app gets
#   `websocket.disconnect`, nothing is logged (a hostile peer is not our error). An
#   app that returns closes with 1000, one that fails with 1011 (logged), one
#   cancelled with 1001.
# * Keepalive. Every `ping_interval` seconds of an open connection a ping goes out;
#   a peer that has not answered it within `ping_timeout` seconds is failed with 1011
#   (a vanished peer whose TCP never said so is found this way). None turns either off.
# * Flow control. Messages wait in a queue the app drains with receive(); at HIGH_WATER
#   queued messages reading pauses, and resumes at LOW_WATER. Frames sent in one loop
#   step go out in one write (at once past OUTBOX_BYTES); send() waits while the
#   transport has paused writing.
# * Close. The app's `websocket.close` (or shutdown's 1001) sends a close frame; the
#   peer's close is echoed by the protocol. The server closes TCP after the closing
#   handshake; a peer that never completes it is cut after CLOSE_TIMEOUT seconds.
#   `websocket.disconnect` carries the peer's close code (or the code we closed with
#   when the peer sent none, 1006 when the connection just dropped); it is delivered
#   once, after every message received before it. send() after close raises
#   ClientDisconnected (an OSError, as the ASGI spec asks).
from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Iterable
from http import HTTPStatus

from websockets.datastructures import Headers
from websockets.exceptions import InvalidState, ProtocolError
from websockets.extensions.permessage_deflate import enable_server_permessage_deflate
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

from ...server._types import ASGIApp, Message, Scope

__all__ = ["ClientDisconnected", "WebSocketSession"]

log = logging.getLogger("stormguard.gateway.websocket")
# websockets logs every connection's open and close at INFO; the gateway's access log
# and metrics already say that, so its own lines start at WARNING (a user can lower it).
protocol_log = logging.getLogger("stormguard.gateway.websocket.protocol")
if protocol_log.level == logging.NOTSET:
    protocol_log.setLevel(logging.WARNING)

OUTBOX_BYTES = 65536  # frames held for one write at most (then written at once)
HIGH_WATER = 16  # queued messages at which reading pauses
LOW_WATER = 4  # ... and resumes
CLOSE_TIMEOUT = 10.0  # seconds a peer has to complete the closing handshake
NO_CODE = (1005, 1006, 1015)  # codes that mean "none" and cannot be sent
_DATA = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)


class ClientDisconnected(OSError):
    """The WebSocket is closed: nothing more can be sent on it."""


def _head(scope: Scope) -> bytes:
    """The request head the listener parsed, rendered again for ServerProtocol."""
    target = scope.get("raw_path") or scope["path"].encode("utf-8")
    query = scope.get("query_string") or b""
    if query:
        target += b"?" + query
    version = str(scope.get("http_version") or "1.1").encode("ascii")
    lines = [b"GET " + target + b" HTTP/" + version]
    lines.extend(name + b": " + value for name, value in scope["headers"])
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _checked(value: bytes | str) -> str:
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if any(c in text for c in "\r\n\0"):
        raise ValueError(f"invalid character in header {text!r}")
    return text


def _headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(_checked(name), _checked(value)) for name, value in raw]


class WebSocketSession(asyncio.Protocol):
    """Serve one upgraded connection to the ASGI websocket ``app``.

    The listener builds the ASGI ``scope``, calls ``transport.set_protocol(session)``
    and then ``session.start(leftover)`` with the bytes it read after the request
    head. ``shutdown()`` closes the connection with 1001 (going away). Messages
    over ``max_size`` bytes close it with 1009.
    """

    def __init__(
        self,
        app: ASGIApp,
        scope: Scope,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        max_size: int,
        *,
        compression: bool = True,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
    ) -> None:
        self.app = app
        self.scope = scope
        self.transport = transport
        self.loop = loop
        self.protocol = ServerProtocol(
            extensions=enable_server_permessage_deflate(None) if compression else None,
            max_size=max_size,
            logger=protocol_log,
        )
        self.task: asyncio.Task[None] | None = None
        self._response: Response | None = None  # the 101, until the app accepts
        self._early = bytearray()  # bytes read before the 101 was sent
        self._inbox: deque[Message] = deque([{"type": "websocket.connect"}])
        self._waiter: asyncio.Future[None] | None = None
        self._read_paused = False
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._fragments: list[bytes] = []
        self._outbox: list[bytes] = []  # frames written together at the end of the loop step
        self._outbox_size = 0
        self._write_soon = False
        self._text = False
        self._denial: tuple[int, list[tuple[str, str]], bytearray] | None = None
        self._answered = False  # a 101 or another HTTP answer was sent
        self._disconnected = False  # websocket.disconnect is in the inbox
        self._lost = False
        self._close_timer: asyncio.TimerHandle | None = None
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self._ping_timer: asyncio.TimerHandle | None = None
        self._ping: bytes | None = None  # the payload of the ping awaiting its pong

    # -- the listener's side ------------------------------------------------------

    def start(self, leftover: bytes) -> None:
        """Check the handshake, then run the app (``leftover``: bytes after the head)."""
        protocol = self.protocol
        try:
            protocol.receive_data(_head(self.scope))
        except EOFError:  # pragma: no cover - a fresh protocol has not seen EOF
            pass
        requests = [e for e in protocol.events_received() if isinstance(e, Request)]
        if not requests:
            # websockets refused the head itself (a line or header count over its
            # limits): it may have written its own answer (13+) or only EOF (12).
            writes = protocol.data_to_send()
            if not any(writes):
                self.transport.write(_plain(400, "Failed to open a WebSocket connection.\n"))
            self._flush(writes)
            self._finish_handshake()
            return
        response = protocol.accept(requests[0])
        if response.status_code != 101:
            protocol.send_response(response)
            self._flush()
            self._finish_handshake()
            return
        self._response = response
        if leftover:
            self._early += leftover
            self._pause_reading()
        self.task = self.loop.create_task(self._run())

    def shutdown(self) -> None:
        """The server is stopping: close with 1001 (503 before the handshake ended)."""
        if self._lost:
            return
        if not self._answered:
            self._deny(503, [], b"Service Unavailable: the server is shutting down.\n")
        elif self.protocol.state is State.OPEN:
            self._close(1001, "server shutting down")

    # -- asyncio.Protocol ---------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._response is not None:  # the app has not answered yet
            self._early += data
            self._pause_reading()
            return
        self._receive(data)  # after a denial or a close, the protocol discards it

    def eof_received(self) -> bool | None:
        if self._answered and self._response is None:
            try:
                self.protocol.receive_eof()
            except EOFError:
                pass
            self._flush()
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._close_timer is not None:
            self._close_timer.cancel()
        self._stop_pings()
        try:
            self.protocol.receive_eof()
        except EOFError:
            pass
        self.protocol.data_to_send()  # nothing can be written any more
        self._outbox.clear()
        self._disconnect()
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    # -- bytes in -----------------------------------------------------------------

    def _receive(self, data: bytes | bytearray) -> None:
        protocol = self.protocol
        try:
            protocol.receive_data(data)
        except EOFError:
            return
        for frame in protocol.events_received():
            if not isinstance(frame, Frame):
                continue
            if frame.opcode not in _DATA:  # a ping is answered by the protocol; close: _flush
                if frame.opcode is Opcode.PONG and self._ping == frame.data:
                    self._ping = None
                    self._schedule_ping()
                continue
            if frame.opcode is not Opcode.CONT:
                self._text = frame.opcode is Opcode.TEXT
            if not frame.fin:
                self._fragments.append(bytes(frame.data))
                continue
            if self._fragments:
                self._fragments.append(bytes(frame.data))
                data, self._fragments = b"".join(self._fragments), []
            else:
                data = bytes(frame.data)
            if self._text:
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    protocol.fail(1007, "invalid UTF-8")
                    break
                self._put({"type": "websocket.receive", "text": text})
            else:
                self._put({"type": "websocket.receive", "bytes": data})
        self._flush()
        if len(self._inbox) >= HIGH_WATER:
            self._pause_reading()

    # -- keepalive ----------------------------------------------------------------

    def _schedule_ping(self) -> None:
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None
        if self.ping_interval is not None and not self._lost:
            self._ping_timer = self.loop.call_later(self.ping_interval, self._send_ping)

    def _send_ping(self) -> None:
        self._ping_timer = None
        if self._lost or self.protocol.state is not State.OPEN:
            return
        self._ping = os.urandom(4)
        self.protocol.send_ping(self._ping)
        self._flush()
        if self.ping_timeout is None:
            self._schedule_ping()
        else:
            self._ping_timer = self.loop.call_later(self.ping_timeout, self._ping_unanswered)

    def _ping_unanswered(self) -> None:
        self._ping_timer = None
        if self._ping is not None and not self._lost and self.protocol.state is State.OPEN:
            self.protocol.fail(1011, "keepalive ping timeout")
            self._flush()

    def _stop_pings(self) -> None:
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None

    def _put(self, message: Message) -> None:
        self._inbox.append(message)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _disconnect(self) -> None:
        if self._disconnected:
            return
        self._disconnected = True
        self._stop_pings()
        protocol = self.protocol
        close = protocol.close_rcvd or protocol.close_sent
        code = close.code if close is not None else 1006
        reason = close.reason if close is not None else ""
        self._put({"type": "websocket.disconnect", "code": code, "reason": reason})

    def _pause_reading(self) -> None:
        if not self._read_paused and not self._lost:
            self._read_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._read_paused and not self._lost:
            self._read_paused = False
            self.transport.resume_reading()

    # -- bytes out ----------------------------------------------------------------

    def _flush(self, writes: list[bytes] | None = None) -> None:
        protocol = self.protocol
        outbox = self._outbox
        for data in protocol.data_to_send() if writes is None else writes:
            if data:
                outbox.append(data)
                self._outbox_size += len(data)
            else:  # EOF: the closing handshake is over, or the protocol failed
                self._write_out()
                self._close_transport()
                self._disconnect()
        if outbox:
            if self._outbox_size >= OUTBOX_BYTES:
                self._write_out()  # a fast sender meets the transport's flow control
            elif not self._write_soon:
                self._write_soon = True
                self.loop.call_soon(self._write_out)
        if protocol.close_expected() and self._close_timer is None and not self._lost:
            self._close_timer = self.loop.call_later(CLOSE_TIMEOUT, self.transport.abort)

    def _write_out(self) -> None:
        """Write what the outbox holds in one call (one send(2) for many frames)."""
        self._write_soon = False
        outbox = self._outbox
        if not outbox:
            return
        data = outbox[0] if len(outbox) == 1 else b"".join(outbox)
        outbox.clear()
        self._outbox_size = 0
        if not self._lost and not self.transport.is_closing():
            self.transport.write(data)

    def _close_transport(self) -> None:
        if not self._lost:
            self.transport.close()
            if self._close_timer is None:  # a peer that never reads cannot hold it open
                self._close_timer = self.loop.call_later(CLOSE_TIMEOUT, self.transport.abort)

    def _finish_handshake(self) -> None:
        """An HTTP answer other than 101 went out: the app sees a disconnect."""
        self._answered = True
        self._response = None
        self._early.clear()
        self._disconnect()

    def _deny(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        protocol = self.protocol
        if not any(name.lower() == "content-length" for name, _ in headers):
            headers.append(("Content-Length", str(len(body))))
        if not any(name.lower() == "connection" for name, _ in headers):
            headers.append(("Connection", "close"))
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Unknown"
        if not self._lost:
            protocol.send_response(Response(status, phrase, Headers(headers), body))
            self._flush()
        self._finish_handshake()

    def _close(self, code: int, reason: str) -> None:
        protocol = self.protocol
        if protocol.state is not State.OPEN or self._lost:
            return
        try:
            if code in NO_CODE:
                protocol.send_close()
            else:
                protocol.send_close(code, _short(reason))
        except ProtocolError as exc:
            raise ValueError(f"invalid WebSocket close code {code}") from exc
        self._flush()

    # -- the ASGI side ------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self.app(self.scope, self._asgi_receive, self._asgi_send)
        except ClientDisconnected:
            self._after_app(1000)  # the peer went away while the app was sending
        except asyncio.CancelledError:
            self._after_app(1001)  # the app was stopped (the server is going away)
            raise
        except Exception:
            log.exception("WebSocket application failed")
            self._after_app(1011)
        else:
            self._after_app(1000)

    def _after_app(self, code: int) -> None:
        """The app is done: end the handshake or the connection it left open."""
        if self._lost:
            return
        if not self._answered:
            if self._denial is not None:  # an unfinished http.response: its body so far
                status, headers, body = self._denial
                self._deny(status, headers, bytes(body))
            elif code == 1001:
                self._deny(503, [], b"Service Unavailable\n")
            else:
                if code == 1000:
                    log.error("WebSocket application returned without accepting")
                self._deny(500, [], b"Internal Server Error\n")
        else:
            self._close(code, "")

    async def _asgi_receive(self) -> Message:
        while not self._inbox:
            if self._disconnected:  # pragma: no cover - disconnect stays queued until read
                return {"type": "websocket.disconnect", "code": 1006, "reason": ""}
            waiter = self._waiter
            if waiter is None or waiter.done():  # two receivers wait on the same future
                waiter = self._waiter = self.loop.create_future()
            await asyncio.shield(waiter)
        message = self._inbox.popleft()
        if message["type"] == "websocket.disconnect":
            self._inbox.append(message)  # every later receive() says the same
        elif len(self._inbox) <= LOW_WATER and self._response is None:
            self._resume_reading()
        return message

    async def _asgi_send(self, message: Message) -> None:
        kind = message["type"]
        if not self._answered:
            self._handshake_send(kind, message)
            return
        if kind == "websocket.send":
            if self._lost or self.protocol.state is not State.OPEN:
                raise ClientDisconnected("the WebSocket is closed")
            text = message.get("text")
            try:
                if text is not None:
                    self.protocol.send_text(text.encode("utf-8"))
                else:
                    self.protocol.send_binary(bytes(message.get("bytes") or b""))
            except InvalidState as exc:  # pragma: no cover - checked above
                raise ClientDisconnected("the WebSocket is closed") from exc
            self._flush()
            if self._write_paused and not self._lost:
                self._drained = self._drained or self.loop.create_future()
                await asyncio.shield(self._drained)
        elif kind == "websocket.close":
            self._close(int(message.get("code") or 1000), str(message.get("reason") or ""))
        elif self._lost or self.protocol.state is not State.OPEN:
            raise ClientDisconnected("the WebSocket is closed")
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} after the handshake")

    def _handshake_send(self, kind: str, message: Message) -> None:
        if self._lost:
            raise ClientDisconnected("the client went away during the handshake")
        if kind == "websocket.accept":
            response = self._response
            assert response is not None
            subprotocol = message.get("subprotocol")
            if subprotocol:
                response.headers["Sec-WebSocket-Protocol"] = _checked(subprotocol)
            for name, value in _headers(message.get("headers") or ()):
                response.headers[name] = value
            self._response = None
            self._answered = True
            self.protocol.send_response(response)
            self._flush()
            self._schedule_ping()
            early, self._early = bytes(self._early), bytearray()
            if early:
                self._receive(early)
            if len(self._inbox) < HIGH_WATER:
                self._resume_reading()
        elif kind == "websocket.close":
            self._deny(403, [], b"Forbidden\n")
        elif kind == "websocket.http.response.start":
            status = int(message["status"])
            self._denial = (status, _headers(message.get("headers") or ()), bytearray())
        elif kind == "websocket.http.response.body" and self._denial is not None:
            status, headers, body = self._denial
            body += message.get("body") or b""
            if not message.get("more_body", False):
                self._denial = None
                self._deny(status, headers, bytes(body))
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} before the handshake")


def _short(reason: str) -> str:
    """A close reason cut to the 123 bytes a close frame has room for."""
    data = reason.encode("utf-8")
    if len(data) <= 123:
        return reason
    return data[:123].decode("utf-8", "ignore")


def _plain(status: int, text: str) -> bytes:
    body = text.encode("utf-8")
    phrase = HTTPStatus(status).phrase
    return (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii") + body
