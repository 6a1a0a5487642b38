"""The upstream client's framing against h11 as the oracle: random upstream answers
(valid and not: Content-Length, chunked, close-delimited, 1xx, 204/304, HEAD, bytes
beyond the answer), split at random points, fed to _Connection through a fake
transport; status, headers, body, where the answer ends and whether the connection
may be reused must agree with h11's reading of the same bytes."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import h11
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from stormguard.gateway._config import Timeout
from stormguard.gateway._h1client import H1Pool, H1Response, _Connection

BASE = "http://127.0.0.1:9"


class FakeTransport:
    """Records writes; close() only marks it closed (no connection_lost)."""

    def __init__(self) -> None:
        self.closed = False
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default  # no socket: the idle check has nothing to poll

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@dataclass
class Reading:
    """What one side made of the bytes."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    complete: bool = False
    reusable: bool = False


class Sink:
    def __init__(self) -> None:
        self.reading = Reading()
        self.error: BaseException | None = None

    def answer_head(self, response: H1Response) -> None:
        self.reading.status = response.status
        self.reading.headers = [(k.lower(), v) for k, v in response.raw_headers]

    def answer_body(self, chunk: bytes) -> None:
        self.reading.body += chunk

    def answer_end(self) -> None:
        self.reading.complete = True

    def answer_error(self, exc: BaseException) -> None:
        self.error = exc


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _open(
    loop: asyncio.AbstractEventLoop, kind: type[_Connection] = _Connection
) -> tuple[H1Pool, Any, _Connection, FakeTransport]:
    """A pool on ``loop`` with one open connection of ``kind`` on a fake transport."""
    pool = H1Pool(4, Timeout())
    pool.loop = loop
    pool._started = True
    endpoint = pool._endpoint(BASE)
    conn = kind(pool, endpoint)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    pool._all.add(conn)
    pool.open += 1
    return pool, endpoint, conn, transport


def ours(loop: asyncio.AbstractEventLoop, method: str, pieces: list[bytes]) -> Reading:
    pool, endpoint, conn, transport = _open(loop)
    sink = Sink()
    response = H1Response(conn, sink)
    conn.begin(response, method == "HEAD", 10.0, None)
    for piece in pieces:
        if transport.closed:  # a closed transport delivers nothing more
            break
        conn.data_received(piece)
    if not transport.closed and not sink.reading.complete and sink.error is None:
        conn.connection_lost(None)  # the upstream closes after its last byte
    reading = sink.reading
    if sink.error is not None:
        reading.complete = False
    reading.reusable = conn in endpoint.idle and not conn.closed and not transport.closed
    if pool._sweeper is not None:
        pool._sweeper.cancel()
    return reading


