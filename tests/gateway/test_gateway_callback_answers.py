"""The callback path's answers, byte for byte (chain.Exchange, _wire.response_head).

The gateway's own protocol and upstream connection run in this process over
transports that record what is written: a request goes in as the client's bytes,
the upstream's answer comes back as canned bytes, and the test reads what the
client would receive. No socket, so every answer shape an upstream may send can
be played exactly, and each request is known to take the callback path (a
request the callback path declines would reach no upstream connection here).
What the callback path holds for the end of a loop pass (the listener's outbox)
is flushed before the test reads, as the loop's next turn would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stormguard.gateway._app import Gateway
from stormguard.gateway._clients import ClientIdentity
from stormguard.gateway._config import load_config
from stormguard.gateway._h1client import _Connection
from stormguard.gateway._wire import response_head
from stormguard.gateway.http._listener import Listener, ListenerSettings


class _Transport:
    """Records writes; closing is remembered."""

    def __init__(self, peer: tuple[str, int]) -> None:
        self.peer = peer
        self.out: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peer, "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def take(self) -> bytes:
        data, self.out = b"".join(self.out), []
        return data


class _Bench:
    """One gateway, one client connection, one warm upstream connection."""

    def __init__(self, gateway: Gateway, proto: Any, client: _Transport, conn: _Connection):
        self.gateway, self.proto, self.client, self.conn = gateway, proto, client, conn

    def request(self, raw: bytes) -> bytes:
        """The client sends ``raw``; what the upstream received (b"" if nothing)."""
        self.proto.data_received(raw)
        self.proto.outbox.flush()
        upstream = self.conn.transport
        assert isinstance(upstream, _Transport)
        return upstream.take()

    def answer(self, *pieces: bytes) -> bytes:
        """The upstream answers with ``pieces`` (one read each); what the client got."""
        for piece in pieces:
            self.conn.data_received(piece)
        self.proto.outbox.flush()
        return self.client.take()


@pytest.fixture
async def bench(tmp_path: Path) -> AsyncIterator[Any]:
    async def make(
        limits: dict[str, Any] | None = None, store: str = "memory", warm: bool = True
    ) -> _Bench:
        config: dict[str, Any] = {
            "store": store,
            "listen": {"http": "127.0.0.1:1", "admin": "127.0.0.1:2"},
            "access_log": False,
            "upstreams": {"a": {"url": "http://127.0.0.1:9"}},
            "routes": [{"path": "/", "upstream": "a", "limits": list(limits or {})}],
        }
        if limits:
            config["limits"] = limits
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        gateway = Gateway(load_config(path))
        made.append(gateway)
        proto = Listener(ListenerSettings(gateway, header_timeout=10.0, websocket_max_size=1 << 20))
        client = _Transport(("10.1.2.3", 40000))
        proto.connection_made(client)
        pool = gateway.runtime.upstreams["a"]
        h1 = pool.client
        h1._started = True
        h1.loop = asyncio.get_running_loop()
        base = pool.targets[0].base
        conn = _Connection(h1, h1._endpoint(base))
        conn.connection_made(_Transport(("127.0.0.1", 9)))  # type: ignore[arg-type]
        if warm:
            h1._all.add(conn)
            h1.open += 1
            conn.endpoint.idle.append(conn)
        return _Bench(gateway, proto, client, conn)

    made: list[Gateway] = []
    yield make
    for gateway in made:
        await gateway.stop()


GET = b"GET /items?page=2 HTTP/1.1\r\nHost: api.example\r\nAccept: */*\r\n\r\n"
OK = (
    b"HTTP/1.1 200 OK\r\nServer: up\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 2\r\nConnection: keep-alive\r\n\r\nok"
)


def _head_and_body(answer: bytes) -> tuple[list[bytes], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n"), body


async def test_a_plain_answer_is_one_write_with_via_and_no_hop_by_hop_header(bench: Any) -> None:
    b = await bench()
    sent = b.request(GET)
    assert sent.startswith(b"GET /items?page=2 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n")
    assert b"X-Forwarded-For: 10.1.2.3\r\n" in sent and b"X-Forwarded-Host: api.example\r\n" in sent
    b.conn.data_received(OK)
    b.proto.outbox.flush()
    assert len(b.client.out) == 1  # head and body in one write
    lines, body = _head_and_body(b.client.take())
    assert lines == [
        b"HTTP/1.1 200 OK",
        b"server: up",
        b"content-type: text/plain",
        b"content-length: 2",
        b"via: 1.1 stormguard",
    ]
    assert body == b"ok"
    assert b.proto.cycle.response_complete and not b.client.closed
    assert b.conn in b.conn.endpoint.idle  # the upstream connection is reusable


@pytest.mark.parametrize("more", [b"", b"Keep-Alive: timeout=5\r\n"])
async def test_headers_the_connection_header_names_are_dropped(bench: Any, more: bytes) -> None:
    b = await bench()
    b.request(GET)
    answer = b.answer(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nX-Hop: secret\r\n"
        + more
        + b"Content-Length: 0\r\n\r\n"
    )
    lines, body = _head_and_body(answer)
    assert lines == [b"HTTP/1.1 200 OK", b"content-length: 0", b"via: 1.1 stormguard"]
    assert body == b""


async def test_the_upstreams_via_is_extended(bench: Any) -> None:
    b = await bench()
    b.request(GET)
    answer = b.answer(b"HTTP/1.1 200 OK\r\nVia: 1.0 cache\r\nContent-Length: 0\r\n\r\n")
    lines, _ = _head_and_body(answer)
    assert lines == [b"HTTP/1.1 200 OK", b"content-length: 0", b"via: 1.0 cache, 1.1 stormguard"]


async def test_a_chunked_answer_is_streamed_and_framed_again(bench: Any) -> None:
    b = await bench()
    b.request(GET)
    first = b.answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n")
    lines, body = _head_and_body(first)
    assert b"transfer-encoding: chunked" in lines and body == b"4\r\nabcd\r\n"
    assert not b.proto.cycle.response_complete
    assert b.answer(b"2\r\nef\r\n0\r\n\r\n") == b"2\r\nef\r\n0\r\n\r\n"
    assert b.proto.cycle.response_complete


async def test_an_answer_ending_with_its_connection_reaches_the_client_chunked(
    bench: Any,
) -> None:
    b = await bench()
    b.request(GET)
    first = b.answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil-", b"eof")
    b.conn.connection_lost(None)  # the upstream closes: the answer is complete
    b.proto.outbox.flush()
    lines, body = _head_and_body(first + b.client.take())
    assert b"transfer-encoding: chunked" in lines
    assert body == b"6\r\nuntil-\r\n3\r\neof\r\n0\r\n\r\n"
    assert b.proto.cycle.response_complete and not b.client.closed
    assert b.conn not in b.conn.endpoint.idle


@pytest.mark.parametrize("status", [204, 304])
async def test_a_bodyless_status_gets_neither_length_nor_chunking(bench: Any, status: int) -> None:
    b = await bench()
    b.request(GET)
    answer = b.answer(b'HTTP/1.1 %d Whatever\r\nETag: "v1"\r\n\r\n' % status)
    lines, body = _head_and_body(answer)
    assert lines[0].startswith(b"HTTP/1.1 %d " % status)
    assert not any(line.startswith((b"transfer-encoding", b"content-length")) for line in lines)
    assert body == b"" and b.proto.cycle.response_complete


async def test_head_keeps_the_upstream_length_and_sends_no_body(bench: Any) -> None:
    b = await bench()
    b.request(b"HEAD /big HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n")
    lines, body = _head_and_body(answer)
    assert b"content-length: 5000" in lines and body == b""
    assert b.proto.cycle.response_complete


async def test_an_unlisted_status_gets_a_status_line(bench: Any) -> None:
    """A status without a name gets its class's reason phrase (RFC 9110 section 15)."""
    b = await bench()
    b.request(GET)
    lines, _ = _head_and_body(b.answer(b"HTTP/1.1 299 Custom\r\nContent-Length: 0\r\n\r\n"))
    assert lines[0] == b"HTTP/1.1 299 Successful"  # the class's generic reason phrase


