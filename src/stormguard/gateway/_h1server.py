# The proxy listener's HTTP/1.1 protocol: uvicorn's httptools protocol with a lean
# request cycle, because on the proxy leg the server's own per-request work is a
# large share of the gateway's. uvicorn still owns the listener, lifespan,
# graceful shutdown, pipelining, flow control and the WebSocket upgrade; this
# changes only what one request costs:
#
# * no timer per request: the request-head deadline (`header_timeout`, a
#   slowloris is cut) and the keep-alive deadline are one, checked by one sweep
#   per listener (so they fire up to a quarter late);
# * the response head is written together with the first body bytes (one write
#   and one segment for a small answer, not two), without uvicorn's per-header
#   regular expressions (the gateway's headers are its own or came through
#   httptools' parser, which rejects CR/LF);
# * the client's disconnect is reported to whoever registered for it
#   (`scope[DISCONNECT]`), so the proxy leg needs no watcher task to cancel the
#   upstream exchange.
# * a request target is parsed once (a bounded table: path, raw path, query), and
#   the app's callback path (`fast`) is read per request, so a reload reaches
#   connections already open;
# * the callback path's writes of one loop pass go out together (`outbox`, one
#   per listener, _outbox.py); what uvicorn writes or closes directly here is
#   preceded by a flush, so that a connection's bytes keep their order.
from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from ._outbox import Outbox
from ._wire import DISCONNECT

__all__ = ["GatewayProtocol", "LeanCycle", "gateway_protocol"]


# The common methods' names as the scope has them (decoded once).
_METHODS = {
    m.encode("ascii"): m
    for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT")
}


# Request target -> (path, raw path, query), as the scope has them: a few targets
# arrive again and again. Bounded: cleared when full.
_TARGETS: dict[bytes, tuple[str, bytes, bytes]] = {}
_MAX_TARGETS = 1024


class LeanCycle(RequestResponseCycle):
    """One request and its answer (uvicorn's cycle with a cheaper ``send``)."""

    on_lost: Callable[[], None] | None = None
    _head: bytes = b""

    async def run_asgi(self, app: Any) -> None:
        try:
            await super().run_asgi(app)
        finally:
            # scope[DISCONNECT] is this cycle: break the cycle so both are freed at
            # once, not by the cyclic collector (whose pauses showed in p99).
            self.scope.pop(DISCONNECT, None)  # type: ignore[misc]
            self.on_lost = None

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        self.send_now(message)

    def send_now(self, message: Any) -> None:
        """:meth:`send` without waiting for the client's socket to drain."""
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got {kind!r}."
                )
            self.response_started = True
            self.waiting_for_100_continue = False
            self._head = self._render(message["status"], message.get("headers", ()))
            return
        if self.response_complete or kind != "http.response.body":
            raise RuntimeError(f"Unexpected ASGI message {kind!r}.")
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            body = b""
        elif self.chunked_encoding:
            body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + (
                b"" if more else b"0\r\n\r\n"
            )
        else:
            self.expected_content_length -= len(body)
            if self.expected_content_length < 0:
                raise RuntimeError("Response content longer than Content-Length")
        head, self._head = self._head, b""
        if head or body:
            self.transport.write(head + body if head else body)
        if not more:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    def _render(self, status: int, headers: Any) -> bytes:
        content = [STATUS_LINE[status]]
        close = False
        for name, value in (*self.default_headers, *headers):
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value)
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [
                t.strip() for t in value.lower().split(b",")
            ]:
                self.keep_alive = False
                close = True
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not close:
            content.append(b"connection: close\r\n")
        if (
            self.chunked_encoding is None
            and self.scope["method"] != "HEAD"
            and status not in (204, 304)
        ):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)


class GatewayProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`LeanCycle` and one timer per request."""

    header_timeout = 10.0
    # The app when it has a callback path: its ``fast(proto, scope, keep_alive)``,
    # read per request (a reload replaces it).
    fast_app: Any = None
    # Per listener class (gateway_protocol): the connections waiting for a request
    # head, and the one timer that sweeps them.
    _watched: ClassVar[set[GatewayProtocol]] = set()
    _sweeper: ClassVar[asyncio.TimerHandle | None] = None
    _sweep_every = 1.0
    _armed_at = 0.0
    _begun = False  # a request began since the timer was armed
    # The client of every request on this connection, when the identity rules make it
    # one (_fastpath.begin): (identity, rule, key, client id, the naming headers).
    client_known: tuple[Any, str, str, str, Any] | None = None
    # With client_known: a route's rule set and the refusal of its limits for that
    # client (_fastpath.begin; RuleSet.refusal_hitter).
    limits_known: tuple[Any, Callable[[], Any]] | None = None
    # The upstream request's header lines of the last request on this connection:
    # (its headers, identity rules, method, lines) (_fastpath.FastExchange.send).
    header_block: tuple[list[tuple[bytes, bytes]], Any, str, bytes] | None = None
    # The head of the last upstream answer on this connection: (status, the
    # upstream's headers, default headers, (keep-alive, chunked), head).
    answer_head: tuple[int, list[tuple[bytes, bytes]], Any, tuple[bool, bool], bytes] | None = None
    _asgi: dict[str, str]  # per connection (connection_made)
    # The callback path's writes of one loop pass (per listener class, like _watched).
    outbox: ClassVar[Outbox] = Outbox()
    _idle_close = False  # the timer also stands for the keep-alive deadline

    # -- the one deadline, checked by a sweep ---------------------------------------------

    def _arm(self, keep_alive: bool) -> None:
        self._begun = False
        self._idle_close = keep_alive
        self._armed_at = self.loop.time()
        watched = self._watched
        watched.add(self)
        cls = type(self)
        if cls._sweeper is None:
            cls._sweeper = self.loop.call_later(cls._sweep_every, cls._sweep, self.loop)

    def _disarm(self) -> None:
        self._watched.discard(self)

    @classmethod
    def _sweep(cls, loop: asyncio.AbstractEventLoop) -> None:
        cls._sweeper = None
        now = loop.time()
        for proto in list(cls._watched):
            proto._check(now)
        if cls._watched:
            cls._sweeper = loop.call_later(cls._sweep_every, cls._sweep, loop)

    def _check(self, now: float) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # a request is being served
            return
        waited = now - self._armed_at
        if self._idle_close and not self._begun:
            expired = waited >= min(self.header_timeout, self.timeout_keep_alive)
        else:  # the request head did not arrive in time
            expired = waited >= self.header_timeout
        if expired:
            self._disarm()
            self.transport.close()

    # -- the protocol -------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._asgi = {"version": self.asgi_version, "spec_version": "2.3"}
        # The app's callback path (Gateway.fast: _fastpath.begin), if it has one.
        self.fast_app = self.app if getattr(self.app, "fast", None) is not None else None
        self._arm(keep_alive=False)

    def resume_writing(self) -> None:
        super().resume_writing()
        resumed = getattr(self.cycle, "resumed", None)
        if resumed is not None:
            resumed()

    def send_400_response(self, msg: str) -> None:
        self.outbox.flush()  # an earlier answer on this connection goes first
        super().send_400_response(msg)

    def shutdown(self) -> None:
        self.outbox.flush()  # a complete answer is not cut by the close
        super().shutdown()

    def handle_websocket_upgrade(self) -> None:
        self.outbox.flush()  # the WebSocket protocol writes the transport directly
        super().handle_websocket_upgrade()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:
            on_lost = getattr(cycle, "on_lost", None)
            if on_lost is not None:
                cycle.on_lost = None  # type: ignore[attr-defined]
                on_lost()

    # The per-request callbacks are uvicorn's, minus calls the gateway never needs:
    # its keep-alive timer is never armed (the sweep stands for it), and the scope's
    # "asgi" entry is one dict per connection.

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def on_message_begin(self) -> None:
        self._begun = True
        self.url = b""
        self.expect_100_continue = False
        headers: list[tuple[bytes, bytes]] = []
        self.headers = headers
        scope: Any = {
            "type": "http",
            "asgi": self._asgi,
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": headers,
            "state": self.app_state.copy(),
        }
        self.scope = scope

    def on_headers_complete(self) -> None:
        self._watched.discard(self)  # _disarm()
        parser = self.parser
        scope: Any = self.scope
        method = parser.get_method()
        scope["method"] = _METHODS.get(method) or method.decode("ascii")
        version = parser.get_http_version()
        if version != "1.1":
            scope["http_version"] = version
        if parser.should_upgrade() and self._should_upgrade():
            return
        url = self.url
        target = _TARGETS.get(url)
        if target is None:
            parsed = httptools.parse_url(url)
            raw = parsed.path
            decoded = raw.decode("ascii")
            if "%" in decoded:
                decoded = urllib.parse.unquote(decoded)
            target = (decoded, raw, parsed.query or b"")
            if len(_TARGETS) >= _MAX_TARGETS:
                _TARGETS.clear()
            _TARGETS[url] = target
        path, raw_path, query = target
        root = self.root_path
        if root:
            path, raw_path = root + path, root.encode("ascii") + raw_path
        scope["path"] = path
        scope["raw_path"] = raw_path
        scope["query_string"] = query
        existing = self.cycle
        keep_alive = version != "1.0" and parser.should_keep_alive()
        if (
            (existing is None or existing.response_complete)
            and self.fast_app is not None
            and not self.expect_100_continue
        ):
            fast = self.fast_app.fast(self, scope, keep_alive)
            if fast is not None:
                self.cycle = fast
                return
        cycle = self.cycle = LeanCycle(**self.cycle_args(scope, keep_alive, asyncio.Event()))
        scope[DISCONNECT] = cycle
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, self.app)
        else:  # pipelined: wait for the answer in progress
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))

    def cycle_args(self, scope: Any, keep_alive: bool, message_event: Any) -> dict[str, Any]:
        """The keywords of a request cycle on this connection."""
        return {
            "scope": scope,
            "transport": self.transport,
            "flow": self.flow,
            "logger": self.logger,
            "access_logger": self.access_logger,
            "access_log": self.access_log,
            "default_headers": self.server_state.default_headers,
            "message_event": message_event,
            "expect_100_continue": self.expect_100_continue,
            "keep_alive": keep_alive,
            "on_response": self.on_response_complete,
        }

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        flow = self.flow
        if flow.read_paused:
            flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._arm(keep_alive=True)


def gateway_protocol(header_timeout: float) -> type[GatewayProtocol]:
    """The protocol class for a listener with this request-head deadline."""
    every = max(0.05, min(header_timeout, 5.0) / 4)
    return type(
        "GatewayProtocol",
        (GatewayProtocol,),
        {
            "header_timeout": header_timeout,
            "_watched": set(),
            "_sweep_every": every,
            "outbox": Outbox(),
        },
    )
