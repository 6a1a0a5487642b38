"""The listener's request rules on the wire, through real gateway processes.

Every case runs against two gateways: one whose requests take the callback path
(``callback``), and one whose upstream retries, so that every request takes the
ASGI path (``asgi``). The client sends exact bytes (rawclient.py); where a request
is forwarded, the upstream's ``/echo`` says what it received.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from rawclient import Connection, Processes, exchange, rss_kib

pytestmark = pytest.mark.slow


@dataclass
class Front:
    """One gateway under test: its port, process and which path it exercises."""

    port: int
    pid: int
    path: str


def _config(upstream: int, *, asgi: bool) -> dict[str, Any]:
    url = f"http://127.0.0.1:{upstream}"
    upstream_settings: dict[str, Any] = {"url": url}
    if asgi:  # a retrying upstream: every request on the ASGI path
        upstream_settings["retries"] = {"attempts": 2}
    return {
        "access_log": False,
        "header_timeout": 1.0,
        "upstreams": {"a": upstream_settings},
        "limits": {
            "login": {"algorithm": "token_bucket", "rate": 0.001, "burst": 3},
            "counted": {"algorithm": "token_bucket", "rate": 0.001, "burst": 3},
        },
        "routes": [
            {"path": "/login", "upstream": "a", "limits": ["login"]},
            {"path": "/echo/counted", "upstream": "a", "limits": ["counted"]},
            {"path": "/echo/trace", "upstream": "a", "methods": ["GET", "TRACE"]},
            {"path": "/", "upstream": "a"},
        ],
    }


@pytest.fixture(scope="module")
def processes(
    tmp_path_factory: pytest.TempPathFactory, gateway_driver: str
) -> Iterator[dict[str, Front]]:
    procs = Processes(tmp_path_factory.mktemp("wire"))
    try:
        upstream = procs.upstream()
        fronts = {}
        for path in ("callback", "asgi"):
            port, proc = procs.gateway(_config(upstream, asgi=path == "asgi"), path)
            fronts[path] = Front(port, proc.pid, path)
        yield fronts
    finally:
        procs.stop()


@pytest.fixture(params=["callback", "asgi"])
def gw(request: pytest.FixtureRequest, processes: dict[str, Front]) -> Front:
    """Each gateway in turn."""
    return processes[request.param]


def _get(target: bytes, *extra: bytes, version: bytes = b"1.1", host: bytes = b"x") -> bytes:
    lines = [b"GET " + target + b" HTTP/" + version]
    if host:
        lines.append(b"Host: " + host)
    lines += extra
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _names(seen: dict[str, Any]) -> set[str]:
    """The header names the upstream received, lower-cased."""
    return {name.lower() for name in seen["headers"]}


def _refused(gw: Front, raw: bytes, status: int) -> None:
    with Connection(gw.port) as conn:
        conn.send(raw)
        answer = conn.answer()
        assert answer.status == status, answer.raw
        assert answer.header(b"connection") == b"close"
        assert conn.closed()


# -- framing ---------------------------------------------------------------------------


def test_a_plain_get_is_forwarded(gw: Front) -> None:
    """A GET reaches the upstream with its method and path, and is answered 200."""
    answer = exchange(gw.port, _get(b"/echo?a=1"))
    assert answer.status == 200
    seen = answer.json()
    assert (seen["method"], seen["path"]) == ("GET", "/echo?a=1")


def test_head_is_answered_without_a_body(gw: Front) -> None:
    """HEAD: the upstream's head, no body bytes."""
    with Connection(gw.port) as conn:
        conn.send(b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n" + _get(b"/echo?after"))
        assert conn.answer(head=True).status == 200
        after = conn.answer()  # the next answer starts right after the head
        assert after.json()["path"] == "/echo?after"


def test_a_content_length_body_is_forwarded(gw: Front) -> None:
    """A POST body framed by Content-Length reaches the upstream whole."""
    raw = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    seen = exchange(gw.port, raw).json()
    assert (seen["method"], seen["size"]) == ("POST", 5)


@pytest.mark.parametrize(
    ("framing", "body", "size"),
    [
        (b"Content-Length: 5\r\n", b"hello", 5),
        (b"Transfer-Encoding: chunked\r\n", b"3\r\nabc\r\n0\r\n\r\n", 3),
        (b"Content-Length: 0\r\n", b"", 0),
    ],
)
@pytest.mark.parametrize("method", [b"GET", b"DELETE"])
def test_a_body_on_a_bodyless_method_is_forwarded(
    gw: Front, method: bytes, framing: bytes, body: bytes, size: int
) -> None:
    """A GET or DELETE whose head announces a body is served with that body (the
    listener hands only heads without one to the callback path), and the request
    behind it on the connection is answered after it."""
    with Connection(gw.port) as conn:
        conn.send(b"%s /echo HTTP/1.1\r\nHost: x\r\n%s\r\n%s" % (method, framing, body))
        conn.send(_get(b"/echo?after"))
        seen = conn.answer().json()
        assert (seen["method"], seen["size"]) == (method.decode(), size)
        assert conn.answer().json()["path"] == "/echo?after"


def test_a_chunked_body_is_forwarded(gw: Front) -> None:
    """A chunked request body is decoded and reaches the upstream whole."""
    raw = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
    )
    seen = exchange(gw.port, raw).json()
    assert seen["size"] == 7


