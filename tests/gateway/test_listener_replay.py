"""The listener's replay of a head (gateway/http/_listener.py, ``_replay``): a read
that repeats, byte for byte and from between two messages, the last read that held
exactly one bodyless head is not parsed again. Whatever the reads, a listener that
replays must do exactly what one that parses every read does: the app sees the same
requests, the client gets the same bytes, the connection closes at the same point.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stormguard.gateway.http._listener import Listener, ListenerSettings

HEAD = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
KEYED = b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\n\r\n"
KEYED2 = KEYED.replace(b"k1", b"k22")
# two values that change per request (a request id, a trace context)
TRACED = b"GET /t HTTP/1.1\r\nX-Request-Id: %s\r\nHost: x\r\ntraceparent: %s\r\n\r\n"

# Requests a client may send: served, refused by the listener (400, 405, 431, 414),
# closing the connection, with a body, upgrading, in bare-LF lines, absolute-form.
VOCABULARY = [
    HEAD,
    KEYED,
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k2\r\n\r\n",
    b"GET /a/../b HTTP/1.1\r\nHost: x\r\n\r\n",
    b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /../x HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
    b"GET / HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.0\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
    b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    b"GET / HTTP/1.1\nHost: x\n\n",
    b"\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GARBAGE\r\n\r\n",
    b"GET http://x/abs HTTP/1.1\r\nHost: x\r\n\r\n",
    b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 300 + b"\r\n\r\n",
    b"GET /" + b"t" * 80 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: foo\r\nConnection: upgrade\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
    b"G",
    b"ET / HTTP/1.1\r\nHost: x\r\n\r\n",
    # values that may or may not be replayed into the kept head's slots
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k333\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k 1\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k\x01\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k\x80\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k2 \r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key:k2\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nx-key: k2\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: \r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: " + b"v" * 280 + b"\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\nX-Key: k2\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: y\r\nX-Key: k1\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\nContent-Length: 0\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\nContent-Length: 5\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\nConnection: close\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\nProxy-Connection: close\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nProxy-Connection: a\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nProxy-Connection: b\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nProxy-Connection: close\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nExpect: a\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nExpect: b\r\n\r\n",
    b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
    TRACED % (b"a1", b"t1"),
    TRACED % (b"a2", b"t2"),
    TRACED % (b"a333", b"t"),
    TRACED % (b"a1", b"t\r\nX-Evil: 1"),
    TRACED % (b"a1", b"t1\r\nHost: y"),
]

# Drawn more often: repeats (where replays happen) and the fragments of a head.
COMMON = [HEAD, KEYED, KEYED2, b"G", HEAD + b"G", b"ET / HTTP/1.1\r\nHost: x\r\n\r\n"]
# (and pairs that name a header the parser or the listener reads)
COMMON += [
    VOCABULARY[i]
    for i in range(len(VOCABULARY))
    if b"-Connection: " in VOCABULARY[i] or b"Expect: " in VOCABULARY[i]
]


class FakeTransport:
    """What the listener asks of a transport; it records what was written."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 40000)}.get(
            name, default
        )

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def _recording_app(seen: list[tuple[Any, ...]]) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append(
            (
                scope["method"],
                scope["path"],
                scope["raw_path"],
                scope["query_string"],
                scope["http_version"],
                list(scope["headers"]),
                body,
            )
        )
        reply = repr(seen[-1]).encode()
        headers = [(b"content-length", b"%d" % len(reply))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})

    return app


class Counting(Listener):
    """The listener as it is, counting its replays and what it fed the parser."""

    replays = 0
    fed = 0

    def _replay(self, *args: Any) -> None:
        type(self).replays += 1
        super()._replay(*args)

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if not isinstance(parser, _FeedCounter):
            self.parser = _FeedCounter(parser)  # type: ignore[assignment]
        super().data_received(data)


