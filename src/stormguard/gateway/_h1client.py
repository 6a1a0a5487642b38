# The proxy leg's upstream client: HTTP/1.1 with keep-alive on asyncio protocols and
# httptools' response parser. It is the one small interface the proxy leg uses
# (`H1Pool.request() -> H1Response`, `read()`, `chunks()`, `release()`), and it
# exists because it is measurably cheaper than aiohttp's client per request (see
# bench/bench_gateway.py): no task, no timer object and no header multidict per
# request -- the answer to a small request is usually parsed, body and all, in the
# same callback that delivers its status line.
#
# Rules:
# * one pool per upstream, idle connections per target (last in, first out);
#   at most `limit` connections open at once, later requests wait for one;
# * a connection goes back to the pool only after a complete response that
#   allows keep-alive (HTTP/1.1, no `Connection: close`, its end known) and was
#   read to its end; anything else closes it;
# * framing is this client's alone: an answer ends where its framing says (HEAD,
#   204 and 304 with their head, whatever Content-Length says); a byte after that
#   end, in the same read or later, or on an idle connection, closes the
#   connection and is never delivered; 1xx interim answers are dropped, a 101
#   (never asked for) is an UpstreamError, trailers are dropped;
# * a request that fails on a *reused* connection before any byte of the answer
#   came back is sent once more on a new connection when it is safe to (the
#   upstream closed an idle connection as we wrote: nothing was processed);
# * errors are ours: UpstreamConnectError (never sent; ConnectTimeout is one),
#   UpstreamError (may have been processed) and ReadTimeout (a TimeoutError);
# * read timeout = the longest silence while an answer is due; total = the whole
#   exchange up to the last body byte; both checked by one sweep per pool.
# * an answer whose first read is byte for byte the last whole answer the
#   connection read in one piece (length-framed, kept alive, nothing around it) is
#   that answer again: it is not parsed again (see "an answer read again" below).
from __future__ import annotations

import asyncio
import logging
import select
import ssl
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

import httptools

from ._config import Timeout
from ._outbox import Outbox
from ._retries import stale_resend
from ._urls import split_userinfo

log = logging.getLogger("stormguard.gateway")
_TLS_LOG_EVERY = 10.0  # seconds between two log lines of one target's failing handshake

__all__ = [
    "ConnectTimeout",
    "H1Pool",
    "H1Response",
    "ReadTimeout",
    "UpstreamConnectError",
    "UpstreamError",
]

_NO_CHUNKS: deque[bytes] = deque(maxlen=0)  # shared, always empty (see H1Response)
_HIGH_WATER = 256 * 1024  # buffered answer bytes before the upstream socket is paused
_KEEP_MAX = 4096  # the longest read kept to be recognised again (one per connection)


def _keyed(headers: list[tuple[bytes, bytes]]) -> bool:
    # Whether a request carries an Idempotency-Key (the table's "keyed").
    return any(pair[0] == b"idempotency-key" for pair in headers)


_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
_METHOD_BYTES = {m: m.encode("ascii") for m in ("GET", "HEAD", "OPTIONS", "DELETE", "TRACE")}


def _request_head(endpoint: _Endpoint, method: str, target: bytes, block: bytes) -> bytes:
    """A request's head: its line (the base URL's path before ``target``), Host (the
    endpoint's), then ``block`` (:meth:`H1Pool.header_block`); an endpoint with
    credentials puts its Authorization first, in place of any in ``block``."""
    authorization = endpoint.authorization
    if authorization is not None:
        lines = block.split(b"\r\n")
        kept = [line for line in lines if line[:14].lower() != b"authorization:"]
        block = b"Authorization: %s\r\n%s" % (authorization, b"\r\n".join(kept))
    return b"%s %s%s HTTP/1.1\r\nHost: %s\r\n%s" % (
        _METHOD_BYTES.get(method) or method.encode("ascii"),
        endpoint.prefix,
        target or b"/",
        endpoint.host_header,
        block,
    )


