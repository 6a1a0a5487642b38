"""WebSocket upgrades through the listener's hand-off (gateway/http/_websocket.py)."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
import websockets
from rawclient import Connection

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("stormguard.gateway.http._websocket") is None,
        reason="gateway/http/_websocket.py is written on another branch",
    ),
]

Factory = Callable[..., Any]

_UPGRADE = (
    b"GET %s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


def _gateway(upstream_factory: Factory, gateway_factory: Factory) -> Any:
    up = upstream_factory()
    return gateway_factory(
        {
            "upstreams": {"a": {"url": up.url}},
            "routes": [
                {"path": "/ws", "upstream": "a", "websocket": {}},
                {"path": "/", "upstream": "a"},
            ],
        }
    )


def test_a_websocket_on_a_normalised_path_reaches_its_route(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """/x/../ws is /ws: the upgrade is handed off and the upstream echoes."""
    gw = _gateway(upstream_factory, gateway_factory)

    async def talk() -> Any:
        async with websockets.connect(f"{gw.ws_url}/x/../ws") as ws:
            await ws.send("ping")
            return await ws.recv()

    assert asyncio.run(talk()) == "ping"


@pytest.mark.parametrize(
    ("extra", "status"),
    [(b"Host: y\r\n", 400), (b"X-Big: " + b"a" * 40000 + b"\r\n", 431)],
    ids=["two-hosts", "head-over-cap"],
)
def test_an_upgrade_meets_the_head_rules_first(
    upstream_factory: Factory, gateway_factory: Factory, extra: bytes, status: int
) -> None:
    """The head rules hold for an upgrade request too: refused before the hand-off."""
    gw = _gateway(upstream_factory, gateway_factory)
    with Connection(gw.http_port) as conn:
        conn.send(_UPGRADE % b"/ws" + extra + b"\r\n")
        assert conn.answer().status == status
        assert conn.closed()


def test_an_upgrade_above_the_root_is_400(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """/../ws climbs above the root: 400, no hand-off."""
    gw = _gateway(upstream_factory, gateway_factory)
    with Connection(gw.http_port) as conn:
        conn.send(_UPGRADE % b"/../ws" + b"\r\n")
        assert conn.answer().status == 400
