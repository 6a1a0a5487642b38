"""Forwarding headers (issue 24, defect 9): what a client says about earlier hops.

From a peer that is not in `clients.trusted_proxies`, `Forwarded`, `X-Real-IP` and
every `X-Forwarded-*` are dropped and the gateway writes its own For/Proto/Host;
from a trusted proxy they are kept and X-Forwarded-For is appended to. The same on
the callback path (a GET) and the ASGI path (a POST with a body), through a real
gateway and the echo upstream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from stormguard.gateway._wire import request_headers

Factory = Callable[..., Any]

SPOOFED = {
    "Forwarded": "for=203.0.113.9;proto=https;host=evil.example",
    "X-Real-IP": "203.0.113.9",
    "X-Forwarded-For": "203.0.113.9",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "evil.example",
    "X-Forwarded-Port": "443",
    "X-Forwarded-Prefix": "/admin",
    "X-Forwarded-Ssl": "on",
}


def _seen(gw: Any, path: str) -> list[dict[str, str]]:
    """The headers the upstream saw, for a GET (callback path) and a POST (ASGI path)."""
    out = []
    with httpx.Client(timeout=10) as client:
        for answer in (
            client.get(f"{gw.url}{path}", headers=SPOOFED),
            client.post(f"{gw.url}{path}", headers=SPOOFED, content=b"body"),
        ):
            assert answer.status_code == 200
            out.append({k.lower(): v for k, v in answer.json()["headers"].items()})
    return out


def _gateway(gateway_factory: Factory, up: Any, **clients: Any) -> Any:
    config: dict[str, Any] = {
        "upstreams": {"a": {"url": up.url}},
        "routes": [{"path": "/", "upstream": "a"}],
    }
    if clients:
        config["clients"] = clients
    return gateway_factory(config)


def test_an_untrusted_client_cannot_say_where_it_came_from(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """Every spoofed forwarding header is gone; the gateway's own are the peer, http
    and the Host the client sent, on both paths."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up)
    for seen in _seen(gw, "/echo"):
        assert "forwarded" not in seen
        assert "x-real-ip" not in seen
        assert "x-forwarded-port" not in seen
        assert "x-forwarded-prefix" not in seen
        assert "x-forwarded-ssl" not in seen
        assert seen["x-forwarded-for"] == "127.0.0.1"
        assert seen["x-forwarded-proto"] == "http"
        assert seen["x-forwarded-host"] == f"127.0.0.1:{gw.http_port}"


def test_a_trusted_proxy_keeps_its_headers_and_the_chain_grows(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """From a trusted proxy: its forwarding headers are kept as sent and the peer is
    appended to X-Forwarded-For, on both paths."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, key=["ip"], trusted_proxies=["127.0.0.0/8"])
    for seen in _seen(gw, "/echo"):
        assert seen["forwarded"] == SPOOFED["Forwarded"]
        assert seen["x-real-ip"] == "203.0.113.9"
        assert seen["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
        assert seen["x-forwarded-proto"] == "https"
        assert seen["x-forwarded-host"] == "evil.example"
        assert seen["x-forwarded-port"] == "443"
        assert seen["x-forwarded-prefix"] == "/admin"


def _scope(headers: list[tuple[bytes, bytes]], scheme: str = "http") -> dict[str, Any]:
    return {"headers": headers, "client": ("192.0.2.1", 5000), "scheme": scheme}


@pytest.mark.parametrize("trusted", [False, True])
def test_the_gateway_writes_what_a_trusted_proxy_left_out(trusted: bool) -> None:
    """A trusted proxy that sent no -Proto/-Host gets the gateway's; one Host (the
    first) becomes X-Forwarded-Host; wss counts as https."""
    raw = [(b"host", b"api.example"), (b"host", b"other.example"), (b"accept", b"*/*")]
    out = dict(request_headers(_scope(raw, "wss"), trusted))
    assert out[b"X-Forwarded-For"] == b"192.0.2.1"
    assert out[b"X-Forwarded-Proto"] == b"https"
    assert out[b"X-Forwarded-Host"] == b"api.example"
    assert out[b"accept"] == b"*/*"


def test_forwarding_headers_a_connection_header_names_are_dropped_even_when_trusted() -> None:
    """Connection-named headers are hop-by-hop, forwarding ones included."""
    raw = [(b"connection", b"x-real-ip"), (b"x-real-ip", b"10.0.0.1"), (b"forwarded", b"for=x")]
    out = [name for name, _ in request_headers(_scope(raw), True)]
    assert b"x-real-ip" not in out and b"forwarded" in out