_NO_BODY_STATUS = (204, 304)
_PREPARING = 4  # connections opened ahead at once (H1Pool.prepare)


class UpstreamError(Exception):
    """The exchange failed after the request may have reached the upstream."""


class UpstreamConnectError(UpstreamError):
    """No connection to the upstream: the request was never sent."""


class ConnectTimeout(UpstreamConnectError, TimeoutError):
    """The connection was not established within the connect timeout."""


class ReadTimeout(UpstreamError, TimeoutError):
    """The upstream went silent longer than the read (or total) timeout."""


def _tokens(value: bytes) -> list[bytes]:
    return [token.strip() for token in value.lower().split(b",")]


class _Beyond(Exception):
    """Raised in a parser callback: the upstream sent more than its answer."""


class _Endpoint:
    """Where one target's connections go (parsed once)."""

    __slots__ = (
        "authorization",
        "host",
        "host_header",
        "idle",
        "port",
        "prefix",
        "server_name",
        "ssl",
        "tls_logged",
    )

    def __init__(
        self, base: str, tls: ssl.SSLContext | None = None, server_name: str | None = None
    ) -> None:
        plain, self.authorization = split_userinfo(base)  # Host never carries them
        parts = urlsplit(plain)
        secure = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if secure else 80)
        self.ssl: ssl.SSLContext | None = (tls or ssl.create_default_context()) if secure else None
        # The name sent in SNI and checked against the certificate (upstreams.NAME.tls).
        self.server_name = (server_name or self.host) if secure else None
        self.tls_logged = -_TLS_LOG_EVERY  # loop time of the last TLS failure logged
        self.host_header = parts.netloc.encode("latin-1")
        self.prefix = parts.path.rstrip("/").encode("latin-1")
        self.idle: list[_Connection] = []


