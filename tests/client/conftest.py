"""Fixtures of the adapter tests: a scripted server and a dead port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from http_support import ScriptedServer, Sender, send_httpx_async, send_httpx_sync, send_requests

from net_support import refused_port


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted HTTP server on 127.0.0.1 with a free port."""
    srv = ScriptedServer()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def dead_url() -> str:
    """A loopback URL where nothing listens (connection refused: never sent)."""
    return f"http://127.0.0.1:{refused_port()}"


@pytest.fixture(
    params=[send_httpx_sync, send_httpx_async, send_requests],
    ids=["httpx", "httpx-async", "requests"],
)
def send(request: pytest.FixtureRequest) -> Sender:
    """Each HTTP adapter in turn: one request through it (http_support's senders)."""
    sender: Sender = request.param
    return sender
