"""The proxy leg's upstream client (_h1client.py) against scripted loopback servers."""

from __future__ import annotations

import asyncio
import select
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from stormguard.gateway._config import Timeout
from stormguard.gateway._h1client import (
    H1Pool,
    H1Response,
    ReadTimeout,
    UpstreamConnectError,
    UpstreamError,
)

Script = Callable[[bytes, asyncio.Transport], None]


class Upstream:
    """A loopback server answering each request head with ``script(head, transport)``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Upstream:
        upstream = self

        class Protocol(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                upstream.connections += 1
                self.transport = transport
                self.buffer = b""

            def data_received(self, data: bytes) -> None:
                self.buffer += data
                while b"\r\n\r\n" in self.buffer:
                    head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
                    upstream.requests.append(head)
                    upstream.script(head, self.transport)  # type: ignore[arg-type]

        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(Protocol, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def base(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


def ok(body: bytes = b"ok", extra: bytes = b"") -> Script:
    def answer(head: bytes, transport: asyncio.Transport) -> None:
        payload = b"" if head.startswith(b"HEAD ") else body  # HEAD: the length, no body
        transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, payload)
        )

    return answer


def pool(read: float = 5.0, limit: int = 10) -> H1Pool:
    return H1Pool(limit, Timeout(connect=1.0, read=read))


async def get(client: H1Pool, base: str, path: bytes = b"/") -> tuple[H1Response, bytes]:
    response = await client.request(base, "GET", path, [(b"x-test", b"1")])
    return response, await response.read()


async def test_keep_alive_reuses_one_connection() -> None:
    """Sequential requests to one target travel over one connection."""
    async with Upstream(ok()) as up:
        client = pool()
        for _ in range(3):
            response, body = await get(client, up.base)
            assert (response.status, body) == (200, b"ok")
        assert up.connections == 1
        assert up.requests[0].startswith(b"GET / HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"x-test: 1" in up.requests[0]
        await client.close()


async def test_connection_close_is_not_reused() -> None:
    """An answer with Connection: close is read whole and its connection dropped."""
    async with Upstream(ok(extra=b"connection: close\r\n")) as up:
        client = pool()
        for _ in range(2):
            _, body = await get(client, up.base)
            assert body == b"ok"
        assert up.connections == 2
        await client.close()


async def test_chunked_answer_streams_in_pieces() -> None:
    """A chunked answer arrives piece by piece and the connection is kept after it."""

    def chunked(head: bytes, transport: asyncio.Transport) -> None:
        transport.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for piece in (b"one", b"two", b"three"):
            transport.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        transport.write(b"0\r\n\r\n")

    async with Upstream(chunked) as up:
        client = pool()
        response = await client.request(up.base, "GET", b"/", [])
        assert response.content_length is None
        assert b"".join([chunk async for chunk in response.chunks()]) == b"onetwothree"
        await get(client, up.base)
        assert up.connections == 1
        await client.close()


def says_then_closes(answer: bytes) -> Script:
    def script(head: bytes, transport: asyncio.Transport) -> None:
        transport.write(answer)
        transport.close()

    return script


async def test_body_until_close_ends_with_the_connection() -> None:
    """An answer without a length is the bytes up to the upstream's close."""
    async with Upstream(says_then_closes(b"HTTP/1.1 200 OK\r\n\r\nall of it")) as up:
        client = pool()
        _, body = await get(client, up.base)
        assert body == b"all of it"
        await client.close()


async def test_upstream_dying_mid_answer_is_an_error() -> None:
    """A connection lost before the announced length arrived raises UpstreamError."""
    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial"
    async with Upstream(says_then_closes(cut)) as up:
        client = pool()
        response = await client.request(up.base, "GET", b"/", [])
        with pytest.raises(UpstreamError):
            await response.read()
        await client.close()


async def test_silent_upstream_is_a_read_timeout() -> None:
    """An upstream that never answers raises ReadTimeout (a TimeoutError)."""
    async with Upstream(lambda head, transport: None) as up:
        client = pool(read=0.1)
        with pytest.raises(ReadTimeout) as raised:
            await client.request(up.base, "GET", b"/", [])
        assert isinstance(raised.value, TimeoutError)
        await client.close()


async def test_refused_connection_is_never_sent() -> None:
    """No listener: UpstreamConnectError, which says the request was not sent."""
    async with Upstream(ok()) as up:
        base = up.base
    client = pool()
    with pytest.raises(UpstreamConnectError):
        await client.request(base, "GET", b"/", [])
    await client.close()


async def test_stale_keep_alive_connection_is_retried_once_for_get() -> None:
    """A reused connection the upstream closed while idle: a GET goes out again, fresh."""
    state = {"n": 0}

    def close_after_first(head: bytes, transport: asyncio.Transport) -> None:
        state["n"] += 1
        ok()(head, transport)
        if state["n"] == 1:
            asyncio.get_running_loop().call_soon(transport.close)

    async with Upstream(close_after_first) as up:
        client = pool()
        await get(client, up.base)
        await asyncio.sleep(0.05)  # let the close reach the client
        _, body = await get(client, up.base)
        assert body == b"ok" and up.connections == 2
        await client.close()