class H1Response:
    """One upstream answer: status and headers now, the body as it arrives."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_error",
        "_size",
        "_waiter",
        "complete",
        "content_length",
        "keep_alive",
        "raw_headers",
        "sink",
        "status",
    )

    def __init__(self, conn: _Connection, sink: Sink | None = None) -> None:
        self._conn: _Connection | None = conn
        self.sink = sink  # told of everything as it happens (no awaiting reader)
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self.keep_alive = False
        self.complete = False
        # A sink hears the body as it comes: its answer never queues a chunk.
        self._chunks: deque[bytes] = deque() if sink is None else _NO_CHUNKS
        self._size = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- fed by the connection --------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _feed(self, chunk: bytes) -> None:
        if self.sink is not None:
            self.sink.answer_body(chunk)
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        conn = self._conn
        if self._size > _HIGH_WATER and conn is not None:
            conn.pause()
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if not self.complete and self._error is None:
            self._error = exc
            if self.sink is not None:
                self.sink.answer_error(exc)
        self._wake()

    # -- read by the proxy leg --------------------------------------------------------

    async def _more(self) -> None:
        if self._error is not None:
            raise self._error
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        await waiter
        error: BaseException | None = self._error  # set while we waited
        if error is not None and not self._chunks:
            raise error

    async def read(self) -> bytes:
        """The whole body."""
        while not self.complete:
            await self._more()
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._finished()
        return data

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, piece by piece as it arrives."""
        chunks = self._chunks
        while True:
            while chunks:
                chunk = chunks.popleft()
                self._size -= len(chunk)
                if self._size <= _HIGH_WATER // 2 and self._conn is not None:
                    self._conn.resume()
                yield chunk
            if self.complete:
                self._finished()
                return
            await self._more()

    def _finished(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.finish(self)
            self._conn = None

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool or is closed."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            if self.complete:
                conn.finish(self)
            else:
                conn.close()


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a target, carrying one exchange at a time."""

    # Slots: with this many fields an instance dict cost about 2.5 k instructions
    # more per request (bench gateway-instructions).
    __slots__ = (
        "after_end",
        "beyond",
        "closed",
        "deadline",
        "drained",
        "ended",
        "endpoint",
        "fd",
        "framing",
        "head_chunked",
        "head_request",
        "headers",
        "headers_ready",
        "http11",
        "interim",
        "interim_seen",
        "kept",
        "last_body",
        "last_read",
        "on_chunk_header",
        "on_message_begin",
        "parser",
        "paused",
        "poller",
        "pool",
        "received",
        "replayed_status",
        "response",
        "transport",
        "until_eof",
    )

    def __init__(self, pool: H1Pool, endpoint: _Endpoint) -> None:
        self.pool = pool
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        # A message that begins after the answer ended, in the same read: its first
        # bytes may call no other callback (a status line cut short). The set holds
        # a mark from the moment the answer ends; llhttp's on_message_begin empties
        # it (a C method: no Python frame per answer). Set before the parser, which
        # looks its callbacks up once.
        self.after_end: set[None] = set()
        self.on_message_begin: Callable[[], None] = self.after_end.clear
        # After the head of an answer to HEAD that says chunked, the parser reads the
        # rest of the read as chunks: a chunk's size line empties the set too, and a
        # read that ends inside one (not at a line's end) is beyond the answer.
        self.on_chunk_header: Callable[[], None] = self.after_end.clear
        self.head_chunked = False
        self.parser = httptools.HttpResponseParser(self)
        self.response: H1Response | None = None
        self.headers_ready: asyncio.Future[None] | None = None
        self.closed = False
        self.received = False  # a byte of the current answer came back
        self.head_request = False
        self.until_eof = False  # an answer without length: it ends when the connection does
        self.interim = False  # the parser is in a 1xx answer
        self.http11: bool | None = None  # the connection's answers are HTTP/1.1
        self.headers: list[tuple[bytes, bytes]] = []  # the head's fields, as they come
        self.ended = False  # the final answer is complete, not yet delivered
        self.beyond = False  # bytes came after the end of the answer
        self.paused = False
        self.drained: asyncio.Future[None] | None = None
        self.last_read = 0.0
        self.deadline = 0.0  # loop time the whole exchange must end by (0: none)
        self.fd = -1  # the socket's descriptor (the idle check)
        self.poller: select.poll | None = None  # its poll(2) set, made once (quiet)
        self.framing: Any = None  # the last answer's framing (on_headers_complete)
        # The last read, when it held exactly one whole answer framed by its length
        # and read from between two answers, not to HEAD: (bytes, status, fields, body).
        # The same bytes again, from the same place, are that answer again (below).
        self.kept: tuple[bytes, int, tuple[tuple[bytes, bytes], ...], bytes] | None = None
        self.replayed_status = 0  # a replayed answer's status (0: ask the parser)
        self.last_body = b""  # the body the last on_body of this read delivered
        self.interim_seen = False  # this answer had an interim one before it

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        self.fd = sock.fileno() if sock is not None else -1
        if self.fd >= 0 and hasattr(select, "poll"):  # (not on Windows: select there)
            self.poller = select.poll()
            self.poller.register(self.fd, select.POLLIN)

    def quiet(self) -> bool:
        """Nothing waits unread on the idle connection. Bytes (or the peer's FIN) that
        arrived while it sat in the pool but that the loop has not handed to
        data_received yet would be taken for the next request's answer: such a
        connection is closed instead of reused (urllib3 checks a pooled connection
        the same way). One poll(2) with no wait, on the set made with the connection
        (any event -- bytes, the peer's FIN, an error -- is not quiet)."""
        poller = self.poller
        try:
            if poller is not None:
                return not poller.poll(0)
            return self.fd < 0 or not select.select((self.fd,), (), (), 0)[0]
        except (OSError, ValueError):
            return False

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None or response.complete:
            # Nothing asked (an idle pooled connection), or bytes after a complete
            # answer: a confused upstream. Never handed to the next request.
            self.close()
            return
        kept = self.kept
        if not self.received:  # the answer's first bytes: the parser is between answers
            self.received = True
            if kept is not None and kept[0] == data and not self.head_request:
                self._replay(kept)
                return
            self.kept = None
            self.interim_seen = False
            self.last_body = b""
            fresh = True
        else:
            self.kept = None
            fresh = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # llhttp stops at a 101 (or an upgrade it believes in): this client never
            # asks for one, so the answer is unusable.
            self._broken(UpstreamError("the upstream switched protocols unasked (101)"))
            return
        except httptools.HttpParserError as exc:
            if not self.ended:
                self._broken(UpstreamError(f"malformed answer from the upstream: {exc}"))
                return
            self.beyond = True  # garbage (or a second answer) after the complete one
        if self.ended:
            if not self.after_end:  # another message (or a chunk) began after it
                self.beyond = True
            elif self.head_chunked:
                self.head_chunked = False
                if not data.endswith(b"\n"):  # a chunk's size line, cut short
                    self.beyond = True
            elif fresh and len(data) <= _KEEP_MAX:
                self._keep(data, response)
            self._complete()
        elif not response.complete:  # still due: the silence is counted from now
            self.last_read = self.pool.loop.time()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost tells the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        self.pool.lost(self)
        response = self.response
        if response is not None and not response.complete:
            if self.until_eof and response.status:
                self.ended = True  # the answer ended with the connection
                self._complete()
            else:
                self._broken(UpstreamError("the upstream closed the connection"))
        drained = self.drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    def pause_writing(self) -> None:
        self.drained = self.pool.loop.create_future()

    def resume_writing(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    # -- httptools callbacks ------------------------------------------------------------
    #
    # The parser only observes; the answer is delivered after feed_data returns
    # (data_received -> _complete), so that nothing the upstream sent after the end
    # of its answer can reach the next exchange: once the final answer is complete
    # (`ended`), any callback of a further message, or any body byte, raises _Beyond,
    # which stops the parser; the connection is then closed, never reused.

    def on_header(self, name: bytes, value: bytes) -> None:
        # A further message's first callback is this one or on_headers_complete (no
        # on_message_begin: a callback fewer per answer; its status line calls none).
        if self.ended:
            raise _Beyond
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.ended:
            raise _Beyond
        response = self.response
        assert response is not None
        status = self.replayed_status or self.parser.get_status_code()
        if status == 101:  # never asked for: llhttp raises HttpParserUpgrade next
            return
        if 100 <= status < 200:  # interim answer: dropped, wait for the real one
            response.raw_headers = self.headers = []
            self.interim = self.interim_seen = True
            return
        response.status = status
        # Reused only after an HTTP/1.1 answer without "Connection: close" whose end
        # is known, as h11 reads it (an HTTP/1.0 answer is never reused; its version
        # is read once per connection: llhttp's get_http_version costs as much as the
        # rest of this method). llhttp cannot know an answer to HEAD has no body, so
        # its keep-alive verdict is not asked for one.
        parser = self.parser
        http11 = self.http11
        if http11 is None:
            http11 = self.http11 = parser.get_http_version() == "1.1"
        # The framing is a function of the status, the request's method and the
        # fields alone: an upstream answering alike again (its Date changes once a
        # second) is framed as its last answer was (one kept per connection).
        raw = response.raw_headers
        head = self.head_request
        memo = self.framing  # (status, HEAD?, fields, length, chunked, bodiless, keep-alive)
        if memo is not None and memo[0] == status and memo[1] is head and memo[2] == raw:
            _, _, _, length, chunked, bodiless, keep_alive = memo
        else:
            length = None
            chunked = False
            for name, value in raw:
                lowered = name.lower()
                if lowered == b"content-length":
                    length = int(value) if value.isdigit() else None
                elif lowered == b"transfer-encoding":
                    chunked = b"chunked" in value.lower()
            bodiless = head or status in _NO_BODY_STATUS
            if bodiless:
                length = 0
                keep_alive = http11 and not any(
                    name.lower() == b"connection" and b"close" in _tokens(value)
                    for name, value in raw
                )
            else:
                keep_alive = http11 and parser.should_keep_alive()
            self.framing = (status, head, raw, length, chunked, bodiless, keep_alive)
        response.keep_alive = keep_alive
        if chunked:  # a trailer's fields go to a list of their own, dropped
            self.headers = []
        response.content_length = None if chunked and not bodiless else length
        self.until_eof = length is None and not chunked
        waiter = self.headers_ready
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if response.sink is not None:
            response.sink.answer_head(response)
        if bodiless:
            # The answer ends with its head whatever Content-Length says (HEAD, 204,
            # 304): httptools cannot be told so, so the rest of this read goes to
            # this parser (any byte of it is beyond the answer) and the next
            # exchange gets a fresh one.
            self.parser = httptools.HttpResponseParser(self)
            self.ended = True
            self.after_end.add(None)
            self.head_chunked = chunked and head

    def on_body(self, body: bytes) -> None:
        if self.ended:
            raise _Beyond
        self.last_body = body
        response = self.response
        if response is not None:
            sink = response.sink
            if sink is not None:
                sink.answer_body(body)
            else:
                response._feed(body)

    def on_message_complete(self) -> None:
        if self.interim:  # the end of an interim answer
            self.interim = False
            return
        response = self.response
        if response is None or response.status == 0 or self.ended:
            return
        self.ended = True
        self.after_end.add(None)

    # -- an answer read again ----------------------------------------------------------
    #
    # An upstream that answers alike sends the same bytes again (its Date changes once
    # a second). A read that held exactly one whole answer -- read from between two
    # answers, framed by its Content-Length, body and all, with nothing after it, no
    # interim answer before it, kept alive -- is kept with what llhttp made of it.
    # When the next answer's first read is the same bytes, it is not parsed again:
    # llhttp would make the same of the same bytes from the same place, and end where
    # it stands, between two answers. The callbacks then run as the parser would call
    # them, with the kept fields, status and body. Any other read on the connection
    # drops what was kept.

    def _keep(self, data: bytes, response: H1Response) -> None:
        length = response.content_length
        status = response.status
        if (
            length is not None
            and length == len(self.last_body)
            and response.keep_alive
            and not self.beyond
            and not self.interim_seen
            and not self.until_eof
            and not self.head_request
            and status not in _NO_BODY_STATUS
        ):
            self.kept = (data, status, tuple(response.raw_headers), self.last_body)

    def _replay(self, kept: tuple[bytes, int, tuple[tuple[bytes, bytes], ...], bytes]) -> None:
        _, status, fields, body = kept
        self.headers += fields
        self.replayed_status = status
        try:
            self.on_headers_complete()
        finally:
            self.replayed_status = 0
        if body:
            self.on_body(body)
        self.on_message_complete()
        if self.ended:  # (not when the exchange let go of the answer meanwhile)
            self._complete()

    def _complete(self) -> None:
        # The final answer is complete (ended): deliver its end; bytes beyond it
        # close the connection now.
        response = self.response
        assert response is not None
        self.ended = False
        if response.complete:
            return
        response.complete = True
        self.pool.busy.discard(self)  # _cancel_timer()
        if self.until_eof or not response.keep_alive or self.beyond:
            response.keep_alive = False
        if self.beyond:
            self.close()
        if response.sink is not None:
            response.sink.answer_end()
            if response._conn is not None:  # response._finished(), inline
                response._conn = None
                self.finish(response)
            return
        response._wake()

    # -- the exchange -------------------------------------------------------------------

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def begin(self, response: H1Response, head: bool, read: float, total: float | None) -> None:
        loop = self.pool.loop
        self.response = response
        self.received = False
        self.head_request = head
        self.until_eof = False
        self.interim = self.ended = self.beyond = False
        self.headers = response.raw_headers  # what on_header appends to
        self.headers_ready = loop.create_future() if response.sink is None else None
        now = loop.time()
        self.last_read = now
        self.deadline = now + total if total else 0.0
        pool = self.pool
        pool.busy.add(self)  # watched by the pool's sweep (started with the first)
        if pool._sweeper is None:
            pool._sweeper = loop.call_later(pool._sweep_every, pool._sweep)

    def check_timeout(self, now: float, read: float) -> None:
        """Fail the exchange if the upstream has been silent (or slow) too long."""
        if self.deadline and now >= self.deadline:
            self._broken(ReadTimeout("the upstream did not finish within the total timeout"))
        elif now - self.last_read >= read:
            self._broken(ReadTimeout(f"the upstream was silent for {read:g} s"))

    def _cancel_timer(self) -> None:
        self.pool.busy.discard(self)

    def _broken(self, exc: BaseException) -> None:
        response = self.response
        waiter = self.headers_ready
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if response is not None:
            response._fail(exc)
        self.close()

    def finish(self, response: H1Response) -> None:
        """The exchange is over; keep the connection when the answer allows it."""
        if self.response is not response:
            return
        self.response = None
        self.headers_ready = None
        self.pool.busy.discard(self)  # _cancel_timer()
        if response.complete and response.keep_alive and not self.closed and not self.paused:
            pool = self.pool
            if pool._closed:  # pool.idle(self), inline
                self.close()
                return
            self.endpoint.idle.append(self)
            if pool._waiters:
                pool._wake_one()
        else:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._cancel_timer()
            if self.transport is not None:
                self.transport.close()
            self.pool.lost(self)

    async def drain(self) -> None:
        drained = self.drained
        if drained is not None:
            await drained


Body = bytes | AsyncIterable[bytes] | None


class Sink(Protocol):
    """Who hears an answer as it arrives (a direct exchange, chain/_exchange.py)."""

    def answer_head(self, response: H1Response) -> None: ...
    def answer_body(self, chunk: bytes) -> None: ...
    def answer_end(self) -> None: ...
    def answer_error(self, exc: BaseException) -> None: ...


class H1Pool:
    """Keep-alive HTTP/1.1 connections to the targets of one upstream: at most
    ``limit`` open, with the upstream's connect/read/total ``timeout``."""

    def __init__(
        self,
        limit: int,
        timeout: Timeout,
        *,
        tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> None:
        self.limit = limit
        self.tls, self.server_name = tls, server_name  # for https:// targets
        self.connect_timeout = timeout.connect
        self.read_timeout = read = timeout.read
        self.total_timeout = total = timeout.total
        self.open = 0
        self._endpoints: dict[str, _Endpoint] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._all: set[_Connection] = set()
        self._closed = False
        self._preparing = 0
        self._started = False  # the loop is known (first request)
        self._tasks: set[asyncio.Task[None]] = set()
        # Exchanges waiting for an answer, checked by one sweep timer (not a timer
        # per request): a timeout fires between 1 and 1.25 times its length.
        self.busy: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_every = max(0.01, min(read, total or read) / 4)
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set on first use

    # -- bookkeeping from the connections -----------------------------------------------

    def idle(self, conn: _Connection) -> None:
        if self._closed:
            conn.close()
            return
        conn.endpoint.idle.append(conn)
        if self._waiters:
            self._wake_one()

    def lost(self, conn: _Connection) -> None:
        if conn in self._all:
            self._all.discard(conn)
            self.open -= 1
            idle = conn.endpoint.idle
            if conn in idle:
                idle.remove(conn)
            self._wake_one()

    def _sweep(self) -> None:
        self._sweeper = None
        now = self.loop.time()
        for conn in list(self.busy):
            conn.check_timeout(now, self.read_timeout)
        if self.busy and not self._closed:
            self._sweeper = self.loop.call_later(self._sweep_every, self._sweep)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    # -- connections --------------------------------------------------------------------

    def _endpoint(self, base: str) -> _Endpoint:
        endpoint = self._endpoints.get(base)
        if endpoint is None:
            endpoint = self._endpoints[base] = _Endpoint(base, self.tls, self.server_name)
        return endpoint

    async def _connection(self, endpoint: _Endpoint) -> tuple[_Connection, bool]:
        idle = endpoint.idle
        while True:
            while idle:
                conn = idle.pop()
                if conn.closed:
                    continue
                if conn.quiet():
                    return conn, True
                conn.close()  # something waits unread on it: never reused
            if self.open < self.limit:
                return await self._connect(endpoint), False
            spare = next((c for e in self._endpoints.values() for c in e.idle), None)
            if spare is not None:  # another target's idle connection makes room
                spare.close()
                continue
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                waiter.cancel()
                self._wake_one()
                raise

    async def _connect(self, endpoint: _Endpoint) -> _Connection:
        loop = self.loop
        self.open += 1  # reserved while connecting
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self, endpoint),
                    endpoint.host,
                    endpoint.port,
                    ssl=endpoint.ssl,
                    server_hostname=endpoint.server_name,
                ),
                self.connect_timeout,
            )
        except TimeoutError:
            self.open -= 1
            self._wake_one()
            raise ConnectTimeout(
                f"no connection to {endpoint.host}:{endpoint.port} "
                f"within {self.connect_timeout:g} s"
            ) from None
        except OSError as exc:
            self.open -= 1
            self._wake_one()
            if (
                isinstance(exc, ssl.SSLError)
                and loop.time() - endpoint.tls_logged >= _TLS_LOG_EVERY
            ):
                endpoint.tls_logged = loop.time()  # a wrong CA or name: say why, now and then
                log.warning(
                    "TLS to upstream %s:%s (server name %r) failed: %s",
                    endpoint.host,
                    endpoint.port,
                    endpoint.server_name,
                    exc,
                )
            raise UpstreamConnectError(
                f"cannot connect to {endpoint.host}:{endpoint.port}: {exc}"
            ) from exc
        except BaseException:
            self.open -= 1
            self._wake_one()
            raise
        self._all.add(conn)
        return conn

    # -- the callback path --------------------------------------------------------------

    def take_idle(self, base: str) -> _Connection | None:
        """An idle connection to the target at ``base`` if there is one (else None)."""
        endpoint = self._endpoints.get(base)
        idle = (endpoint or self._endpoint(base)).idle
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if conn.quiet():
                return conn
            conn.close()  # a late answer (or a close) waits on it: never reused
        return None

    def prepare(self, base: str) -> None:
        """Open one more connection to ``base`` in the background, to wait idle.

        The callback path asks for it when it found no idle connection, so the pool
        grows to the concurrency the upstream sees. A failure is dropped: the proxy
        leg meets (and reports) it on its next request.
        """
        if (
            self._preparing >= _PREPARING
            or self.open >= self.limit
            or self._closed
            or not self._started
        ):
            return
        self._preparing += 1
        task = self.loop.create_task(self._prepare(self._endpoint(base)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _prepare(self, endpoint: _Endpoint) -> None:
        try:
            conn = await self._connect(endpoint)
        except (UpstreamError, TimeoutError):
            return
        finally:
            self._preparing -= 1
        self.idle(conn)

    async def connect_to(self, base: str) -> _Connection:
        """A new connection to the target at ``base`` (for :meth:`send_now`)."""
        self._start()
        return await self._connect(self._endpoint(base))

    async def acquire(self, base: str) -> _Connection:
        """A connection to the target at ``base`` for :meth:`send_now`: an idle one,
        else a new one, else (``limit`` reached) the next one that comes free."""
        self._start()
        conn, _ = await self._connection(self._endpoint(base))
        return conn

    def _start(self) -> None:
        # The loop is known from the first request on (the pool is built before it runs).
        if not self._started:
            self._started = True
            self.loop = asyncio.get_running_loop()

    def send_now(
        self,
        conn: _Connection,
        method: str,
        target: bytes,
        block: bytes,
        sink: Sink,
        outbox: Outbox,
    ) -> H1Response:
        """Send a bodyless request on ``conn`` (from :meth:`take_idle`) with the
        loop pass's other writes (``outbox``); ``block`` is its header lines after
        Host (:meth:`header_block`); ``sink`` hears the answer. Errors reach
        ``sink.error``, never the caller."""
        response = H1Response(conn, sink)
        conn.begin(response, method == "HEAD", self.read_timeout, self.total_timeout)
        assert conn.transport is not None
        outbox.write(conn.transport, _request_head(conn.endpoint, method, target, block))
        return response

    @staticmethod
    def header_block(method: str, headers: list[tuple[bytes, bytes]], body: Body = None) -> bytes:
        """The header lines of a request after Host, and the blank line: framing by
        ``body`` (None: a bodyless ``method`` request, what :meth:`send_now` sends;
        it depends on nothing else, so a caller sending the same headers again may
        keep it)."""
        parts: list[bytes] = []
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if isinstance(body, bytes):
            parts.append(b"Content-Length: %d\r\n\r\n" % len(body))
        elif body is None:
            parts.append(b"\r\n" if method in _IDEMPOTENT else b"Content-Length: 0\r\n\r\n")
        else:
            parts.append(b"Transfer-Encoding: chunked\r\n\r\n")
        return b"".join(parts)

    # -- the exchange -------------------------------------------------------------------

    async def request(
        self,
        base: str,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: Body = None,
    ) -> H1Response:
        """Send one request to the target at ``base``; the answer once its head is in.

        ``target`` is the path and query (the base URL's path is put in front);
        ``headers`` go as they are, after ``Host`` (the target's). A bytes body is
        sent with Content-Length, an async iterable chunked.
        """
        self._start()
        endpoint = self._endpoint(base)
        head = _request_head(endpoint, method, target, self.header_block(method, headers, body))
        while True:
            conn, reused = await self._connection(endpoint)
            response = H1Response(conn)
            try:
                await self._exchange(conn, response, method, head, body)
                return response
            except UpstreamError as exc:
                resend = (  # (a silent upstream may be working on it: never again)
                    reused
                    and not isinstance(exc, TimeoutError)
                    and not conn.received
                    and (body is None or isinstance(body, bytes))
                    and stale_resend(method, _keyed(headers))
                )
                conn.close()
                if not resend:
                    raise
            except BaseException:
                conn.close()
                raise

    async def _exchange(
        self, conn: _Connection, response: H1Response, method: str, head: bytes, body: Body
    ) -> None:
        transport = conn.transport
        assert transport is not None
        conn.begin(response, method == "HEAD", self.read_timeout, self.total_timeout)
        if body is None or isinstance(body, bytes):
            transport.write(head + body if body else head)
        else:
            transport.write(head)
            try:
                async for chunk in body:
                    if conn.closed:
                        break
                    transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    if conn.drained is not None:
                        await conn.drain()
            except Exception as exc:  # the client's body failed; the caller knows why
                conn.close()
                raise UpstreamError(f"request body failed: {exc!r}") from exc
            if not conn.closed:
                transport.write(b"0\r\n\r\n")
        ready = conn.headers_ready
        assert ready is not None
        await ready

    async def close(self) -> None:
        """Close every connection."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for task in list(self._tasks):
            task.cancel()
        for conn in list(self._all):
            conn.close()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.cancel()
        self._waiters.clear()
