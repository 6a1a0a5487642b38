# The header rewriting of a reverse proxy: hop-by-hop headers out (with those the
# Connection header names), the client's forwarding headers out unless its peer is
# a trusted proxy, X-Forwarded-For/-Proto/-Host and Via in. Refusals are
# rendered by the server side (server/_refusal.py).
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .http._head import status_line

__all__ = [
    "DISCONNECT",
    "HOP_BY_HOP",
    "Patch",
    "block_patch",
    "changed_only_at",
    "patched",
    "patched_block",
    "request_headers",
    "response_head",
    "response_headers",
]

# Scope entry set by the gateway's own HTTP listener (http/_listener.py): the request's
# cycle; a callable put in its `on_lost` is called once if the client disconnects
# before the answer is complete.
DISCONNECT = "stormguard.disconnect"

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
# Not hop-by-hop, but the proxy rewrites them itself (the upstream client frames
# the body: Content-Length or chunked).
_REQUEST_DROP = HOP_BY_HOP | {b"host", b"expect", b"via", b"content-length"}
# What a client says about the hops before the gateway: believed (kept, and
# X-Forwarded-For appended to) only from `clients.trusted_proxies`; from anyone else
# dropped, and the gateway's own X-Forwarded-For/-Proto/-Host written. Every
# `x-forwarded-*` name counts (For, Proto, Host, Port, Prefix, and the rarer ones).
_CLIENT_FORWARDING = frozenset({b"forwarded", b"x-real-ip"})
_X_FORWARDED = b"x-forwarded-"
VIA = b"1.1 stormguard"
_PLAIN_TOKENS = {b"keep-alive", b"close"}  # Connection values that name no header
_PROTO = {"http": b"http", "https": b"https", "ws": b"http", "wss": b"https"}


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    tokens: set[bytes] = set()
    for k, v in headers:
        if k.lower() == b"connection":
            tokens.update(t.strip().lower() for t in v.split(b","))
    return tokens


def request_headers(scope: Mapping[str, Any], trusted_peer: bool) -> list[tuple[bytes, bytes]]:
    """The headers to send upstream (name, value) as bytes.

    From a peer that is not a trusted proxy, the client's ``Forwarded``,
    ``X-Real-IP`` and ``X-Forwarded-*`` are dropped and the gateway writes its own:
    ``X-Forwarded-For`` (the peer address), ``X-Forwarded-Proto`` (``http`` or
    ``https``) and ``X-Forwarded-Host`` (the request's Host). From a trusted proxy
    they are kept, the peer is appended to its ``X-Forwarded-For``, and
    ``-Proto``/``-Host`` are written only where the proxy sent none.
    """
    raw: list[tuple[bytes, bytes]] = scope["headers"]
    out: list[tuple[bytes, bytes]] = []
    host = b""
    forwarded: list[bytes] = []
    via = b""
    named = False  # a Connection header names more hop-by-hop headers
    proto_sent = host_sent = False  # by a trusted proxy
    for pair in raw:
        k = pair[0]
        if k in _REQUEST_DROP:
            if k == b"host":
                host = host or pair[1]
            elif k == b"via":
                via = pair[1]
            elif k == b"connection":
                named = True
        elif k == b"x-forwarded-for":
            forwarded.append(pair[1])
        elif k in _CLIENT_FORWARDING or k.startswith(_X_FORWARDED):
            if trusted_peer:
                out.append(pair)
                proto_sent = proto_sent or k == b"x-forwarded-proto"
                host_sent = host_sent or k == b"x-forwarded-host"
        else:
            out.append(pair)
    if named:
        tokens = _connection_tokens(raw)
        out = [pair for pair in out if pair[0] not in tokens]
    client = scope.get("client")
    peer = str(client[0]).encode("latin-1") if client else b"unknown"
    chain = b", ".join((*forwarded, peer)) if forwarded and trusted_peer else peer
    out.append((b"X-Forwarded-For", chain))
    if not proto_sent:
        scheme = scope.get("scheme", "http")
        out.append((b"X-Forwarded-Proto", _PROTO.get(scheme) or scheme.encode("latin-1")))
    if host and not host_sent:
        out.append((b"X-Forwarded-Host", host))
    out.append((b"Via", via + b", " + VIA if via else VIA))
    return out


# A patch of kept header lines (block_patch): (the indices of the request headers
# whose values it takes, ascending; the lines around those values, in the block's
# order; the index of each value in the block's order).
Patch = tuple[tuple[int, ...], tuple[bytes, ...], tuple[int, ...]]


def patched_block(
    kept: list[tuple[bytes, bytes]], block: bytes, raw: list[tuple[bytes, bytes]]
) -> bytes | None:
    """The header lines for request headers ``raw`` made from ``block``, the lines
    rendered for ``kept`` (same peer, scheme, method and rules), when the two differ in
    the values of end-to-end headers only -- every request naming a different client
    by ``X-API-Key`` (issue 24), a request id or a trace context per request; else
    None (render them afresh)."""
    if len(kept) != len(raw):
        return None
    if kept == raw:
        return block
    patch = block_patch(kept, block, raw)
    return None if patch is None else patched(patch, raw)