def oracle(method: str, data: bytes) -> Reading | None:
    """h11's reading; None when h11 finds the answer invalid."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method=method, target="/", headers=[("Host", "x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(data)
    reading = Reading()
    closed = False
    try:
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                if closed:
                    return None
                client.receive_data(b"")
                closed = True
            elif isinstance(event, h11.InformationalResponse):
                continue
            elif isinstance(event, h11.Response):
                reading.status = event.status_code
                reading.headers = list(event.headers)
            elif isinstance(event, h11.Data):
                reading.body += event.data
            elif isinstance(event, h11.EndOfMessage):
                reading.complete = True
                break
            else:  # ConnectionClosed (or PAUSED) before the end of the answer
                return None
    except h11.RemoteProtocolError:
        return None
    trailing, _ = client.trailing_data
    reading.reusable = (
        not closed
        and client.our_state is h11.DONE
        and client.their_state is h11.DONE
        and not trailing
    )
    return reading


# -- the answers --------------------------------------------------------------------------

TOKEN = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=8).map(str.encode)
VALUE = st.text("abcdefghijklmnopqrstuvwxyz0123456789 ;=/", max_size=12).map(
    lambda v: v.strip().encode()
)
HEADERS = st.lists(
    st.tuples(TOKEN, VALUE).filter(
        lambda h: (
            h[0]
            not in (b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"te")
        )
    ),
    max_size=3,
)
BODY = st.binary(max_size=40)
# Bytes beyond the answer (not CR/LF alone, which llhttp skips between answers).
EXTRA = st.one_of(
    st.just(b""),
    st.binary(min_size=1, max_size=20).filter(lambda b: bool(b.strip(b"\r\n"))),
    st.just(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nEVIL"),
    # the start of a second answer, cut short (a status line calls no callback)
    st.integers(1, 40).map(lambda n: b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nEVIL"[:n]),
)


def _head(version: bytes, status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
    lines = [b"HTTP/%s %d Reason" % (version, status)]
    lines += [name + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _chunked(body: bytes, cuts: list[int], trailer: bool) -> bytes:
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    out = b""
    for a, b in itertools.pairwise(points):
        if b > a:
            out += b"%x\r\n%s\r\n" % (b - a, body[a:b])
    return out + (b"0\r\nx-trailer: t\r\n\r\n" if trailer else b"0\r\n\r\n")


@st.composite
def answers(draw: st.DrawFn) -> tuple[str, bytes]:
    method = draw(st.sampled_from(["GET", "GET", "HEAD"]))
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    data = b""
    for status in draw(st.lists(st.sampled_from([100, 102, 103]), max_size=2)):
        data += _head(b"1.1", status, draw(HEADERS))
    status = draw(st.sampled_from([200, 201, 204, 299, 304, 404, 500, 999]))
    headers = draw(HEADERS)
    if draw(st.booleans()):
        headers.append((b"connection", draw(st.sampled_from([b"close", b"keep-alive"]))))
    body = draw(BODY)
    framing = draw(st.sampled_from(["length", "chunked", "close", "short", "long", "bad"]))
    bodiless = method == "HEAD" or status in (204, 304)
    if framing == "length":
        headers.append((b"content-length", b"%d" % len(body)))
        payload = b"" if bodiless else body
    elif framing == "chunked":
        headers.append((b"transfer-encoding", b"chunked"))
        cuts = draw(st.lists(st.integers(0, 40), max_size=4))
        payload = b"" if bodiless else _chunked(body, cuts, draw(st.booleans()))
    elif framing == "close":
        payload = b"" if bodiless else body
    elif framing == "short":  # a length the body never reaches (then the close)
        headers.append((b"content-length", b"%d" % (len(body) + 5)))
        payload = b"" if bodiless else body
    elif framing == "long":  # a body longer than its length
        headers.append((b"content-length", b"%d" % len(body)))
        payload = body + b"LONGER"
    else:  # malformed framing
        kind = draw(st.sampled_from(["two-lengths", "bad-chunk", "bad-length"]))
        if kind == "two-lengths":
            headers += [(b"content-length", b"1"), (b"content-length", b"2")]
            payload = b"xx"
        elif kind == "bad-chunk":
            headers.append((b"transfer-encoding", b"chunked"))
            payload = b"zz\r\n" + body
        else:
            headers.append((b"content-length", b"-1"))
            payload = body
    draw(st.permutations(headers))  # order matters to neither side; shuffled anyway
    data += _head(version, status, headers) + payload
    if framing != "close":
        data += draw(EXTRA)
    return method, data


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(answer=answers(), cuts=st.lists(st.integers(0, 400), max_size=6))
@example(
    ("GET", b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nE"), []
)
@example(("GET", b"HTTP/1.1 304 Not Modified\r\ncontent-length: 4\r\n\r\nEVIL"), [30])
@example(
    ("GET", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"), [3, 40]
)
@example(("HEAD", b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nEVIL"), [])
@example(("GET", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 2"), [])
# an answer to HEAD that says chunked, then chunk framing with no chunk data
@example(("HEAD", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0"), [])
@example(("HEAD", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"), [])
@example(("HEAD", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\n"), [])
@example(
    ("GET", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx: t\r\n\r\n"),
    [50],
)
def test_framing_agrees_with_h11(
    loop: asyncio.AbstractEventLoop, answer: tuple[str, bytes], cuts: list[int]
) -> None:
    """Where h11 reads a complete answer, the upstream client reads the same one and
    agrees on reuse; where h11 finds none, the client delivers no complete answer."""
    method, data = answer
    mine = ours(loop, method, _split(data, cuts))
    theirs = oracle(method, data)
    event("h11: no answer" if theirs is None else f"h11: reusable={theirs.reusable}")
    if theirs is None:
        assert not mine.complete, data
        return
    assert mine == theirs, data


# -- an answer read again: the replaying connection reads as one that parses ----------------


class Parsing(_Connection):
    """A connection that keeps no read: every answer goes through llhttp."""

    def _keep(self, data: bytes, response: H1Response) -> None:
        pass


class Counting(_Connection):
    """A connection that counts the answers it did not parse."""

    replays = 0

    def _replay(self, kept: Any) -> None:
        Counting.replays += 1
        super()._replay(kept)


def exchanges(
    loop: asyncio.AbstractEventLoop, kind: type[_Connection], script: list[tuple[str, list[bytes]]]
) -> list[tuple[Reading, bool]]:
    """Each exchange of ``script`` (method, reads) on one connection of ``kind``: what
    its sink read and whether the connection could be reused after it; the script
    ends where the connection does."""
    pool, endpoint, conn, transport = _open(loop, kind)
    seen = []
    for method, reads in script:
        sink = Sink()
        response = H1Response(conn, sink)
        if endpoint.idle:
            endpoint.idle.remove(conn)
        conn.begin(response, method == "HEAD", 10.0, None)
        for data in reads:
            if transport.closed:
                break
            conn.data_received(data)
        reading = sink.reading
        if sink.error is not None:
            reading.complete = False
        reusable = conn in endpoint.idle and not transport.closed
        seen.append((reading, reusable))
        if not reusable:
            break
    if pool._sweeper is not None:
        pool._sweeper.cancel()
    return seen


def _alike(date: int, body: bytes = b"hello", extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nserver: up\r\ndate: Mon, 07 Dec 2026 15:00:%02d GMT\r\n"
        b"content-length: %d\r\n%s\r\n%s" % (date, len(body), extra, body)
    )


# Answers an upstream sends again and again, and the ones that break the pattern.
REPEATED = st.sampled_from(
    [
        _alike(0),
        _alike(0),
        _alike(1),
        _alike(0, b""),
        _alike(0, b"other"),
        _alike(0, extra=b"x-extra: 1\r\n"),
        _alike(0) + b"\r\n",  # an empty line after it (llhttp skips it)
        _alike(0) + b"HTTP/1.1 2",  # the start of another answer
        _alike(0) + b"EVIL",
        _alike(0)[:-2],  # short: the rest comes in the next read (or never)
        b"lo",  # that rest alone, as if it were a whole answer
        b"hello",  # a body alone
        b"HTTP/1.1 100 Continue\r\n\r\n" + _alike(0),
        b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 500 Oops\r\ncontent-length: 2\r\n\r\nno",
    ]
)


@st.composite
def scripts(draw: st.DrawFn) -> list[tuple[str, list[bytes]]]:
    out = []
    for _ in range(draw(st.integers(1, 8))):
        method = draw(st.sampled_from(["GET", "GET", "GET", "HEAD"]))
        data = draw(REPEATED)
        cuts = draw(st.one_of(st.just([]), st.just([]), st.lists(st.integers(0, 120), max_size=2)))
        reads = _split(data, cuts)
        if data == _alike(0)[:-2]:
            reads.append(b"lo")  # the rest of it
        out.append((method, reads))
    return out


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=scripts())
@example([("GET", [_alike(0)]), ("GET", [_alike(0)]), ("HEAD", [_alike(0)])])
@example([("GET", [_alike(0)]), ("GET", [_alike(0) + b"HTTP/1.1 2"]), ("GET", [_alike(0)])])
@example([("GET", [_alike(0)[:-5], b"hello"]), ("GET", [b"hello"])])  # (a body alone)
def test_an_answer_read_again_reads_as_parsed(
    loop: asyncio.AbstractEventLoop, script: list[tuple[str, list[bytes]]]
) -> None:
    """Answers not parsed again (the same bytes as the last one kept) give each exchange
    the same status, fields, body, end and reuse as parsing every one."""
    replayed = exchanges(loop, Counting, script)
    parsed = exchanges(loop, Parsing, script)
    assert replayed == parsed


def test_the_same_answer_again_is_not_parsed_again(loop: asyncio.AbstractEventLoop) -> None:
    """The second and later copies of an answer kept are replayed; one that differs,
    or a first read that is not the whole answer, is parsed (and ends the replay)."""
    Counting.replays = 0
    same = [("GET", [_alike(0)])] * 4
    seen = exchanges(loop, Counting, same)
    assert Counting.replays == 3
    assert [(r.status, r.body, reusable) for r, reusable in seen] == [(200, b"hello", True)] * 4
    Counting.replays = 0
    split = _alike(0)
    mixed = [
        ("GET", [_alike(0)]),
        ("GET", [_alike(1)]),  # another Date: parsed, kept in its place
        ("GET", [_alike(1)]),  # replayed
        ("GET", [split[:10], split[10:]]),  # cut in two: parsed, nothing kept
        ("GET", [_alike(0)]),  # parsed (nothing was kept), kept
        ("HEAD", [_alike(0)[: -len(b"hello")]]),  # a HEAD's answer: never from a GET's
        ("GET", [_alike(0)]),
    ]
    seen = exchanges(loop, Counting, mixed)
    assert len(seen) == len(mixed) and all(reusable for _, reusable in seen)
    assert Counting.replays == 1
    assert seen[5][0].body == b"" and seen[6][0].body == b"hello"
