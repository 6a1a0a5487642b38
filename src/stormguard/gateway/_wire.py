# The header rewriting of a reverse proxy: hop-by-hop headers out (with those the
# Connection header names), X-Forwarded-For/-Proto/-Host and Via in. Refusals are
# rendered by the server side (server/_refusal.py).
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["HOP_BY_HOP", "request_headers", "response_headers"]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Not hop-by-hop, but the proxy rewrites them itself.
_REQUEST_DROP = HOP_BY_HOP | {b"host", b"expect", b"via", b"x-forwarded-proto", b"x-forwarded-host"}
VIA = b"1.1 stormguard"


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    tokens: set[bytes] = set()
    for k, v in headers:
        if k.lower() == b"connection":
            tokens.update(t.strip().lower() for t in v.split(b","))
    return tokens


def request_headers(scope: Mapping[str, Any], trusted_peer: bool) -> list[tuple[str, str]]:
    """The headers to send upstream (as str pairs for aiohttp).

    X-Forwarded-For: the incoming chain, plus the peer, is kept only when the peer
    is a trusted proxy; otherwise it is the peer address alone (a client cannot
    forge it).
    """
    raw: list[tuple[bytes, bytes]] = scope["headers"]
    drop = (
        _REQUEST_DROP | _connection_tokens(raw)
        if any(k == b"connection" for k, _ in raw)
        else _REQUEST_DROP
    )
    out: list[tuple[str, str]] = []
    host = ""
    forwarded_for = ""
    via = ""
    for k, v in raw:
        if k == b"host":
            host = v.decode("latin-1")
        elif k == b"x-forwarded-for":
            forwarded_for = (
                v.decode("latin-1")
                if not forwarded_for
                else f"{forwarded_for}, {v.decode('latin-1')}"
            )
            continue
        elif k == b"via":
            via = v.decode("latin-1")
        if k not in drop:
            out.append((k.decode("latin-1"), v.decode("latin-1")))
    client = scope.get("client")
    peer = str(client[0]) if client else "unknown"
    chain = f"{forwarded_for}, {peer}" if forwarded_for and trusted_peer else peer
    out.append(("X-Forwarded-For", chain))
    out.append(("X-Forwarded-Proto", str(scope.get("scheme", "http")).replace("ws", "http")))
    if host:
        out.append(("X-Forwarded-Host", host))
    out.append(("Via", f"{via}, 1.1 stormguard" if via else "1.1 stormguard"))
    return out


def response_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers minus hop-by-hop ones, plus ``Via``."""
    pairs = list(raw)
    drop = HOP_BY_HOP | _connection_tokens(pairs)
    out = [(k.lower(), v) for k, v in pairs if k.lower() not in drop and k.lower() != b"via"]
    via = [v for k, v in pairs if k.lower() == b"via"]
    out.append((b"via", (via[0] + b", " + VIA) if via else VIA))
    return out