def patched(patch: Patch, raw: list[tuple[bytes, bytes]]) -> bytes:
    """The header lines of ``patch`` with the values of ``raw``."""
    _, pieces, slots = patch
    parts = [pieces[0]]
    for at, piece in zip(slots, pieces[1:]):
        parts += (raw[at][1], piece)
    return b"".join(parts)


def block_patch(
    kept: list[tuple[bytes, bytes]], block: bytes, raw: list[tuple[bytes, bytes]]
) -> Patch | None:
    """:func:`patched_block` as a :data:`Patch`: the lines for ``raw``, and for any
    headers that differ from ``raw`` only in the values the patch takes
    (:func:`changed_only_at`), are its pieces with those values between them; None:
    render them afresh (a name changed, a header came or went, a changed header is
    one the proxy rewrites or drops, or its line is not in the block exactly once)."""
    if len(kept) != len(raw):
        return None
    changed = [i for i, (old, new) in enumerate(zip(kept, raw, strict=True)) if old != new]
    whole = b"\r\n" + block
    spans = []  # (where the value starts in the block, where it ends, its index)
    for at in changed:
        name, value = kept[at]
        if name != raw[at][0]:
            return None
        if name in _REQUEST_DROP or name in _CLIENT_FORWARDING or name.startswith(_X_FORWARDED):
            return None  # request_headers rewrites these itself
        line = b"\r\n" + name + b": " + value + b"\r\n"
        first = whole.find(line)
        if first < 0 or whole.find(line, first + 1) >= 0:
            return None  # dropped (named by Connection), or not the only such line
        begins = first + len(name) + 2  # (in the block: `whole` is 2 bytes longer)
        spans.append((begins, begins + len(value), at))
    if not spans:
        return None
    spans.sort()
    pieces, end = [], 0
    for begins, ends, _ in spans:
        pieces.append(block[end:begins])
        end = ends
    pieces.append(block[end:])
    return tuple(changed), tuple(pieces), tuple(at for _, _, at in spans)


def changed_only_at(
    kept: list[tuple[bytes, bytes]], raw: list[tuple[bytes, bytes]], at: tuple[int, ...]
) -> bool:
    """Whether ``raw`` is ``kept`` (as long, the same names) but for the values at
    the indices ``at`` (ascending): a :data:`Patch` of ``kept`` serves ``raw`` too."""
    if len(kept) != len(raw):
        return False
    start = 0
    for i in at:
        if kept[start:i] != raw[start:i] or kept[i][0] != raw[i][0]:
            return False
        start = i + 1
    return kept[start:] == raw[start:]


def response_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers minus hop-by-hop ones, plus ``Via``."""
    out: list[tuple[bytes, bytes]] = []
    via = b""
    tokens: set[bytes] | None = None
    for k, v in raw:
        k = k.lower()
        if k in HOP_BY_HOP:
            if k == b"connection":
                named = {t.strip().lower() for t in v.split(b",")} - _PLAIN_TOKENS
                tokens = named if tokens is None else tokens | named
        elif k == b"via":
            via = via or v
        else:
            out.append((k, v))
    if tokens:  # headers the Connection header names are hop-by-hop too
        out = [pair for pair in out if pair[0] not in tokens]
    out.append((b"via", via + b", " + VIA if via else VIA))
    return out


def response_head(
    status: int,
    raw: list[tuple[bytes, bytes]],
    default: Iterable[tuple[bytes, bytes]],
    keep_alive: bool,
    chunked: bool,
    *,
    via: bool = True,
) -> bytes:
    """The HTTP/1.1 head of an answer, rendered in one pass: the status line, the
    server's ``default`` headers, ``raw`` (the upstream's, filtered as
    :func:`response_headers` does, when ``via``; else the gateway's own), then
    ``Connection: close`` unless ``keep_alive`` and ``Transfer-Encoding: chunked``
    when ``chunked`` (any Content-Length is then left out: the body is framed
    here). Names go out lower-cased."""
    parts = [_STATUS_LINES.get(status) or status_line(status)]
    if default:
        _render(parts, default, False)
    if not via:
        _render(parts, raw, chunked)
    else:
        mark = len(parts)
        for name, value in raw:
            name = name.lower()
            if name in _NOT_PLAIN:
                if name == b"connection" and value.strip().lower() in _PLAIN_TOKENS:
                    continue  # "keep-alive" or "close": names no other header
                del parts[mark:]  # a header to filter: the general rules decide
                _render(parts, response_headers(raw), chunked)
                break
            if not (chunked and name == b"content-length"):
                parts += (name, b": ", value, b"\r\n")
        else:
            parts.append(b"via: " + VIA + b"\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"transfer-encoding: chunked\r\n\r\n" if chunked else b"\r\n")
    return b"".join(parts)


def _render(parts: list[bytes], headers: Iterable[tuple[bytes, bytes]], chunked: bool) -> None:
    for name, value in headers:
        name = name.lower()
        if not (chunked and name == b"content-length"):
            parts += (name, b": ", value, b"\r\n")


# Every status 100-999 has its line (http/_head.py: a generic phrase when unknown).
_STATUS_LINES = {status: status_line(status) for status in range(100, 1000)}
# Names whose presence sends a head through response_headers() (hop-by-hop ones,
# and Via, which the gateway extends).
_NOT_PLAIN = HOP_BY_HOP | {b"via"}