def test_a_streamed_answer_is_chunked(gw: Front) -> None:
    """An answer of unknown length reaches the client chunked, every chunk in order."""
    answer = exchange(gw.port, _get(b"/stream?n=3"))
    assert answer.header(b"transfer-encoding") == b"chunked"
    assert answer.body == b"chunk0\nchunk1\nchunk2\n"


def test_http_1_0_is_answered_and_closed(gw: Front) -> None:
    """HTTP/1.0: answered, then the connection is closed."""
    with Connection(gw.port) as conn:
        conn.send(_get(b"/echo", version=b"1.0"))
        assert conn.answer().status == 200
        assert conn.closed()


def test_http_1_0_needs_no_host(gw: Front) -> None:
    """HTTP/1.0 without Host is served."""
    assert exchange(gw.port, _get(b"/echo", version=b"1.0", host=b"")).status == 200


def test_keep_alive_serves_requests_in_turn(gw: Front) -> None:
    """One connection, three requests one after the other, three answers."""
    with Connection(gw.port) as conn:
        for n in range(3):
            conn.send(_get(b"/echo?n=%d" % n))
            assert conn.answer().json()["path"] == f"/echo?n={n}"


def test_the_same_head_again_on_a_connection_is_served_and_counted(gw: Front) -> None:
    """One connection sends the same bytes five times, one write each (the listener
    parses the first and replays the rest): each is forwarded as sent, and the
    route's limit (3) counts every one of them."""
    statuses = []
    with Connection(gw.port) as conn:
        for _ in range(5):
            conn.send(_get(b"/echo/counted?same", b"X-Api-Key: k1"))
            answer = conn.answer()
            statuses.append(answer.status)
            if answer.status == 200:
                seen = answer.json()
                assert (seen["path"], seen["headers"]["x-api-key"]) == ("/echo/counted?same", "k1")
    assert statuses == [200, 200, 200, 429, 429]


def test_heads_that_differ_in_values_reach_the_upstream_with_theirs(gw: Front) -> None:
    """One connection, a request id and a trace context new in each request (the
    listener parses two and replays the rest with their values): the upstream
    sees each request's own values, and one value that is no plain token (a
    space in it) is parsed and forwarded as sent too."""
    ids = [b"r-%d" % n for n in range(5)] + [b"r 5", b"r-6"]
    with Connection(gw.port) as conn:
        for n, rid in enumerate(ids):
            trace = b"00-%032d-%016d-01" % (n, n)
            conn.send(_get(b"/echo?v", b"X-Request-Id: " + rid, b"traceparent: " + trace))
            seen = {k.lower(): v for k, v in conn.answer().json()["headers"].items()}
            assert (seen["x-request-id"], seen["traceparent"]) == (rid.decode(), trace.decode())


def test_pipelined_requests_are_answered_in_order(gw: Front) -> None:
    """Requests sent in one write are answered in the order sent."""
    with Connection(gw.port) as conn:
        conn.send(b"".join(_get(b"/echo?n=%d" % n) for n in range(4)))
        paths = [conn.answer().json()["path"] for _ in range(4)]
    assert paths == [f"/echo?n={n}" for n in range(4)]


