"""The request chain's direct exchanges (gateway/chain) on the gateway's own listener."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import yaml

from stormguard.gateway._config import parse_config
from stormguard.gateway._metrics import GatewayMetrics
from stormguard.gateway._runtime import Runtime
from stormguard.gateway.chain import begin

Factory = Callable[..., Any]


def _gateway(gateway_factory: Factory, up: Any, **upstream: Any) -> Any:
    config = {
        "upstreams": {"a": {"url": up.url, **upstream}},
        "routes": [{"path": "/", "upstream": "a"}],
    }
    return gateway_factory(config)


def _read_answers(sock: socket.socket, n: int) -> list[bytes]:
    data = b""
    while data.count(b"HTTP/1.1 ") < n or not data.endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return [b"HTTP/1.1 " + part for part in data.split(b"HTTP/1.1 ")[1:]]


@contextmanager
def _warm_connection(upstream_factory: Factory, gateway_factory: Factory) -> Iterator[Any]:
    """A client connection to a gateway that already holds an idle upstream connection."""
    gw = _gateway(gateway_factory, upstream_factory())
    assert httpx.get(f"{gw.url}/echo").status_code == 200  # an idle upstream connection
    with socket.create_connection(("127.0.0.1", gw.http_port), timeout=10) as sock:
        yield sock


def test_pipelined_requests_are_answered_in_order(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """Two requests sent in one write come back in order on the same connection."""
    with _warm_connection(upstream_factory, gateway_factory) as sock:
        sock.sendall(
            b"GET /echo?n=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?n=2 HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        answers = _read_answers(sock, 2)
    assert [a.split(b"\r\n")[0] for a in answers] == [b"HTTP/1.1 200 OK"] * 2
    assert b'"/echo?n=1"' in answers[0] and b'"/echo?n=2"' in answers[1]


def test_head_and_streamed_answers_on_a_warm_connection(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """HEAD keeps the length and sends no body; a chunked answer streams through whole."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up)
    with httpx.Client() as client:
        assert client.get(f"{gw.url}/echo").status_code == 200
        head = client.head(f"{gw.url}/big?n=1000")
        assert head.status_code == 200 and head.headers["content-length"] == "1000"
        assert head.content == b""
        with client.stream("GET", f"{gw.url}/stream?n=3") as answer:
            assert answer.headers["via"].endswith("1.1 stormguard")
            assert b"".join(answer.iter_bytes()) == b"chunk0\nchunk1\nchunk2\n"
        assert client.get(f"{gw.url}/big?n=70000").content == b"x" * 70000


def test_keep_alive_connection_serves_requests_one_after_another(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """Requests sent one at a time on one connection are each answered, in turn."""
    with _warm_connection(upstream_factory, gateway_factory) as sock:
        for n in range(20):
            sock.sendall(b"GET /echo?n=%d HTTP/1.1\r\nHost: x\r\n\r\n" % n)
            (answer,) = _read_answers(sock, 1)
            assert answer.startswith(b"HTTP/1.1 200 OK") and b'"/echo?n=%d"' % n in answer


def test_a_slow_reader_gets_a_large_body_whole(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """A client that reads long after the answer began (the gateway's buffer to it
    fills, the upstream is paused and resumed) still gets every byte, once."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up)
    assert httpx.get(f"{gw.url}/echo").status_code == 200  # an idle upstream connection
    size = 8_000_000
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", gw.http_port))
        sock.sendall(b"GET /big?n=%d HTTP/1.1\r\nHost: x\r\n\r\n" % size)
        # Not reading yet: 8 MB cannot fit in the buffers on the way, so the
        # exchange stays in flight (the upstream paused) until the client reads.
        eventually(lambda: gw.status()["upstreams"]["a"]["in_flight"] == 1)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: %d" % size in head
        received = len(body)
        while received < size:
            chunk = sock.recv(65536)
            assert chunk and chunk.count(b"x") == len(chunk)
            received += len(chunk)
        assert received == size
    assert httpx.get(f"{gw.url}/echo").status_code == 200


def test_vanished_client_on_a_warm_connection_frees_its_slot(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """A client gone mid-request frees the bulkhead slot and ends the upstream call."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, bulkhead={"limit": 1})
    assert httpx.get(f"{gw.url}/echo").status_code == 200  # an idle upstream connection
    sock = socket.create_connection(("127.0.0.1", gw.http_port))
    sock.sendall(b"GET /slow?s=30 HTTP/1.1\r\nHost: x\r\n\r\n")
    eventually(lambda: up.seen()["in_flight"] == 1)
    sock.close()
    eventually(lambda: up.seen()["in_flight"] == 0)
    eventually(lambda: gw.status()["upstreams"]["a"]["in_flight"] == 0)
    assert httpx.get(f"{gw.url}/echo").status_code == 200
    eventually(lambda: gw.status()["routes"]["/"].get("client_gone") == 1)


CONFIG = {
    "upstreams": {"a": {"targets": ["http://127.0.0.1:9", "http://127.0.0.1:10"]}},
    "limits": {"pc": {"algorithm": "token_bucket", "rate": 1, "burst": 5, "per": "client"}},
    "routes": [
        {"path": "/keyed", "upstream": "a", "idempotency": "honor"},
        {"path": "/", "upstream": "a", "limits": ["pc"]},
    ],
}


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]] | None = None) -> Any:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "client": ("127.0.0.1", 5000),
        "scheme": "http",
        "headers": [(b"host", b"gw"), *(headers or [])],
    }


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("POST", "/x", []),  # a body may come
        ("GET", "/x", [(b"content-length", b"3")]),
        ("GET", "/x", [(b"transfer-encoding", b"chunked")]),
    ],
)
def test_requests_with_a_body_go_to_the_asgi_leg_untouched(
    method: str, path: str, headers: list[tuple[bytes, bytes]]
) -> None:
    """A request that may have a body is left to the listener's cycle before a stage runs."""
    runtime = Runtime(parse_config(yaml.safe_dump(CONFIG)), GatewayMetrics())
    pool = runtime.upstreams["a"]
    turn = pool.turn
    proto = SimpleNamespace(client_known=None, limits_known=None)  # what begin() reads of it
    assert begin(runtime, proto, _scope(method, path, headers), True) is None
    assert pool.turn == turn  # round robin: the ASGI path takes this turn
    assert pool.in_flight == 0
    assert runtime.store._data == {}  # no limit was charged