async def test_a_client_asking_to_close_is_answered_and_closed(bench: Any) -> None:
    b = await bench()
    b.request(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    lines, body = _head_and_body(b.answer(OK))
    assert lines[-1] == b"connection: close" and body == b"ok"
    assert b.client.closed


async def test_a_large_answer_streams_as_it_arrives(bench: Any) -> None:
    b = await bench()
    b.request(GET)
    size = 200_000
    first = b.answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * 1000)
    lines, body = _head_and_body(first)
    assert b"content-length: %d" % size in lines and body == b"x" * 1000
    rest = b.answer(b"y" * (size - 1000))
    assert rest == b"y" * (size - 1000) and b.proto.cycle.response_complete


async def test_the_request_and_a_small_answer_go_out_at_the_loops_next_turn(bench: Any) -> None:
    """The callback path's writes wait for the rest of the loop pass, no longer."""
    b = await bench()
    upstream = b.conn.transport
    assert isinstance(upstream, _Transport)
    b.proto.data_received(GET)
    assert upstream.out == []  # held for the pass's other callbacks
    await asyncio.sleep(0)
    assert upstream.take().startswith(b"GET /items?page=2 HTTP/1.1\r\n")
    b.conn.data_received(OK)
    assert b.client.out == [] and b.proto.cycle.response_complete
    await asyncio.sleep(0)
    assert b.client.take().endswith(b"\r\n\r\nok")