def test_many_pipelined_requests_in_one_write_are_all_answered(gw: Front) -> None:
    """300 requests (more bytes than one head may hold) in one write: 300 answers, in order."""
    raw = b"".join(_get(b"/echo?n=%d" % n, b"X-Pad: " + b"p" * 100) for n in range(300))
    assert len(raw) > 40000
    with Connection(gw.port) as conn:
        conn.send(raw)
        paths = [conn.answer().json()["path"] for _ in range(300)]
    assert paths == [f"/echo?n={n}" for n in range(300)]


def test_pipelined_slow_then_fast_keeps_the_order(gw: Front) -> None:
    """A fast request pipelined behind a slow one is answered after it."""
    with Connection(gw.port) as conn:
        conn.send(_get(b"/slow?s=0.3") + _get(b"/echo?second"))
        assert conn.answer().body == b"slow"
        assert conn.answer().json()["path"] == "/echo?second"


def test_expect_100_continue_is_answered_before_the_body(gw: Front) -> None:
    """Expect: 100-continue: the client gets 100 Continue, sends the body, gets 200."""
    with Connection(gw.port) as conn:
        conn.send(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        )
        interim = conn.answer()
        assert interim.status == 100
        conn.send(b"body")
        final = conn.answer()
        assert final.status == 200 and final.json()["size"] == 4
        assert "expect" not in _names(final.json())


def test_connection_close_from_the_client_closes_after_the_answer(gw: Front) -> None:
    """Connection: close: answered, then closed; the header is not forwarded."""
    with Connection(gw.port) as conn:
        conn.send(_get(b"/echo", b"Connection: close"))
        answer = conn.answer()
        assert answer.status == 200 and "connection" not in _names(answer.json())
        assert conn.closed()


def test_an_unknown_status_gets_a_generic_reason(gw: Front) -> None:
    """A status the registry does not know is forwarded with its class's reason phrase."""
    answer = exchange(gw.port, _get(b"/status/299"))
    assert (answer.status, answer.reason) == (299, b"Successful")


# -- smuggling shapes and parser errors ------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            id="cl-and-te",
        ),
        pytest.param(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            b"Content-Length: 5\r\n\r\nabcde",
            id="two-content-lengths",
        ),
        pytest.param(b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: a\r\n folded\r\n\r\n", id="obs-fold"),
        pytest.param(b"GET /echo HTTP/1.1\nHost: x\n\n", id="bare-lf"),
        pytest.param(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            id="bad-chunk-size",
        ),
        pytest.param(b"GET /echo HTTP/1.1\r\nHost : x\r\n\r\n", id="space-before-colon"),
        pytest.param(b"NOT HTTP AT ALL\r\n\r\n", id="garbage"),
        pytest.param(b"GET /echo HTTP/9.9\r\nHost: x\r\n\r\n", id="bad-version"),
    ],
)
def test_malformed_requests_are_400_and_closed(gw: Front, raw: bytes) -> None:
    """A request the parser rejects is answered 400 and the connection closed."""
    _refused(gw, raw, 400)


def test_a_bad_request_after_a_good_one_is_answered_after_it(gw: Front) -> None:
    """Pipelined: the good request's answer first, then the 400, then the close."""
    with Connection(gw.port) as conn:
        conn.send(_get(b"/echo?first") + b"NOT HTTP\r\n\r\n")
        assert conn.answer().json()["path"] == "/echo?first"
        assert conn.answer().status == 400
        assert conn.closed()


# -- caps ------------------------------------------------------------------------------


def test_a_target_over_the_cap_is_414(gw: Front) -> None:
    """A request target longer than max_target_bytes (8 KiB) is 414 and closed."""
    _refused(gw, _get(b"/echo?q=" + b"a" * 8200), 414)


def test_a_target_under_the_cap_is_served(gw: Front) -> None:
    """A target just under the cap is forwarded."""
    assert exchange(gw.port, _get(b"/echo?q=" + b"a" * 8000)).status == 200


def test_too_many_headers_are_431(gw: Front) -> None:
    """More than max_headers (100) header lines: 431 and closed."""
    extra = [b"X-H%d: v" % i for i in range(101)]
    _refused(gw, _get(b"/echo", *extra), 431)