class _FeedCounter:
    # The parser, counting feed_data calls (a Cython object cannot be patched).
    def __init__(self, parser: Any) -> None:
        self._parser = parser

    def feed_data(self, data: bytes) -> None:
        Counting.fed += 1
        self._parser.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class Parsing(Listener):
    """A listener that parses every read: it never keeps a head for replay."""

    def _note(self, data: bytes, completed: int) -> None:
        self.at_boundary = False


async def _serve(cls: type[Listener], reads: list[bytes], max_headers: int = 8) -> tuple[Any, ...]:
    seen: list[tuple[Any, ...]] = []
    config = ListenerSettings(
        _recording_app(seen), max_header_bytes=300, max_headers=max_headers, max_target_bytes=64
    )
    proto = cls(config)
    transport = FakeTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    for data in reads:
        for _ in range(50):  # a paused transport delivers nothing until resumed
            if not transport.paused:
                break
            await asyncio.sleep(0)
        if transport.closed:
            break
        proto.data_received(data)
        for _ in range(10):
            await asyncio.sleep(0)
    for _ in range(20):
        await asyncio.sleep(0)
    config.outbox.flush()
    closed = transport.closed
    proto.connection_lost(None)
    if config.sweeper is not None:
        config.sweeper.cancel()
    return seen, bytes(transport.written), closed


@st.composite
def _reads(draw: st.DrawFn) -> list[bytes]:
    # Requests, mostly one per read (where replays happen), some run together or
    # cut at a random byte.
    drawn = st.one_of(st.sampled_from(COMMON), st.sampled_from(VOCABULARY))
    requests = draw(st.lists(drawn, min_size=1, max_size=8))
    reads: list[bytes] = []
    carry = b""
    for request in requests:
        how = draw(st.sampled_from(["whole", "whole", "whole", "join", "cut"]))
        data = carry + request
        carry = b""
        if how == "join":
            carry = data
        elif how == "cut" and len(data) > 1:
            at = draw(st.integers(1, len(data) - 1))
            reads.append(data[:at])
            carry = data[at:]
        else:
            reads.append(data)
    if carry:
        reads.append(carry)
    return reads


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reads=_reads())
def test_a_replaying_listener_does_what_a_parsing_one_does(reads: list[bytes]) -> None:
    """For any reads, the app sees the same requests, the client the same bytes."""
    replayed = asyncio.run(_serve(Listener, reads))
    parsed = asyncio.run(_serve(Parsing, reads))
    assert replayed == parsed


def test_the_same_head_again_is_parsed_once() -> None:
    """Three reads of one head: the parser is fed once, the app sees three requests,
    the client gets three answers; the one parsed and the two replayed alike."""
    Counting.replays = Counting.fed = 0
    seen, written, closed = asyncio.run(_serve(Counting, [KEYED, KEYED, KEYED]))
    assert (Counting.fed, Counting.replays) == (1, 2)
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2]
    assert seen[0][:5] == ("GET", "/a", b"/a", b"b=1", "1.1")
    assert written.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert not closed
    assert (seen, written, closed) == asyncio.run(_serve(Parsing, [KEYED, KEYED, KEYED]))


def test_a_head_that_differs_is_parsed() -> None:
    """A read with other bytes is parsed; the one kept is the last one parsed."""
    Counting.replays = Counting.fed = 0
    seen, _, _ = asyncio.run(_serve(Counting, [HEAD, KEYED, KEYED, HEAD]))
    assert (Counting.fed, Counting.replays) == (3, 1)
    assert [s[1] for s in seen] == ["/", "/a", "/a", "/"]


def test_after_a_fragment_the_same_bytes_are_parsed_as_what_they_are() -> None:
    """A read that left a fragment of the next head ("G"): the parser no longer
    stands between messages, so the same bytes again are parsed, as "GGET" (400),
    never replayed as the GET they were before."""
    Counting.replays = Counting.fed = 0
    seen, written, closed = asyncio.run(_serve(Counting, [HEAD, b"G", HEAD]))
    assert Counting.replays == 0
    assert len(seen) == 1
    assert written.count(b"HTTP/1.1 200 OK\r\n") == 1
    assert b"HTTP/1.1 400 " in written and closed