async def test_streamed_request_body_is_chunked() -> None:
    """An async iterable body goes out with Transfer-Encoding: chunked."""
    seen: list[bytes] = []

    def answer_after_body(head: bytes, transport: asyncio.Transport) -> None:
        seen.append(head)
        ok()(head, transport)

    async def body() -> AsyncIterator[bytes]:
        yield b"abc"
        yield b"de"

    async with Upstream(answer_after_body) as up:
        client = pool()
        response = await client.request(up.base, "POST", b"/up", [], body())
        assert response.status == 200
        assert b"Transfer-Encoding: chunked" in seen[0]
        await client.close()


async def test_head_answer_has_no_body_and_the_connection_is_kept() -> None:
    """HEAD: the announced length is not read; the next request reuses the connection."""
    async with Upstream(ok(b"twelve bytes")) as up:
        client = pool()
        response = await client.request(up.base, "HEAD", b"/", [])
        assert response.content_length == 0 and await response.read() == b""
        _, body = await get(client, up.base)
        assert body == b"twelve bytes" and up.connections == 1
        await client.close()


async def test_alike_answers_are_framed_by_their_own_status_and_method() -> None:
    """An answer with the same fields as the last one on the connection is still
    framed by its own status and request method (the framing kept per connection):
    GET, HEAD, GET, then 204 and 200 with the same Content-Length, on one connection."""
    statuses = iter([b"200 OK", b"200 OK", b"200 OK", b"204 No Content", b"200 OK"])

    def answer(head: bytes, transport: asyncio.Transport) -> None:
        status = next(statuses)
        bodiless = head.startswith(b"HEAD ") or status.startswith(b"204")
        payload = b"" if bodiless else b"five!"
        transport.write(b"HTTP/1.1 %s\r\ncontent-length: 5\r\n\r\n%s" % (status, payload))

    async with Upstream(answer) as up:
        client = pool()
        seen = []
        for method in ("GET", "HEAD", "GET", "GET", "GET"):
            response = await client.request(up.base, method, b"/", [])
            seen.append((response.status, response.content_length, await response.read()))
        assert seen == [
            (200, 5, b"five!"),
            (200, 0, b""),
            (200, 5, b"five!"),
            (204, 0, b""),
            (200, 5, b"five!"),
        ]
        assert up.connections == 1
        await client.close()


async def test_pool_limit_makes_requests_wait_for_a_connection() -> None:
    """With limit=1 two concurrent requests share one connection, one after the other."""
    async with Upstream(ok()) as up:
        client = pool(limit=1)
        results = await asyncio.gather(get(client, up.base), get(client, up.base))
        assert [body for _, body in results] == [b"ok", b"ok"]
        assert up.connections == 1
        await client.close()


# -- framing: the upstream client alone decides where an answer ends -------------------


def writes(answer: bytes) -> Script:
    def script(head: bytes, transport: asyncio.Transport) -> None:
        transport.write(answer)

    return script


@pytest.mark.parametrize(
    ("answer", "status", "body"),
    [
        (
            b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nEVIL",
            204,
            b"",
        ),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEVIL", 200, b"ok"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok\x00garbage", 200, b"ok"),
        # the start of a second answer whose first bytes call no parser callback
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 2", 200, b"ok"),
        (b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 2", 204, b""),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokH",
            200,
            b"ok",
        ),
        (b"HTTP/1.1 204 No Content\r\ncontent-length: 4\r\n\r\nEVIL", 204, b""),
        (b"HTTP/1.1 304 Not Modified\r\ncontent-length: 4\r\n\r\nEVIL", 304, b""),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\nEVIL",
            200,
            b"ok",
        ),
    ],
)
async def test_bytes_beyond_the_answer_close_its_connection(
    answer: bytes, status: int, body: bytes
) -> None:
    """The complete answer is delivered; what follows it is dropped with the connection."""
    async with Upstream(writes(answer)) as up:
        client = pool()
        response, got = await get(client, up.base)
        assert (response.status, got, response.keep_alive) == (status, body, False)
        response, got = await get(client, up.base)
        assert (response.status, got) == (status, body)
        assert up.connections == 2
        await client.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 204 No Content\r\ncontent-length: 4\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\ncontent-length: 4\r\n\r\n",
    ],
)
async def test_bodiless_statuses_end_with_their_head_and_keep_the_connection(
    answer: bytes,
) -> None:
    """204 and 304 have no body whatever Content-Length says; the connection is reused."""
    async with Upstream(writes(answer)) as up:
        client = pool()
        for _ in range(2):
            response, got = await get(client, up.base)
            assert (got, response.content_length, response.keep_alive) == (b"", 0, True)
        assert up.connections == 1
        await client.close()