def test_headers_up_to_the_count_cap_are_served(gw: Front) -> None:
    """Host plus 99 more header lines (100 in all) are served."""
    extra = [b"X-H%d: v" % i for i in range(99)]
    assert exchange(gw.port, _get(b"/echo", *extra)).status == 200


def test_a_head_over_the_byte_cap_is_431(gw: Front) -> None:
    """A head over max_header_bytes (32 KiB) in one header: 431 and closed."""
    _refused(gw, _get(b"/echo", b"X-Big: " + b"a" * 33000), 431)


def test_a_head_over_the_byte_cap_in_many_headers_is_431(gw: Front) -> None:
    """Many headers that together pass 32 KiB: 431."""
    extra = [b"X-H%d: %s" % (i, b"b" * 400) for i in range(90)]
    _refused(gw, _get(b"/echo", *extra), 431)


def test_a_head_under_the_byte_cap_is_served(gw: Front) -> None:
    """A 30 KiB head is forwarded (in lines the upstream accepts: 8 KiB at most)."""
    extra = [b"X-Big%d: %s" % (i, b"a" * 7500) for i in range(4)]
    seen = exchange(gw.port, _get(b"/echo", *extra)).json()
    assert len({k.lower(): v for k, v in seen["headers"].items()}["x-big3"]) == 7500


def test_an_endless_header_keeps_memory_flat(gw: Front) -> None:
    """Four clients sending one endless header each: 431 for each, and the gateway's
    memory grows by less than 8 MiB while they push 16 MiB each."""
    before = rss_kib(gw.pid)
    answers: list[bytes] = []

    def push() -> None:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Endless: ")
            try:
                for _ in range(256):
                    sock.sendall(b"a" * 65536)
            except OSError:
                pass  # the gateway closed the connection: what it said is still readable
            data = b""
            try:
                while chunk := sock.recv(65536):
                    data += chunk
            except OSError:
                pass
            answers.append(data)

    threads = [threading.Thread(target=push) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    grown = rss_kib(gw.pid) - before
    assert grown < 8 * 1024, f"RSS grew {grown} KiB"
    assert all(a.startswith(b"HTTP/1.1 431 ") for a in answers if a), answers
    assert exchange(gw.port, _get(b"/echo")).status == 200  # and it still serves


# -- Host ------------------------------------------------------------------------------


def test_http_1_1_without_host_is_400(gw: Front) -> None:
    """HTTP/1.1 without Host: 400."""
    _refused(gw, _get(b"/echo", host=b""), 400)


def test_two_host_headers_are_400(gw: Front) -> None:
    """Two Host headers (equal or not): 400."""
    _refused(gw, _get(b"/echo", b"Host: y"), 400)
    _refused(gw, _get(b"/echo", b"Host: x"), 400)


@pytest.mark.parametrize(
    "host", [b"a b", b"a/b", b"user@a", b"a:b:c", b"[zz]", b"a\\b", b'"a"'], ids=repr
)
def test_an_invalid_host_is_400(gw: Front, host: bytes) -> None:
    """A Host that is not host[:port] (RFC 3986): 400."""
    _refused(gw, _get(b"/echo", host=host), 400)


@pytest.mark.parametrize(
    "host", [b"a.example:8080", b"[::1]:80", b"10.0.0.1", b"xn--bcher-kva.example"]
)
def test_a_valid_host_is_served_and_forwarded(gw: Front, host: bytes) -> None:
    """A valid host[:port] is served; the upstream sees it as X-Forwarded-Host."""
    seen = exchange(gw.port, _get(b"/echo", host=host)).json()
    assert seen["headers"]["X-Forwarded-Host"] == host.decode()


def test_an_absolute_form_target_routes_by_its_authority(gw: Front) -> None:
    """GET http://a.example/x: the Host becomes the authority; the upstream sees the path."""
    raw = b"GET http://a.example:81/echo/./abs?q=1 HTTP/1.1\r\nHost: other\r\n\r\n"
    seen = exchange(gw.port, raw).json()
    assert seen["path"] == "/echo/abs?q=1"
    assert seen["headers"]["X-Forwarded-Host"] == "a.example:81"


def test_an_absolute_form_target_of_another_scheme_is_400(gw: Front) -> None:
    """An absolute-form target that is not http(s): 400."""
    _refused(gw, b"GET ftp://a.example/echo HTTP/1.1\r\nHost: a.example\r\n\r\n", 400)


# -- paths -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "forwarded"),
    [
        (b"/x/../echo", "/echo"),
        (b"//echo", "/echo"),
        (b"/./echo", "/echo"),
        (b"/%65cho", "/echo"),
        (b"/echo/a/b/../../c", "/echo/c"),
        (b"/echo/%7Euser", "/echo/~user"),
    ],
)
def test_the_upstream_sees_the_normalised_path(gw: Front, target: bytes, forwarded: str) -> None:
    """Dot segments, runs of "/" and encoded unreserved octets are normalised before
    routing, and the upstream receives the normalised path."""
    seen = exchange(gw.port, _get(target)).json()
    assert seen["raw_path"] == forwarded