async def test_a_streamed_answer_pauses_the_upstream_while_the_client_cannot_take_more(
    bench: Any,
) -> None:
    """Back-pressure: a streamed body goes out at once; while the client's transport is
    over its high-water mark the upstream connection is not read, after it is again."""
    b = await bench()
    b.request(GET)
    size = 1_000_000
    b.conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * 1000)
    assert b.client.out and not b.conn.paused  # written at once, not held
    b.proto.pause_writing()  # the client reads slower than the upstream writes
    b.conn.data_received(b"x" * 100_000)
    assert b.conn.paused
    b.proto.resume_writing()
    assert not b.conn.paused
    b.conn.data_received(b"x" * (size - 101_000))
    _, body = _head_and_body(b.client.take())
    assert body == b"x" * size and b.proto.cycle.response_complete
    assert b.conn in b.conn.endpoint.idle


async def test_a_bad_request_after_a_refusal_is_answered_after_it(bench: Any) -> None:
    """The listener's own 400 on the connection goes out after the refusal held before it."""
    b = await bench({"one": {"algorithm": "token_bucket", "rate": 0.001, "burst": 1}})
    assert b.request(GET)
    b.answer(OK)
    b.proto.data_received(GET + b"NOT HTTP\r\n\r\n")  # refused, then unparseable
    answers = b.client.take()
    assert answers.startswith(b"HTTP/1.1 429 ")
    assert answers.index(b"HTTP/1.1 400 ") > answers.index(b"HTTP/1.1 429 ")
    assert b.client.closed


