"""SIGTERM on the gateway's own listener: requests in flight finish, idle keep-alive
connections are closed, new connections are refused, the process exits 0."""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
from rawclient import Connection

pytestmark = pytest.mark.slow

Factory = Callable[..., Any]


@pytest.mark.parametrize("retries", [None, {"attempts": 2}], ids=["callback", "asgi"])
def test_sigterm_drains(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any, retries: Any
) -> None:
    """A request in flight gets its answer (with Connection: close), however long it is
    held; an idle keep-alive connection is closed at once; the process exits 0."""
    up = upstream_factory()
    upstream: dict[str, Any] = {"url": up.url}
    if retries:
        upstream["retries"] = retries
    gw = gateway_factory(
        {"upstreams": {"a": upstream}, "routes": [{"path": "/", "upstream": "a"}], "drain": 10}
    )
    with Connection(gw.http_port) as idle, Connection(gw.http_port) as busy:
        idle.send(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.answer().status == 200  # now idle, kept alive
        answers: list[Any] = []

        def slow() -> None:
            busy.send(b"GET /hold?key=drain HTTP/1.1\r\nHost: x\r\n\r\n")
            answers.append(busy.answer())

        thread = threading.Thread(target=slow)
        thread.start()
        eventually(lambda: up.seen()["in_flight"] == 1)
        gw.signal(signal.SIGTERM)
        assert idle.closed(within=3.0)
        assert gw.proc.poll() is None and not answers  # still draining: held upstream
        up.release("drain")
        thread.join(20)
        assert answers and answers[0].status == 200 and answers[0].body == b"held"
        assert answers[0].header(b"connection") == b"close"
        assert busy.closed(within=3.0)
    assert gw.proc.wait(timeout=30) == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", gw.http_port), timeout=1).close()
