# The gateway's HTTP/1.1 listener: an asyncio.Protocol over httptools' public
# parser, serving an ASGI 3 app, with the app's callback path (``app.fast``) tried
# first for each request whose head announces no body and expects no 100-continue:
# ``app.fast(listener, scope, keep_alive, host)``, ``host`` the one it routes by
# (the Host header, or an absolute-form target's authority; b"" for none), answers
# with the request's cycle, or None for the ASGI app to serve it.
#
# What one connection does:
# * the request head is capped BEFORE the parser holds it: bytes are counted as
#   they arrive and only what still fits under `max_header_bytes` is fed while the
#   head is incomplete (httptools keeps a header's fragments until its line ends, so
#   an endless header would otherwise grow without bound); the target
#   (`max_target_bytes`, 414) and the header count (`max_headers`, 431) are
#   counted in the parser's callbacks. Over a cap, a parser error (400), a bad Host
#   or a path above the root (400), TRACE (405, unless the app allows it), CONNECT
#   (405): the listener answers itself, after any answer in progress, and closes;
# * one timer per listener sweeps the request-head deadline (`header_timeout`, a
#   slowloris is cut) and the keep-alive deadline (both fire up to a quarter late);
# * keep-alive and pipelining: a request that arrives while another is answered
#   waits (reading paused) and is answered after it, in order;
# * the callback path's writes of one loop pass go out together (the listener's
#   outbox, _outbox.py); what this module writes or closes directly flushes first,
#   so a connection's bytes keep their order;
# * a client that goes away is reported to the request's cycle (``on_lost``; the
#   scope carries the cycle as ``scope[DISCONNECT]``), so the proxy leg needs no
#   watcher task;
# * a WebSocket upgrade is handed to _websocket.WebSocketSession (it takes the
#   transport over); any other Upgrade is served as a plain request.
from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections import deque
from typing import Any

import httptools

from .._outbox import Outbox
from .._wire import DISCONNECT
from ._cycle import Cycle, answer
from ._head import host_of, normalise_path
from ._replay import Patch, head_patch

__all__ = ["Listener", "ListenerSettings", "ServerState"]

log = logging.getLogger("stormguard.gateway")

# The common methods' names as the scope has them (decoded once).
_METHODS = {
    m.encode("ascii"): m
    for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT")
}
# Request target -> (path, normalised raw path, query), or None (400): a few targets
# arrive again and again. Bounded: cleared when full.
_TARGETS: dict[bytes, tuple[str, bytes, bytes] | None] = {}
_MAX_TARGETS = 1024
# Host header -> whether it is a valid host (host_of): bounded like _TARGETS.
_HOSTS: dict[bytes, bool] = {}
# header names the listener reads
_NOTED = frozenset(
    {b"host", b"expect", b"upgrade", b"connection", b"content-length", b"transfer-encoding"}
)
_HIGH_WATER = 65536  # request body bytes held before reading pauses
_REPLAY_TRIES = 4  # heads kept for replay, in a row with none replayed, before giving up
# The longest read kept for replay: a connection holds at most this much more (a
# longer head, rare, is parsed every time; requests of SDKs take 0.3-2 KiB).
_REPLAY_MAX = 4096
_ASGI = {"version": "3.0", "spec_version": "2.3"}


