# One request on the ASGI path (the listener's Cycle): ASGI 3's receive and send
# over the listener's connection, and the answer's framing. The head is rendered
# once, with CR/LF/NUL checked (_head.render_headers), held until the first body
# bytes so that a small answer is one write, and any status 100-999 gets its line.
# A body longer or shorter than its Content-Length is an error of the app (the
# connection is cut); an app that fails before it answers gets 500.
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._wire import DISCONNECT
from ._head import HeaderValueError, render_headers, status_line

if TYPE_CHECKING:
    from ._listener import Listener

__all__ = ["Cycle", "answer"]

log = logging.getLogger("stormguard.gateway")
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def answer(status: int) -> bytes:
    """The listener's own answer: ``status``, its reason as the body, then the close."""
    body = status_line(status)[9:-2] + b"\n"
    return b"%scontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n%s%s" % (
        status_line(status),
        len(body),
        b"connection: close\r\n\r\n",
        body,
    )


class Cycle:
    """One request on the ASGI path: its receive/send and its framing."""

    __slots__ = (
        "body",
        "chunked",
        "delivered",
        "disconnected",
        "expect_100_continue",
        "head",
        "keep_alive",
        "length",
        "message_event",
        "more_body",
        "on_lost",
        "proto",
        "response_complete",
        "response_started",
        "scope",
        "task",
    )

    def __init__(
        self, proto: Listener, scope: dict[str, Any], keep_alive: bool, expect: bool
    ) -> None:
        self.proto = proto
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_100_continue = expect
        self.body = b""
        self.more_body = True
        self.delivered = False  # the body's last message went to the app
        self.message_event = asyncio.Event()
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.on_lost: Callable[[], None] | None = None
        self.head = b""
        self.chunked = False
        self.length: int | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self, app: Any) -> None:
        self.task = self.proto.loop.create_task(self.run(app))

    async def run(self, app: Any) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            if not self.response_complete:
                self.proto.outbox.flush()
                self.proto.transport.close()
        except Exception:
            log.exception("gateway error on %s %s", self.scope["method"], self.scope["path"])
            if not self.response_started and not self.disconnected:
                self._fail()
            elif not self.response_complete:
                self.proto.outbox.flush()
                self.proto.transport.close()
        else:
            if not self.response_started and not self.disconnected:
                self._fail()
            elif not self.response_complete and not self.disconnected:
                self.proto.outbox.flush()
                self.proto.transport.close()
        finally:
            # scope[DISCONNECT] is this cycle: break the cycle so both are freed at once.
            self.scope.pop(DISCONNECT, None)
            self.on_lost = None
            self.task = None

    def _fail(self) -> None:
        self.response_complete = True
        proto = self.proto
        proto.outbox.flush()
        if not proto.transport.is_closing():
            proto.transport.write(answer(500))
            proto.transport.close()

    async def receive(self) -> dict[str, Any]:
        if self.expect_100_continue and not self.response_started:
            self.expect_100_continue = False
            transport = self.proto.transport
            if not transport.is_closing():
                self.proto.outbox.flush()
                transport.write(_CONTINUE)
        if self.delivered:
            # The whole body went to the app: the next message is the disconnect
            # (or the answer's end), however long that takes -- never another
            # empty body message, which a loop waiting for the disconnect would
            # spin on.
            while not (self.disconnected or self.response_complete):
                self.message_event.clear()
                await self.message_event.wait()
            return {"type": "http.disconnect"}
        if (
            not self.disconnected
            and not self.response_complete
            and self.more_body
            and not self.body
        ):
            if not self.proto.closing:
                self.proto.flow.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body, self.body = self.body, b""
        self.message_event.clear()
        more = self.more_body
        if more and not self.proto.closing:
            self.proto.flow.resume_reading()
        elif not more:
            self.delivered = True
        return {"type": "http.request", "body": body, "more_body": more}

    async def send(self, message: Any) -> None:
        flow = self.proto.flow
        if flow.write_paused and not self.disconnected:
            await flow.drain()
        self.send_now(message)

    def send_now(self, message: Any) -> None:
        """:meth:`send` without waiting for the client's socket to drain."""
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', got {kind!r}")
            self.head = self._render(message["status"], message.get("headers", ()))
            self.response_started = True
            self.expect_100_continue = False
            return
        if self.response_complete or kind != "http.response.body":
            raise RuntimeError(f"Unexpected ASGI message {kind!r}")
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if self.scope["method"] == "HEAD":
            body = b""
        elif self.chunked:
            body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + (
                b"" if more else b"0\r\n\r\n"
            )
        elif self.length is not None:
            self.length -= len(body)
            if self.length < 0:
                raise RuntimeError("Response content longer than Content-Length")
        head, self.head = self.head, b""
        proto = self.proto
        if head or body:
            proto.outbox.flush()
            proto.transport.write(head + body if head else body)
        if not more:
            if self.length and self.scope["method"] != "HEAD":
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                proto.transport.close()
            proto.on_response_complete()

    def _render(self, status: int, headers: Any) -> bytes:
        keep_alive = self.keep_alive
        length: int | None = None
        chunked = False
        out: list[tuple[bytes, bytes]] = []
        for name, value in (*self.proto.state.default_headers, *headers):
            name = name.lower()
            if name == b"content-length":
                if length is not None or chunked:
                    continue
                length = int(value)
            elif name == b"transfer-encoding":
                if value.lower() != b"chunked":
                    continue
                chunked = True
                length = None
                out = [pair for pair in out if pair[0] != b"content-length"]
            elif name == b"connection":
                if b"close" in [t.strip() for t in value.lower().split(b",")]:
                    keep_alive = False
                continue
            out.append((name, value))
        bodiless = self.scope["method"] == "HEAD" or status in (204, 304) or status < 200
        if length is None and not chunked and not bodiless:
            chunked = True
            out.append((b"transfer-encoding", b"chunked"))
        if status in (204, 304) or status < 200:
            chunked, length = False, None
            out = [p for p in out if p[0] not in (b"content-length", b"transfer-encoding")]
        if not keep_alive:
            self.keep_alive = False
            out.append((b"connection", b"close"))
        self.chunked = chunked and self.scope["method"] != "HEAD"
        self.length = length
        try:
            lines = render_headers(out)
        except HeaderValueError as exc:
            raise RuntimeError(str(exc)) from None
        return status_line(status) + lines + b"\r\n"