class OneAnswerPerConnection:
    """An upstream that answers the first request of a connection and closes the
    connection on the second without answering (a keep-alive timeout racing a send)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            conn.recv(65536)  # the second request: dropped with the connection

    def close(self) -> None:
        self.listener.close()


def test_stale_keep_alive_connection_is_sent_again(gateway_factory: Factory) -> None:
    """A GET on a connection the upstream drops unanswered goes out once more, fresh."""
    up = OneAnswerPerConnection()
    try:
        gw = gateway_factory(
            {
                "upstreams": {"a": {"url": f"http://127.0.0.1:{up.port}"}},
                "routes": [{"path": "/", "upstream": "a"}],
            }
        )
        with httpx.Client() as client:
            answers = [client.get(f"{gw.url}/x") for _ in range(3)]
        assert [(a.status_code, a.content) for a in answers] == [(200, b"ok")] * 3
        assert up.connections >= 3
    finally:
        up.close()


ROUTED = {
    "upstreams": {"a": {"url": "http://127.0.0.1:9"}, "b": {"url": "http://127.0.0.1:10"}},
    "routes": [
        {"path": "/api", "upstream": "a", "methods": ["GET"]},
        {"path": "/api", "upstream": "b", "host": "admin.example"},
        {"path": "/", "upstream": "b"},
    ],
}


@pytest.mark.parametrize(
    ("path", "method", "host", "upstream"),
    [
        ("/api/x", "GET", None, "a"),
        ("/api/x", "DELETE", None, "b"),  # not a method of the first /api route
        ("/api/x", "DELETE", "admin.example", "b"),
        ("/apix", "GET", None, "b"),  # a prefix matches whole segments
        ("/", "GET", "other.example", "b"),
    ],
)
def test_a_route_found_again_is_the_route_the_table_gives(
    path: str, method: str, host: str | None, upstream: str
) -> None:
    """Runtime.match answers the same the first time and from its table afterwards."""
    runtime = Runtime(parse_config(yaml.safe_dump(ROUTED)), GatewayMetrics())
    first = runtime.match(path, method, host)
    assert first is not None and first.upstream.name == upstream
    assert runtime.match(path, method, host) is first


def test_the_route_table_is_bounded_and_new_with_each_runtime() -> None:
    """Many distinct paths keep the table within its bound; a reload starts afresh."""
    config = parse_config(yaml.safe_dump(ROUTED))
    runtime = Runtime(config, GatewayMetrics())
    for i in range(3000):
        assert runtime.match(f"/p{i}", "GET", None) is runtime.routes[-1]
    assert 0 < len(runtime._matched) <= 1024
    reloaded = Runtime(config, GatewayMetrics(), previous=runtime)
    assert reloaded._matched == {}
    assert reloaded.match("/api", "GET", None) is reloaded.routes[0]