async def test_head_answer_with_a_body_closes_the_connection() -> None:
    """A body sent after the head of an answer to HEAD is not the next answer."""
    async with Upstream(writes(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nEVIL")) as up:
        client = pool()
        response = await client.request(up.base, "HEAD", b"/", [])
        assert (response.status, await response.read()) == (200, b"")
        response, got = await get(client, up.base)
        assert got == b"EVIL" and up.connections == 2
        await client.close()


async def test_bytes_on_an_idle_connection_close_it() -> None:
    """An unrequested late answer on an idle pooled connection never reaches a request."""
    transports: list[asyncio.Transport] = []

    def answer(head: bytes, transport: asyncio.Transport) -> None:
        transports.append(transport)
        ok(b"%d" % len(transports))(head, transport)

    async with Upstream(answer) as up:
        client = pool()
        _, body = await get(client, up.base)
        assert body == b"1"
        transports[0].write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nEVIL")
        await asyncio.sleep(0.05)  # the late bytes reach the idle connection
        _, body = await get(client, up.base)
        assert body == b"2" and up.connections == 2
        await client.close()


async def test_interim_answers_are_dropped() -> None:
    """100 Continue and 103 Early Hints are read and dropped before the final answer."""
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    )
    async with Upstream(writes(answer)) as up:
        client = pool()
        response, got = await get(client, up.base)
        assert (response.status, got, response.raw_headers) == (
            200,
            b"ok",
            [(b"content-length", b"2")],
        )
        assert response.keep_alive
        await client.close()


async def test_unasked_switching_protocols_is_an_error() -> None:
    """A 101 to a request that asked for no upgrade raises UpstreamError."""
    answer = (
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n"
    )
    async with Upstream(writes(answer + b"junk")) as up:
        client = pool()
        with pytest.raises(UpstreamError, match="101"):
            await client.request(up.base, "GET", b"/", [])
        await client.close()


async def test_unknown_status_is_delivered() -> None:
    """A status code without a name (999) is an answer like any other."""
    async with Upstream(writes(b"HTTP/1.1 999 Whatever\r\ncontent-length: 2\r\n\r\nok")) as up:
        client = pool()
        response, got = await get(client, up.base)
        assert (response.status, got) == (999, b"ok")
        await client.close()


@pytest.mark.parametrize(
    ("method", "answer", "reused"),
    [
        ("HEAD", b"HTTP/1.1 200 OK\r\n\r\n", True),  # no length: still the end of it
        ("GET", b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok", False),
        ("GET", b"HTTP/1.1 200 OK\r\nconnection: x, close\r\ncontent-length: 2\r\n\r\nok", False),
    ],
)
async def test_reuse_follows_the_answers_version_and_framing(
    method: str, answer: bytes, reused: bool
) -> None:
    """A connection is reused after an HTTP/1.1 answer whose end is known and that does
    not say close; never after an HTTP/1.0 answer."""
    async with Upstream(writes(answer)) as up:
        client = pool()
        for _ in range(2):
            response = await client.request(up.base, method, b"/", [])
            await response.read()
        assert up.connections == (1 if reused else 2)
        await client.close()


async def test_trailers_never_join_the_head() -> None:
    """A chunked answer's trailer fields are dropped, not added to its headers."""
    answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n\r\n"
    async with Upstream(writes(answer)) as up:
        client = pool()
        response, got = await get(client, up.base)
        assert got == b"ok" and response.raw_headers == [(b"transfer-encoding", b"chunked")]
        await client.close()


async def test_url_credentials_become_authorization_and_leave_host() -> None:
    """A base URL's userinfo is sent as Basic Authorization, in place of the caller's;
    Host is host:port alone."""
    async with Upstream(ok()) as up:
        client = pool()
        base = up.base.replace("http://", "http://al%20ice:p%3Aw@")
        response = await client.request(base, "GET", b"/", [(b"authorization", b"Bearer x")])
        await response.read()
        head = up.requests[0]
        port = up.base.rsplit(":", 1)[1]
        assert b"\r\nHost: 127.0.0.1:%s\r\n" % port.encode() in head
        assert b"Authorization: Basic YWwgaWNlOnA6dw==" in head  # "al ice:p:w"
        assert b"Bearer" not in head and b"ice" not in head
        await client.close()


class _SocketTransport:
    """Just enough of a transport for connection_made: the socket it carries."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self.sock if name == "socket" else default


@pytest.mark.parametrize("poll", [True, False], ids=["poll", "select"])
def test_an_idle_connection_with_unread_bytes_is_not_quiet(poll: bool) -> None:
    """Bytes the loop has not delivered yet (a late answer) make an idle connection
    unfit for reuse; read, it is quiet again; a closed peer is not quiet either (with
    its poll set, and with select where there is no poll)."""
    from stormguard.gateway._h1client import _Connection

    ours, theirs = socket.socketpair()
    try:
        pool = H1Pool(4, Timeout())
        conn = _Connection(pool, pool._endpoint("http://127.0.0.1:9"))
        conn.connection_made(_SocketTransport(ours))  # type: ignore[arg-type]
        assert (conn.poller is not None) is hasattr(select, "poll")
        if not poll:
            conn.poller = None
        assert conn.quiet()
        theirs.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nlate")
        assert not conn.quiet()
        ours.recv(4096)
        assert conn.quiet()
        theirs.close()
        assert not conn.quiet()  # EOF waits unread
    finally:
        ours.close()