def test_a_head_split_across_reads_ends_replay_on_the_connection() -> None:
    """A head cut in two: where the parser stands is no longer known, so nothing is
    replayed from then on, not even a whole head seen before."""
    Counting.replays = Counting.fed = 0
    seen, _, _ = asyncio.run(_serve(Counting, [HEAD, HEAD[:10], HEAD[10:], HEAD, HEAD]))
    assert Counting.replays == 0
    assert len(seen) == 4


def test_a_head_refused_by_the_listener_is_refused_when_repeated() -> None:
    """A head the listener refuses is never kept: sent again, it is refused again
    (here the connection closed after the first refusal, as a parsed one does)."""
    bad = b"GET /../x HTTP/1.1\r\nHost: x\r\n\r\n"
    Counting.replays = Counting.fed = 0
    seen, written, closed = asyncio.run(_serve(Counting, [HEAD, bad, bad]))
    assert Counting.replays == 0
    assert len(seen) == 1 and closed
    assert written.count(b"HTTP/1.1 400 ") == 1


def test_a_connection_whose_heads_keep_changing_stops_keeping_them() -> None:
    """Every head different: after a few kept and never replayed, none is kept, and
    a repeat after that is parsed (and answered as ever)."""
    heads = [b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(8)]
    Counting.replays = Counting.fed = 0
    seen, _, _ = asyncio.run(_serve(Counting, [*heads, heads[-1]]))
    assert Counting.replays == 0
    assert len(seen) == 9
    Counting.replays = 0
    asyncio.run(_serve(Counting, [*heads[:3], heads[2]]))
    assert Counting.replays == 1


def test_a_read_with_a_fragment_after_its_head_is_not_kept() -> None:
    """A read that held a head and the start of the next ("G"): its bytes are not
    kept, so the same read again is parsed as what follows the fragment, "GGET"."""
    Counting.replays = Counting.fed = 0
    seen, written, closed = asyncio.run(_serve(Counting, [HEAD + b"G", HEAD + b"G"]))
    assert Counting.replays == 0
    assert len(seen) == 1 and closed
    assert b"HTTP/1.1 400 " in written


def test_heads_that_differ_in_a_value_are_replayed_with_it() -> None:
    """Heads that differ only in an API key: the first two are parsed, and the
    second's bytes around the key are its slot; the later ones are that head with
    their own key, which the app sees, as it does from a parsing listener."""
    keys = [b"k1", b"k22", b"k3", b"k4444", b"k5"]
    reads = [KEYED.replace(b"k1", key) for key in keys]
    Counting.replays = Counting.fed = 0
    served = asyncio.run(_serve(Counting, reads))
    assert (Counting.fed, Counting.replays) == (2, 3)
    assert [dict(s[5])[b"x-key"] for s in served[0]] == keys
    assert served == asyncio.run(_serve(Parsing, reads))


def test_two_values_that_change_per_request_are_replayed() -> None:
    """A request id and a trace context, new in every request, as SDKs send them."""
    reads = [TRACED % (b"id-%d" % i, b"00-%032d-01" % i) for i in range(6)]
    Counting.replays = Counting.fed = 0
    served = asyncio.run(_serve(Counting, reads))
    assert (Counting.fed, Counting.replays) == (2, 4)
    assert [dict(s[5])[b"x-request-id"] for s in served[0]] == [b"id-%d" % i for i in range(6)]
    assert served == asyncio.run(_serve(Parsing, reads))


def test_a_value_that_is_not_a_plain_token_is_parsed() -> None:
    """A value with a space, a control or a non-ASCII byte, or a line break that
    would start another header, is never put in a slot: the read is parsed."""
    for bad in (b"k 9", b"k\x01", b"k\xff", b"k9\r\nHost: y", b""):
        reads = [KEYED, KEYED2, KEYED.replace(b"k1", bad)]
        Counting.replays = Counting.fed = 0
        served = asyncio.run(_serve(Counting, reads))
        assert Counting.replays == 0, bad
        assert served == asyncio.run(_serve(Parsing, reads)), bad


