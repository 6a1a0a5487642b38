"""WebSocket routes through a real gateway: pass-through, limits, refusals."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import websockets

Factory = Callable[..., Any]


def _gateway(gateway_factory: Factory, up: Any, websocket: dict[str, Any], **upstream: Any) -> Any:
    return gateway_factory(
        {
            "upstreams": {"a": {"url": up.url, **upstream}},
            "routes": [{"path": "/ws", "upstream": "a", "websocket": websocket}],
        }
    )


def test_messages_and_close_codes_pass_through(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """Text and binary go both ways; the upstream's close code reaches the client."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, {})

    async def talk() -> tuple[Any, Any, int | None]:
        async with websockets.connect(f"{gw.ws_url}/ws") as ws:
            await ws.send("hello")
            text = await ws.recv()
            await ws.send(b"\x00\x01\x02")
            data = await ws.recv()
            await ws.send("close:4001")
            with pytest.raises(websockets.ConnectionClosed) as info:
                await ws.recv()
            return text, data, info.value.rcvd.code if info.value.rcvd else None

    assert asyncio.run(talk()) == ("hello", b"\x00\x01\x02", 4001)


def test_connection_limit_refuses_handshake_and_frees_slots(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """Over the connection limit: 429 + Retry-After; a vanished client frees its slot."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, {"connections_per_client": 2})

    async def scenario() -> tuple[int, str]:
        first = await websockets.connect(f"{gw.ws_url}/ws")
        second = await websockets.connect(f"{gw.ws_url}/ws")
        with pytest.raises(websockets.InvalidStatus) as info:
            await websockets.connect(f"{gw.ws_url}/ws")
        response = info.value.response
        first.transport.abort()  # vanishes without a close frame
        await second.close()
        return response.status_code, response.headers["retry-after"]

    status, retry_after = asyncio.run(scenario())
    assert status == 429 and int(retry_after) >= 1
    eventually(lambda: gw.status()["websockets"]["/ws"] == 0)

    async def again() -> str:
        async with (
            websockets.connect(f"{gw.ws_url}/ws") as a,
            websockets.connect(f"{gw.ws_url}/ws") as b,
        ):
            await a.send("x")
            await b.send("y")
            return str(await a.recv()) + str(await b.recv())

    assert asyncio.run(again()) == "xy"


@pytest.mark.parametrize(
    ("settings", "messages", "code"),
    [
        ({"max_message": 100}, ["x" * 101], 1009),
        ({"messages_per_second": 1, "burst": 3}, ["m"] * 6, 1008),
    ],
)
def test_message_limits_close_the_connection(
    upstream_factory: Factory,
    gateway_factory: Factory,
    settings: dict[str, Any],
    messages: list[str],
    code: int,
) -> None:
    """A message over max_message closes with 1009; over the message rate with 1008."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, settings)

    async def talk() -> int | None:
        async with websockets.connect(f"{gw.ws_url}/ws") as ws:
            for message in messages:
                await ws.send(message)
            with pytest.raises(websockets.ConnectionClosed) as info:
                while True:
                    await ws.recv()
            return info.value.rcvd.code if info.value.rcvd else None

    assert asyncio.run(talk()) == code


def test_open_breaker_refuses_handshake_with_503(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """The upstream's breaker guards new WebSocket connections: 503 + Retry-After."""
    up = upstream_factory()
    breaker = {"min_calls": 2, "failure_rate": 0.5, "open_for": 30}
    gw = _gateway(gateway_factory, up, {}, breaker=breaker)
    up.stop()

    async def attempts() -> list[int]:
        codes = []
        for _ in range(3):
            with pytest.raises(websockets.InvalidStatus) as info:
                await websockets.connect(f"{gw.ws_url}/ws")
            codes.append(info.value.response.status_code)
        return codes

    assert asyncio.run(attempts()) == [502, 502, 503]
    assert gw.status()["routes"]["/ws"]["breaker_open"] == 1