async def test_a_websocket_upgrade_after_a_refusal_finds_it_sent(
    bench: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The WebSocket protocol writes the connection directly: what the pass held
    for it (a refusal) has gone out before the protocol takes over."""
    b = await bench({"one": {"algorithm": "token_bucket", "rate": 0.001, "burst": 1}})
    assert b.request(GET)
    b.answer(OK)
    found: list[bytes] = []
    monkeypatch.setattr(Listener, "_hand_off", lambda self, leftover: found.append(b.client.take()))
    upgrade = (
        b"GET /ws HTTP/1.1\r\nHost: api.example\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n"
    )
    b.proto.data_received(GET + upgrade)  # refused (held), then an upgrade
    assert len(found) == 1 and found[0].startswith(b"HTTP/1.1 429 ")


async def test_a_limited_request_is_refused_without_reaching_the_upstream(bench: Any) -> None:
    b = await bench({"one": {"algorithm": "token_bucket", "rate": 0.001, "burst": 1}})
    assert b.request(GET)  # the first one passes
    assert b.answer(OK).endswith(b"ok")
    assert b.request(GET) == b""  # the second one never reaches the upstream
    lines, body = _head_and_body(b.client.take())
    assert lines[0] == b"HTTP/1.1 429 Too Many Requests"
    assert any(line.startswith(b"retry-after: ") for line in lines)
    assert f"content-length: {len(body)}".encode() in lines
    assert not any(line.startswith(b"via") for line in lines)
    assert b.proto.cycle.response_complete and not b.client.closed
    assert b.conn in b.conn.endpoint.idle  # the connection it did not use is idle again


async def test_an_upstream_that_drops_a_small_answer_midway_gets_502(bench: Any) -> None:
    """A small answer is held whole: cut before any of it went out, the client gets 502."""
    b = await bench()
    b.request(GET)
    assert b.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc") == b""
    b.conn.connection_lost(None)
    b.proto.outbox.flush()
    answer = b.client.take()
    assert answer.startswith(b"HTTP/1.1 502 ") and b"abc" not in answer


async def test_an_upstream_that_drops_a_streamed_answer_midway_cuts_the_client(
    bench: Any,
) -> None:
    """A streamed answer that has started cannot be finished: the client sees it cut."""
    b = await bench()
    b.request(GET)
    got = b.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nabc")
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"abc")
    b.conn.connection_lost(None)
    assert b.client.closed


async def test_a_second_answer_in_the_same_read_is_never_forwarded(bench: Any) -> None:
    """204 then an unrequested 200 in one read: the client gets the 204 alone and the
    upstream connection is closed."""
    b = await bench()
    b.request(GET)
    got = b.answer(
        b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nEVIL-ANSWER"
    )
    assert got.startswith(b"HTTP/1.1 204 ") and b"EVIL" not in got
    assert b.conn.closed


@pytest.mark.parametrize(
    ("status", "line"),
    [(999, b"HTTP/1.1 999 Unknown\r\n"), (599, b"HTTP/1.1 599 Server Error\r\n")],
)
async def test_an_unknown_status_is_rendered_with_a_generic_reason_phrase(
    bench: Any, status: int, line: bytes
) -> None:
    """A status without a name is forwarded with its class's reason phrase."""
    b = await bench()
    b.request(GET)
    got = b.answer(b"HTTP/1.1 %d Odd\r\nContent-Length: 2\r\n\r\nok" % status)
    assert got.startswith(line) and got.endswith(b"\r\n\r\nok")


def test_response_head_renders_defaults_connection_close_and_chunking() -> None:
    raw = [(b"Content-Length", b"9"), (b"X-A", b"1")]
    head = response_head(200, raw, [(b"Date", b"today")], False, True)
    assert head == (
        b"HTTP/1.1 200 OK\r\ndate: today\r\nx-a: 1\r\nvia: 1.1 stormguard\r\n"
        b"connection: close\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    own = response_head(503, [(b"Retry-After", b"2")], (), True, False, via=False)
    assert own == b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 2\r\n\r\n"


async def test_a_connections_client_is_named_once_when_only_its_address_can_name_it(
    bench: Any,
) -> None:
    """With clients keyed by ip alone, the client of a connection is looked up once;
    a reload (a new identity) looks it up again."""
    b = await bench(
        {
            "pc": {"algorithm": "token_bucket", "rate": 1, "burst": 9, "per": "client"},
            "all": {"algorithm": "sliding_window", "limit": 99, "window": 1, "per": "global"},
        }
    )
    assert b.proto.client_known is None
    b.request(GET)
    b.answer(OK)
    identity, rule, key, _, _, _ = b.proto.client_known
    assert identity is b.gateway.runtime.identity and (rule, key) == ("ip", "ip:10.1.2.3")
    b.proto.client_known = (object(), "ip", "ip:stale", "00000000", None, [])  # another config's
    b.request(GET)
    b.answer(OK)
    assert b.proto.client_known[2] == "ip:10.1.2.3"
    store = b.gateway.runtime.store
    assert [k for k in store._data if "stale" in k] == []  # limits charged the real client
    rules, _ = b.proto.limits_known  # and the hit of its limit keys is kept for the route
    assert rules is b.gateway.runtime.routes[0].rules
    b.request(GET)
    b.answer(OK)
    assert sorted(k.split("\x00")[1] for k in store._data) == ["fn:ip:10.1.2.3", "global"]


async def test_kept_limit_keys_still_refuse_at_the_limit(bench: Any) -> None:
    """Requests after the first decide on the kept keys: the quota still runs out."""
    b = await bench(
        {
            "three": {"algorithm": "sliding_window", "limit": 3, "window": 60},
            "all": {"algorithm": "token_bucket", "rate": 1, "burst": 99, "per": "global"},
        }
    )
    answers = []
    for _ in range(5):
        if b.request(GET):
            answers.append(b.answer(OK).split(b"\r\n")[0])
        else:
            answers.append(b.client.take().split(b"\r\n")[0])
    assert answers == [b"HTTP/1.1 200 OK"] * 3 + [b"HTTP/1.1 429 Too Many Requests"] * 2
    assert b.proto.limits_known is not None


@pytest.mark.parametrize(
    ("rules", "proxies", "once"),
    [
        (["ip"], [], True),
        (["header:x-api-key", "ip"], [], False),  # the header may differ per request
        (["ip"], ["10.0.0.0/8"], False),  # forwarded addresses may differ per request
    ],
)
def test_only_address_keyed_clients_are_named_per_connection(
    rules: list[str], proxies: list[str], once: bool
) -> None:
    assert ClientIdentity(rules, proxies).per_connection is once


# -- the awaited path: limits in Redis, the breaker shared through it ------------------

LIMITS = {
    "pc": {"algorithm": "token_bucket", "rate": 0.001, "burst": 2, "per": "client"},
    "all": {"algorithm": "sliding_window", "limit": 99, "window": 60, "per": "global"},
}


async def _settled(b: _Bench) -> bytes:
    """Let the exchange's task run until it sent upstream or answered the client."""
    upstream = b.conn.transport
    assert isinstance(upstream, _Transport)
    for _ in range(2000):
        if upstream.out or b.client.out:
            return upstream.take()
        await asyncio.sleep(0.001)
    raise AssertionError("the awaited exchange neither sent nor answered")


@pytest.mark.redis
async def test_redis_limits_are_awaited_then_the_answer_is_relayed(
    bench: Any, owned_redis: Any
) -> None:
    b = await bench(LIMITS, store=owned_redis.url)
    for _ in range(2):
        b.proto.data_received(GET)
        sent = await _settled(b)
        assert sent.startswith(b"GET /items?page=2 HTTP/1.1\r\n")
        lines, body = _head_and_body(b.answer(OK))
        assert lines[0] == b"HTTP/1.1 200 OK" and body == b"ok"
    b.proto.data_received(GET)
    assert await _settled(b) == b""  # the third is over the client's burst of 2
    lines, _ = _head_and_body(b.client.take())
    assert lines[0] == b"HTTP/1.1 429 Too Many Requests"
    assert b.gateway.runtime.upstreams["a"].in_flight == 0


@pytest.mark.redis
async def test_a_client_gone_while_its_limits_are_asked_sends_nothing(
    bench: Any, owned_redis: Any
) -> None:
    b = await bench(LIMITS, store=owned_redis.url)
    b.proto.data_received(GET)
    b.proto.connection_lost(None)  # before the store answered
    for _ in range(200):
        await asyncio.sleep(0.001)
    upstream = b.conn.transport
    assert isinstance(upstream, _Transport) and upstream.out == []
    pool = b.gateway.runtime.upstreams["a"]
    assert pool.in_flight == 0
    assert pool.bulkhead is None or pool.bulkhead.in_flight == 0
    assert b.proto.cycle.outcome == "client_gone"


@pytest.mark.redis
async def test_an_unreachable_upstream_after_the_await_is_a_502(
    bench: Any, owned_redis: Any
) -> None:
    b = await bench(LIMITS, store=owned_redis.url, warm=False)  # it must connect: nothing idle
    b.proto.data_received(GET)
    for _ in range(3000):
        if b.client.out:
            break
        await asyncio.sleep(0.001)
    lines, _ = _head_and_body(b.client.take())
    assert lines[0] == b"HTTP/1.1 502 Bad Gateway"
    assert b.gateway.runtime.upstreams["a"].in_flight == 0


async def test_each_request_on_a_connection_carries_its_own_headers(bench: Any) -> None:
    """The header lines kept from a connection's last request go out only for the same
    headers and method: changed headers or another method are rendered afresh."""
    b = await bench()
    first = b.request(GET)
    b.answer(OK)
    other = b.request(GET.replace(b"Accept: */*", b"Accept: text/html"))
    b.answer(OK)
    again = b.request(GET)
    b.answer(OK)
    options = b.request(GET.replace(b"GET ", b"OPTIONS ", 1))
    b.answer(OK)
    assert b"accept: */*\r\n" in first and b"text/html" not in first
    assert b"accept: text/html\r\n" in other and b"*/*" not in other
    assert again == first
    assert options == first.replace(b"GET ", b"OPTIONS ", 1)


async def test_a_reload_of_the_trusted_proxies_changes_the_forwarded_chain(
    bench: Any, tmp_path: Path
) -> None:
    """The kept header lines belong to the identity rules they were made with: after
    a reload that trusts the peer, its X-Forwarded-For chain is kept."""
    b = await bench()
    forwarded = GET.replace(b"Accept", b"X-Forwarded-For: 192.0.2.7\r\nAccept")
    assert b"X-Forwarded-For: 10.1.2.3\r\n" in b.request(forwarded)
    b.answer(OK)
    config = yaml.safe_load((tmp_path / "gateway.yaml").read_text())
    config["clients"] = {"key": ["ip"], "trusted_proxies": ["10.0.0.0/8"]}
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    b.gateway.swap(load_config(tmp_path / "gateway.yaml"))
    assert b"X-Forwarded-For: 192.0.2.7, 10.1.2.3\r\n" in b.request(forwarded)
    b.answer(OK)


async def test_each_answer_on_a_connection_gets_its_own_head(bench: Any) -> None:
    """The head kept from a connection's last answer goes out only for the same
    status and headers: another status or a changed header is rendered afresh."""
    b = await bench()
    heads = []
    for answer in (
        OK,
        OK,
        OK.replace(b"Server: up", b"Server: up2"),
        OK.replace(b"200 OK", b"201 Created"),
        OK,
    ):
        b.request(GET)
        heads.append(_head_and_body(b.answer(answer))[0])
    assert heads[0] == heads[1] == heads[4]
    assert heads[2] == [line.replace(b"server: up", b"server: up2") for line in heads[0]]
    assert heads[3] == [b"HTTP/1.1 201 Created", *heads[0][1:]]
    b.request(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    lines, _ = _head_and_body(b.answer(OK))
    assert lines == [*heads[0], b"connection: close"]  # the client's connection ends


async def test_a_request_target_seen_again_reads_alike(bench: Any) -> None:
    """A target parsed before gives the same scope path (percent-decoded), raw path and
    query; the table of targets is cleared when full, not grown."""
    from stormguard.gateway.http import _listener

    b = await bench()
    request = b"GET /items%20x?page=2 HTTP/1.1\r\nHost: x\r\n\r\n"
    sent = []
    for _ in range(2):
        sent.append(b.request(request))
        scope = b.proto.scope
        assert (scope["path"], scope["raw_path"], scope["query_string"]) == (
            "/items x",
            b"/items%20x",
            b"page=2",
        )
        b.answer(OK)
    assert sent[0] == sent[1] and sent[0].startswith(b"GET /items%20x?page=2 HTTP/1.1\r\n")
    _listener._TARGETS.update({b"/%d" % i: ("", b"", b"") for i in range(_listener._MAX_TARGETS)})
    b.request(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
    assert list(_listener._TARGETS) == [b"/other"]


class _LoopClock:
    """The running loop with a loop time the test sets (what the upstream pool reads)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, now: float) -> None:
        self.loop, self.now = loop, now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loop, name)


async def test_a_read_that_leaves_the_answer_due_restarts_the_silence(bench: Any) -> None:
    """The read timeout counts silence from the last read of an answer still due; the
    read that completes it takes the connection off the watch."""
    b = await bench()
    h1 = b.conn.pool
    clock = h1.loop = _LoopClock(asyncio.get_running_loop(), 100.0)
    b.request(GET)
    assert b.conn.last_read == 100.0 and b.conn in h1.busy
    clock.now = 103.0
    b.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
    assert b.conn.last_read == 103.0 and b.conn in h1.busy
    b.conn.check_timeout(107.5, 6.0)  # silent 4.5 s since the last read: not 6
    assert not b.conn.closed
    clock.now = 104.0
    assert b.answer(b"cd").endswith(b"abcd")
    assert b.conn not in h1.busy and b.conn in b.conn.endpoint.idle