@pytest.mark.parametrize("target", [b"/echo/a%2Fb", b"/echo/a%2fb", b"/echo/%E2%82%AC"])
def test_reserved_encodings_stay_as_sent(gw: Front, target: bytes) -> None:
    """%2F and other reserved or non-ASCII encodings reach the upstream unchanged."""
    assert exchange(gw.port, _get(target)).json()["raw_path"] == target.decode()


@pytest.mark.parametrize("target", [b"/../echo", b"/echo/../../x", b"/%2e%2e/echo"])
def test_a_path_above_the_root_is_400(gw: Front, target: bytes) -> None:
    """A path that climbs above "/" is 400 (as nginx answers)."""
    _refused(gw, _get(target), 400)


def test_a_route_limit_holds_for_every_spelling_of_its_path(gw: Front) -> None:
    """/login's limit (3) counts /login, /x/../login, //login, /./login and /%6Cogin alike."""
    statuses = [
        exchange(gw.port, _get(t)).status
        for t in (b"/login", b"/x/../login", b"//login", b"/./login", b"/%6Cogin")
    ]
    assert [s == 429 for s in statuses] == [False, False, False, True, True], statuses


# -- methods and upgrades --------------------------------------------------------------


def test_trace_is_405(gw: Front) -> None:
    """TRACE on a route that does not list it: 405, nothing forwarded."""
    _refused(gw, b"TRACE /echo HTTP/1.1\r\nHost: x\r\n\r\n", 405)


def test_trace_is_forwarded_where_a_route_lists_it(gw: Front) -> None:
    """TRACE on a route whose methods list it is forwarded."""
    seen = exchange(gw.port, b"TRACE /echo/trace HTTP/1.1\r\nHost: x\r\n\r\n").json()
    assert seen["method"] == "TRACE"


def test_connect_is_405(gw: Front) -> None:
    """CONNECT (a tunnel): 405."""
    _refused(gw, b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n", 405)


def test_a_non_websocket_upgrade_is_served_as_plain_http(gw: Front) -> None:
    """Upgrade: h2c is served as a plain request (Upgrade is hop-by-hop, not forwarded),
    and the connection goes on as HTTP/1.1."""
    with Connection(gw.port) as conn:
        conn.send(_get(b"/echo?up", b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c"))
        seen = conn.answer().json()
        assert seen["path"] == "/echo?up"
        assert "upgrade" not in _names(seen)
        conn.send(_get(b"/echo?next"))
        assert conn.answer().json()["path"] == "/echo?next"


# -- deadlines -------------------------------------------------------------------------


def test_an_incomplete_head_is_cut_at_the_header_deadline(gw: Front) -> None:
    """A head that never ends is cut after header_timeout (1 s here, swept: < 2 s)."""
    with Connection(gw.port) as conn:
        conn.send(b"GET /echo HTTP/1.1\r\nHost: x\r\n")
        assert conn.closed(within=3.0)


def test_an_idle_keep_alive_connection_is_closed(gw: Front) -> None:
    """After an answer, a connection that sends nothing more is closed."""
    with Connection(gw.port) as conn:
        conn.send(_get(b"/echo"))
        assert conn.answer().status == 200
        assert conn.closed(within=3.0)


def test_a_connection_that_sends_nothing_is_closed(gw: Front) -> None:
    """A connection that never sends a byte is closed at the deadline."""
    with Connection(gw.port) as conn:
        assert conn.closed(within=3.0)