def test_a_value_that_passes_the_head_cap_is_refused_as_parsed() -> None:
    """A value in a slot that makes the head's lines longer than max_header_bytes
    (as the cap counts them, "name: value" and CR LF each; here thirty "a:b" lines
    count a byte more than they take): 431, as the parser answers it, never served."""
    keyed = KEYED.replace(b"\r\n\r\n", b"\r\n" + b"a:b\r\n" * 30 + b"\r\n")
    reads = [keyed, keyed.replace(b"k1", b"k22"), keyed.replace(b"k1", b"v" * 100)]
    assert len(reads[2]) <= 300  # the read fits the cap (300); its lines do not
    Counting.replays = Counting.fed = 0
    served = asyncio.run(_serve(Counting, reads, max_headers=100))
    assert Counting.replays == 0
    assert b"HTTP/1.1 431 " in served[1] and len(served[0]) == 2
    assert served == asyncio.run(_serve(Parsing, reads, max_headers=100))


@pytest.mark.parametrize(
    ("name", "special"),
    [
        (b"Expect", b"100-continue"),
        (b"Proxy-Connection", b"close"),
        (b"Connection", b"close"),
        (b"Upgrade", b"websocket"),
        (b"Content-Length", b"0"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Host", b"y"),
    ],
)
def test_a_header_the_parser_or_listener_reads_is_never_a_slot(name: bytes, special: bytes) -> None:
    """Two heads that differ in the value of a header that changes how a head is
    parsed or served, then a third with the value that does: parsed, as it must be."""
    reads = [b"GET /s HTTP/1.1\r\nHost: x\r\n%s: %s\r\n\r\n" % (name, v) for v in (b"a", b"b")]
    reads[0] = reads[0].replace(b"Host: x\r\nHost", b"Host")  # (Host: once)
    reads[1] = reads[1].replace(b"Host: x\r\nHost", b"Host")
    reads.append(b"GET /s HTTP/1.1\r\nHost: x\r\n%s: %s\r\n\r\n" % (name, special))
    reads[2] = reads[2].replace(b"Host: x\r\nHost", b"Host")
    Counting.replays = Counting.fed = 0
    served = asyncio.run(_serve(Counting, reads))
    assert Counting.replays == 0
    assert served == asyncio.run(_serve(Parsing, reads))


def test_a_long_head_is_parsed_every_time() -> None:
    """A head longer than the replay's bound (4 KiB) is never kept: each read of it
    is parsed (a connection holds no more than that for replay)."""
    from stormguard.gateway.http import _listener

    long = KEYED.replace(b"X-Key: k1", b"X-Key: " + b"v" * _listener._REPLAY_MAX)
    reads = [long, long, long]

    async def serve(cls: type[Listener]) -> tuple[Any, ...]:
        seen: list[tuple[Any, ...]] = []
        config = ListenerSettings(_recording_app(seen))  # the default caps (32 KiB)
        proto = cls(config)
        transport = FakeTransport()
        proto.connection_made(transport)  # type: ignore[arg-type]
        for data in reads:
            proto.data_received(data)
            for _ in range(10):
                await asyncio.sleep(0)
        config.outbox.flush()
        proto.connection_lost(None)
        if config.sweeper is not None:
            config.sweeper.cancel()
        return seen, bytes(transport.written)

    Counting.replays = Counting.fed = 0
    seen, written = asyncio.run(serve(Counting))
    assert (Counting.fed, Counting.replays) == (3, 0)
    assert len(seen) == 3 and written.count(b"HTTP/1.1 200 OK") == 3
    short = [KEYED, KEYED]
    Counting.replays = 0
    asyncio.run(_serve(Counting, short))
    assert Counting.replays == 1