class ServerState:
    """What the listener's connections share: the live connections and WebSocket
    sessions (for the drain), the default response headers, a request count."""

    __slots__ = ("connections", "default_headers", "sessions", "total_requests")

    def __init__(self, default_headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.connections: set[Listener] = set()
        self.sessions: dict[Any, asyncio.Transport] = {}
        self.default_headers: list[tuple[bytes, bytes]] = default_headers or []
        self.total_requests = 0


class ListenerSettings:
    """One listener's settings and shared machinery (its sweep timer and outbox)."""

    def __init__(
        self,
        app: Any,
        *,
        header_timeout: float = 10.0,
        keep_alive_timeout: float = 5.0,
        max_header_bytes: int = 32768,
        max_headers: int = 100,
        max_target_bytes: int = 8192,
        websocket_max_size: int | None = None,
        scheme: str = "http",
        state: ServerState | None = None,
    ) -> None:
        self.app = app
        self.header_timeout = header_timeout
        self.keep_alive_timeout = keep_alive_timeout
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.max_target_bytes = max_target_bytes
        # None: no WebSocket on this listener (an upgrade is served as plain HTTP).
        self.websocket_max_size = websocket_max_size
        self.scheme = scheme
        self.state = state or ServerState()
        self.outbox = Outbox()
        self.watched: set[Listener] = set()
        self.sweeper: asyncio.TimerHandle | None = None
        self.sweep_every = max(0.05, min(header_timeout, keep_alive_timeout, 5.0) / 4)

    def sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self.sweeper = None
        now = loop.time()
        for proto in list(self.watched):
            proto.check_deadline(now)
        if self.watched:
            self.sweeper = loop.call_later(self.sweep_every, self.sweep, loop)


class _Refused(Exception):
    """Raised from a parser callback: the listener answers ``status`` and closes."""

    def __init__(self, status: int) -> None:
        self.status = status


class Flow:
    """Read and write back-pressure of one connection."""

    __slots__ = ("_drained", "read_paused", "transport", "write_paused")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.read_paused = False
        self.write_paused = False
        self._drained: asyncio.Event | None = None

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drained is not None:
            self._drained.set()
            self._drained = None

    async def drain(self) -> None:
        if self.write_paused:
            if self._drained is None:
                self._drained = asyncio.Event()
            await self._drained.wait()


class Listener(asyncio.Protocol):
    """One client connection (see the module's comment)."""

    def __init__(self, settings: ListenerSettings) -> None:
        self.settings = settings
        self.state = settings.state
        self.server_state = settings.state  # (read by the callback path)
        self.outbox: Outbox = settings.outbox
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.flow: Flow = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.cycle: Any = None  # the request being answered (a Cycle or the app's)
        self.pipeline: deque[Cycle] = deque()
        self.scope: dict[str, Any] = {}
        self.headers: list[tuple[bytes, bytes]] = []
        self.url = b""
        self.host: bytes | None = None  # the request's Host header
        self.hosts = 0  # how many Host headers it sent
        self.expect_100_continue = False
        self.upgrade: bytes | None = None
        self.connection = False  # the head has a Connection header
        self.framed = False  # the head announces a body (Content-Length > 0, chunked)
        self.websocket: dict[str, Any] | None = None  # the scope of an upgrade to hand off
        self.in_head = True  # the parser is inside a request head
        # A head replayed (see _replay): the last head of one whole read, with what
        # parsing it left, and whether the parser now stands between messages.
        self.replay: tuple[Any, ...] | None = None
        self.noted: tuple[Any, ...] | None = None  # the head just parsed, for replay
        self.replay_patch: Patch | None = None  # where the kept read's values are
        self.at_boundary = True
        self.unreplayed = 0  # heads kept for replay since one was last replayed
        self.head_bytes = 0  # bytes fed to the parser since the last request ended
        self.completed = 0  # requests whose message ended
        # The caps, and what the head's target and header lines may still take.
        self.max_head = settings.max_header_bytes
        self.max_headers = settings.max_headers
        self.max_target = settings.max_target_bytes
        self.bytes_left = settings.max_header_bytes
        self.refusal = 0  # a status the listener answers once the answer in progress ends
        self.closing = False
        # The deadline sweep (ListenerSettings.sweep).
        self.armed_at = 0.0
        self.begun = False  # a request began since the deadline was armed
        self.idle_close = False  # the deadline also stands for the keep-alive one
        # Kept per connection by the request chain (chain/_stages.py): the client of
        # every request when the identity rules make it one, its route's limits,
        # the last upstream request's header lines and the last answer's head.
        self.client_known: Any = None
        self.limits_known: Any = None
        self.header_block: Any = None
        self.answer_head: Any = None

    # -- the deadline, checked by the listener's sweep ------------------------------------

    def _arm(self, keep_alive: bool) -> None:
        self.begun = False
        self.idle_close = keep_alive
        self.armed_at = self.loop.time()
        settings = self.settings
        settings.watched.add(self)
        if settings.sweeper is None:
            settings.sweeper = self.loop.call_later(settings.sweep_every, settings.sweep, self.loop)

    def check_deadline(self, now: float) -> None:
        """Close the connection if its request head or keep-alive deadline passed."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self.settings.watched.discard(self)  # a request is being served
            return
        settings = self.settings
        waited = now - self.armed_at
        if self.idle_close and not self.begun:
            expired = waited >= min(settings.header_timeout, settings.keep_alive_timeout)
        else:  # the request head did not arrive in time
            expired = waited >= settings.header_timeout
        if expired:
            settings.watched.discard(self)
            self.outbox.flush()
            self.transport.close()

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (a stream transport)
        self.flow = Flow(self.transport)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self.state.connections.add(self)
        self._arm(keep_alive=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.settings.watched.discard(self)
        self.state.connections.discard(self)
        self.flow.resume_writing()  # nobody waits for a drain that will not come
        for cycle in (self.cycle, *self.pipeline):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
                on_lost = cycle.on_lost
                if on_lost is not None:
                    cycle.on_lost = None
                    on_lost()
        self.pipeline.clear()

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        resumed = getattr(self.cycle, "resumed", None)
        if resumed is not None:
            resumed()

    def eof_received(self) -> bool | None:
        return None  # close (a half-closed client gets its answers only if written)

    def data_received(self, data: bytes) -> None:
        # The common case in a few steps: a read that holds a whole head, or body
        # bytes; anything else (a head that may pass the cap) takes _received.
        self.begun = True  # (for the deadline: a request's bytes came)
        if self.in_head:
            if self.closing or len(data) > self.max_head - self.head_bytes:
                self._received(data)
                return
            replay = self.replay
            if replay is not None and self.at_boundary:
                if data == replay[0]:
                    self._replay(replay, list(replay[2]), replay[5])
                    return
                if self.replay_patch is not None and self._replay_patched(replay, data):
                    return
            self.head_bytes += len(data)
        elif self.closing:
            return
        completed = self.completed
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self.at_boundary = False
            leftover = self._failed(exc, data, b"")
            if leftover:
                self._received(leftover)
            return
        if self.at_boundary:
            self._note(data, completed)

    # -- a head replayed --------------------------------------------------------------------
    #
    # A client that sends the same bytes again and again on one connection (a poller,
    # a health check, a load generator) is parsed once: llhttp parses a read that,
    # starting where the parser stood between messages, held exactly one bodyless
    # head and nothing more; what the callbacks made of it is kept with the read's
    # bytes. When the next read, again between messages, holds the same bytes, the
    # parser would do the same again and end where it stands: the listener skips it
    # and hands the kept head to the same steps as on_headers_complete (from the
    # route on, everything runs as for a parsed head), then ends the message as
    # on_message_complete does. A read that is the kept one with other values in a
    # few headers (an API key, a request id; learnt from the two heads kept last, see
    # _replay.py) is the kept head with those values. Whatever else happens (a read
    # split mid-head, a pipelined pair, a body, a parser error, an upgrade) the
    # parser's standing is no longer known and the connection parses every read from
    # then on. A connection whose heads keep changing stops keeping them after a few.

    def _note(self, data: bytes, completed: int) -> None:
        # After a read fed from between messages: keep its head for replay when it
        # was exactly one bodyless head, ending with the read (its only empty line
        # is its last); else the parser's standing is no longer known.
        noted, self.noted = self.noted, None
        if (
            noted is not None
            and self.completed == completed + 1
            and len(data) <= _REPLAY_MAX
            and data.find(b"\n\r\n") == len(data) - 3
            and data.find(b"\n\n") < 0
        ):
            kept = self.replay
            if kept is None or kept[0] != data:
                # Kept after another head with the same request line: where the
                # two differ only in a few headers' values, those are its slots.
                self.replay_patch = (
                    head_patch(kept[2], noted[1], data)
                    if kept is not None
                    and kept[1] == noted[0]  # target
                    and kept[3:5] == noted[2:4]  # Host
                    and kept[6:] == noted[5:]  # method, version
                    else None
                )
                self.replay = (data, *noted)
                self.unreplayed += 1
        else:
            self.at_boundary = False

    def _replay_patched(self, kept: tuple[Any, ...], data: bytes) -> bool:
        # The kept head with other values in its slots (_replay.py), when ``data``
        # is made so; False when it must be parsed.
        pattern, slots = self.replay_patch  # type: ignore[misc]  # (not None here)
        found = pattern.fullmatch(data)
        if found is None:
            return False
        headers = list(kept[2])
        grown = 0
        for index, value in zip(slots, found.groups()):
            name, old = headers[index]
            grown += len(value) - len(old)
            headers[index] = (name, value)
        if grown > kept[5]:  # over the head's byte cap: the parser answers it
            return False
        self._replay(kept, headers, kept[5] - grown)
        return True

    def _replay(
        self, kept: tuple[Any, ...], headers: list[tuple[bytes, bytes]], bytes_left: int
    ) -> None:
        self.unreplayed = 0
        _, self.url, _, self.host, self.hosts, _, method, alive, version = kept
        self.headers = headers
        self.bytes_left = bytes_left
        self.settings.watched.discard(self)
        self.in_head = False
        try:
            self._head(method, alive, version)
        except _Refused as refused:  # (as a parsed head's callback error is answered)
            self.at_boundary = False
            self._refuse(refused.status)
            return
        except Exception:
            self.at_boundary = False
            log.error("gateway listener error", exc_info=True)
            self._refuse(500)
            return
        self.on_message_complete()

    def _received(self, data: bytes) -> None:
        self.at_boundary = False
        while data and not self.closing:
            rest = b""
            if self.in_head:
                # Never hand the parser more head than the cap allows.
                room = self.max_head - self.head_bytes
                if len(data) > room:
                    data, rest = data[: max(room, 0)], data[max(room, 0) :]
                self.head_bytes += len(data)
            completed = self.completed
            try:
                self.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                data = self._failed(exc, data, rest)
                continue
            if rest and self.in_head and completed == self.completed:
                # The whole slice was one head, and it did not end within the cap.
                # (Had a request ended inside the slice, the head now begun holds
                # only part of it: the next slice counts afresh, so a head is held
                # to twice the cap at most, and its complete lines to the cap.)
                self._refuse(431)
                return
            data = rest

    def _failed(self, exc: Exception, data: bytes, rest: bytes) -> bytes:
        """Act on the parser's exception for ``data`` (``rest`` not fed yet); the
        bytes to parse next (b"": none)."""
        if isinstance(exc, httptools.HttpParserUpgrade):
            offset = exc.args[0] if exc.args and isinstance(exc.args[0], int) else len(data)
            leftover = data[offset:] + rest
            if self.websocket is not None:
                self.outbox.flush()  # the session writes the transport itself
                self._hand_off(leftover)
                return b""
            if self.refusal:
                self._refuse(self.refusal)
                return b""
            # Any other Upgrade: the request was served as a plain one; the
            # connection goes on as HTTP/1.1 with a fresh parser.
            self.parser = httptools.HttpRequestParser(self)
            self.in_head, self.head_bytes = True, 0
            return leftover
        if isinstance(exc, httptools.HttpParserCallbackError):
            cause = exc.__context__
            if isinstance(cause, _Refused):
                self._refuse(cause.status)
            else:
                log.error("gateway listener error", exc_info=cause or exc)
                self._refuse(500)
            return b""
        self._refuse(400)
        return b""

    # -- the parser's callbacks -------------------------------------------------------------

    # (no on_message_begin, a callback fewer per request: a head's fields start
    # fresh from __init__ and from on_message_complete, which llhttp calls before
    # anything else can follow a message, an upgrade included; `begun` is set by
    # data_received, as the first byte of a request arrives)

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.max_target:
            raise _Refused(414)
        self.bytes_left -= len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self.headers
        if len(headers) >= self.max_headers:
            raise _Refused(431)
        # (checked once the head is complete; data_received bounds what is held)
        self.bytes_left -= len(name) + len(value) + 4
        name = name.lower()
        if name in _NOTED:
            if name == b"host":
                self.host = value
                self.hosts += 1
            elif name == b"expect":
                if value.lower() == b"100-continue":
                    self.expect_100_continue = True
            elif name == b"connection":
                self.connection = True
            elif name == b"upgrade":
                self.upgrade = value.lower()
            elif name == b"transfer-encoding" or value != b"0":  # (content-length)
                self.framed = True
        headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.settings.watched.discard(self)
        self.in_head = False
        if self.bytes_left < 0:
            raise _Refused(431)
        parser = self.parser
        method = parser.get_method()
        # Of the versions llhttp accepts (0.9, 1.0, 1.1, 2.0), only 1.1 keeps the
        # connection alive without a Connection header: the version of such a
        # request is known without asking (get_http_version formats a string).
        alive = parser.should_keep_alive()
        if alive and not self.connection:
            version = "1.1"
            if (
                self.at_boundary
                and self.unreplayed < _REPLAY_TRIES
                and self.upgrade is None
                and not self.framed
                and not self.expect_100_continue
            ):
                # (a keep-alive, bodyless head that upgrades nothing: kept for
                # replay if it was its read's only content; see _note)
                self.noted = (
                    self.url,
                    tuple(self.headers),
                    self.host,
                    self.hosts,
                    self.bytes_left,
                    method,
                    alive,
                    version,
                )
        else:
            version = parser.get_http_version()
        self._head(method, alive, version)

    def _head(self, method_raw: bytes, alive: bool, version: str) -> None:
        # A complete head, parsed or replayed: its route to the app.
        method = _METHODS.get(method_raw) or method_raw.decode("ascii")
        if method == "CONNECT":
            raise _Refused(405)
        url = self.url
        headers = self.headers
        authority = None
        if url[:1] != b"/":  # absolute-form (or asterisk-form: refused by the path rule)
            try:
                parsed = httptools.parse_url(url)
            except httptools.HttpParserInvalidURLError:
                raise _Refused(400) from None
            if parsed.schema not in (b"http", b"https") or not parsed.host:
                raise _Refused(400)
            authority = parsed.host + (b":%d" % parsed.port if parsed.port else b"")
            url = url[url.index(b"/", len(parsed.schema) + 3) :] if parsed.path else b"/"
            if parsed.query and not parsed.path:
                url += b"?" + parsed.query
        one = self.host
        if authority is None and self.hosts == 1 and one is not None:
            host = one
            valid = _HOSTS.get(one)
            if valid is None:
                valid = host_of((one,), version) is not None
                if len(_HOSTS) >= _MAX_TARGETS:
                    _HOSTS.clear()
                _HOSTS[one] = valid
            if not valid:
                raise _Refused(400)
        else:
            found = host_of((one or b"",) * self.hosts, version, authority)
            if found is None:
                raise _Refused(400)
            host = found
        if authority is not None:
            headers[:] = [pair for pair in headers if pair[0] != b"host"]
            headers.append((b"host", authority))
        try:
            target = _TARGETS[url]
        except KeyError:
            target = _target(url)
            if len(_TARGETS) >= _MAX_TARGETS:
                _TARGETS.clear()
            _TARGETS[url] = target
        if target is None:
            raise _Refused(400)
        path, raw_path, query = target
        settings = self.settings
        app = settings.app
        if method == "TRACE":
            allows = getattr(app, "allows_trace", None)
            if allows is None or not allows(path, _hostname(host)):
                raise _Refused(405)
        keep_alive = alive and version != "1.0"
        if (
            self.upgrade == b"websocket"
            and method == "GET"
            and settings.websocket_max_size is not None
            and self.parser.should_upgrade()
        ):
            self.websocket = {
                "type": "websocket",
                "asgi": _ASGI,
                "http_version": version,
                "scheme": "wss" if settings.scheme == "https" else "ws",
                "server": self.server,
                "client": self.client,
                "root_path": "",
                "path": path,
                "raw_path": raw_path,
                "query_string": query,
                "headers": headers,
                "subprotocols": _subprotocols(headers),
                "state": {},
                "extensions": {"websocket.http.response": {}},
            }
            return
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": settings.scheme,
            "root_path": "",
            "headers": headers,
            # (no "state": the listener runs no lifespan, and ASGI makes it optional)
            "method": method,
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
        }
        self.scope = scope
        existing = self.cycle
        idle = existing is None or existing.response_complete
        if idle and not self.expect_100_continue and not self.framed:
            fast = getattr(app, "fast", None)
            if fast is not None:  # a bodyless head: the host it routes by is known
                cycle = fast(self, scope, keep_alive, host)
                if cycle is not None:
                    self.cycle = cycle
                    return
        cycle = self.cycle = Cycle(self, scope, keep_alive, self.expect_100_continue)
        scope[DISCONNECT] = cycle
        if idle:
            cycle.start(app)
        else:  # pipelined: answered after the answer in progress
            self.flow.pause_reading()
            self.pipeline.append(cycle)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not isinstance(cycle, Cycle):
            return
        cycle.body += body
        if len(cycle.body) > _HIGH_WATER:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        self.completed += 1
        self.in_head = True
        self.head_bytes = 0
        # the next head's fields, fresh
        self.url = b""
        self.host = None
        self.hosts = 0
        self.bytes_left = self.max_head
        self.expect_100_continue = False
        self.upgrade = None
        self.connection = False
        self.framed = False
        self.headers = []
        cycle = self.cycle
        if isinstance(cycle, Cycle) and not cycle.response_complete:
            cycle.more_body = False
            cycle.message_event.set()

    # -- answers of the listener's own ----------------------------------------------------

    def _refuse(self, status: int) -> None:
        """Answer ``status`` (after the answer in progress) and close."""
        self.closing = True
        cycle = self.cycle
        if (
            isinstance(cycle, Cycle)
            and not self.in_head
            and not self.pipeline
            and not cycle.response_started
            and not cycle.response_complete
        ):
            # The body of the request being answered is broken: the request ends
            # here, as if its client had gone, and the listener answers it.
            cycle.disconnected = True
            cycle.message_event.set()
            on_lost, cycle.on_lost = cycle.on_lost, None
            if on_lost is not None:
                on_lost()
            cycle = None
        if cycle is not None and not cycle.response_complete:
            self.refusal = status  # on_response_complete answers it
            self.flow.pause_reading()
            return
        self.outbox.flush()
        if not self.transport.is_closing():
            self.transport.write(answer(status))
            self.transport.close()

    def on_response_complete(self) -> None:
        """The answer in progress is complete: the next request may be answered."""
        self.state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.refusal and not self.pipeline:
            status, self.refusal = self.refusal, 0
            self.cycle = None
            self._refuse(status)
            return
        flow = self.flow
        if flow.read_paused and not self.closing:
            flow.resume_reading()
        if self.pipeline:
            cycle = self.pipeline.popleft()
            cycle.start(self.settings.app)
        elif not self.closing:
            self._arm(keep_alive=True)

    def _hand_off(self, leftover: bytes) -> None:
        scope, self.websocket = self.websocket, None
        assert scope is not None
        try:
            from ._websocket import WebSocketSession  # type: ignore[import-not-found,unused-ignore]
        except ImportError:  # pragma: no cover - the module ships with the package
            log.error("WebSocket upgrade refused: no WebSocket support installed")
            self._refuse(501)
            return

        self.settings.watched.discard(self)
        self.state.connections.discard(self)
        max_size = self.settings.websocket_max_size or (1 << 20)
        session = WebSocketSession(self.settings.app, scope, self.transport, self.loop, max_size)
        sessions = self.state.sessions
        sessions[session] = self.transport
        for gone in [s for s, t in sessions.items() if t.is_closing()]:
            del sessions[gone]
        self.transport.set_protocol(session)
        session.start(leftover)

    def shutdown(self) -> None:
        """The server is stopping: close now if idle, else after the answer in progress."""
        self.closing = True
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self.outbox.flush()
            self.transport.close()
        else:
            cycle.keep_alive = False


def _target(url: bytes) -> tuple[str, bytes, bytes] | None:
    try:
        parsed = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        return None
    raw = normalise_path(parsed.path or b"")
    if raw is None:
        return None
    try:
        decoded = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    if "%" in decoded:
        decoded = urllib.parse.unquote(decoded)
    return decoded, raw, parsed.query or b""


def _hostname(host: bytes) -> str | None:
    if not host:
        return None
    text = host.decode("latin-1").lower()
    if text.startswith("["):
        return text[: text.index("]") + 1]
    return text.rsplit(":", 1)[0]


def _subprotocols(headers: list[tuple[bytes, bytes]]) -> list[str]:
    out: list[str] = []
    for name, value in headers:
        if name == b"sec-websocket-protocol":
            out += [p.strip() for p in value.decode("latin-1").split(",") if p.strip()]
    return out


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None
