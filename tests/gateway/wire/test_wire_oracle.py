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


def ours(loop: asyncio.AbstractEventLoop, method: str, pieces: list[bytes]) -> Reading:
    pool = H1Pool(4, Timeout())
    pool.loop = loop
    pool._started = True
    endpoint = pool._endpoint(BASE)
    conn = _Connection(pool, endpoint)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    pool._all.add(conn)
    pool.open += 1
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
