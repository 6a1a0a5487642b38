# How a refusal (and an allowed answer's quota) looks on the wire.
#
# Header styles:
#   "ietf"   RateLimit-Policy + RateLimit (draft-ietf-httpapi-ratelimit-headers);
#   "github" X-RateLimit-Limit / -Remaining / -Reset, the reset as Unix epoch
#            seconds (what GitHub sends), plus X-RateLimit-Used;
#   "both"   all of them.
# A refusal always carries Retry-After (integer seconds, at least 1, rounded up:
# a client that obeys it never comes back early) and an RFC 9457 problem body
# (application/problem+json) whose `retry_after` repeats the header.
# 429: over a limit. 503: we cannot serve now (store down in closed mode,
# bulkhead full, breaker open) -- not the client's fault, same Retry-After rule.
from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from .._errors import ConfigError
from ..core._decision import Decision
from ._types import Scope, Send

__all__ = [
    "HeaderStyle",
    "Refusal",
    "check_style",
    "limit_headers",
    "problem",
    "rate_limited",
    "retry_after_value",
    "send_refusal",
    "send_response",
    "send_websocket_refusal",
    "unavailable",
]

HeaderStyle: TypeAlias = Literal["ietf", "github", "both"]
_STYLES = ("ietf", "github", "both")
_IETF = ("RateLimit-Policy", "RateLimit")
_TITLES = {
    400: "Bad Request",
    409: "Conflict",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    503: "Service Unavailable",
}


def check_style(style: str) -> HeaderStyle:
    """Validate a header style (``ConfigError`` naming ``headers``)."""
    if style not in _STYLES:
        raise ConfigError("headers", f"must be one of {_STYLES}, got {style!r}")
    return style  # type: ignore[return-value]


def retry_after_value(seconds: float) -> str:
    """``Retry-After`` delay-seconds: rounded up, at least 1."""
    if not math.isfinite(seconds):
        seconds = 3600.0
    return str(max(1, math.ceil(seconds - 1e-9)))


def limit_headers(
    decision: Decision, style: HeaderStyle, *, now: float | None = None
) -> list[tuple[str, str]]:
    """The rate-limit headers of ``decision`` in ``style`` (``Retry-After`` on denial).

    ``now`` is the Unix time the GitHub-style epoch reset counts from (default: now).
    """
    rendered = decision.headers()
    out: list[tuple[str, str]] = []
    if style != "github":
        out += [(name, rendered[name]) for name in _IETF]
    if style != "ietf":
        # (the same wait as t= and Retry-After on a denial: core/_decision.py)
        epoch = (time.time() if now is None else now) + decision.reset_seconds()
        used = max(0, math.floor(decision.limit) - int(rendered["X-RateLimit-Remaining"]))
        out += [
            ("X-RateLimit-Limit", rendered["X-RateLimit-Limit"]),
            ("X-RateLimit-Remaining", rendered["X-RateLimit-Remaining"]),
            ("X-RateLimit-Reset", str(math.ceil(epoch))),
            ("X-RateLimit-Used", str(used)),
        ]
    if not decision.allowed:
        out.append(("Retry-After", retry_after_value(decision.retry_after)))
    return out


def problem(status: int, detail: str, *, retry_after: float | None = None, **extra: Any) -> bytes:
    """An RFC 9457 problem document for ``status``."""
    body: dict[str, Any] = {"type": "about:blank", "title": _TITLES.get(status, "Error")}
    body["status"] = status
    body["detail"] = detail
    if retry_after is not None:
        body["retry_after"] = int(retry_after_value(retry_after))
    body.update(extra)
    return json.dumps(body, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Refusal:
    """A complete refusal: status, headers and an RFC 9457 body; ``reason`` for logs."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    reason: str

    @classmethod
    def of(
        cls,
        status: int,
        detail: str,
        *,
        reason: str,
        retry_after: float | None = None,
        headers: Iterable[tuple[str, str]] = (),
        **extra: Any,
    ) -> Refusal:
        """A refusal with a problem body; ``Retry-After`` added when ``retry_after`` is set."""
        out = [pair for pair in headers if pair[0].lower() != "retry-after"]
        if retry_after is not None:
            out.append(("Retry-After", retry_after_value(retry_after)))
        out.append(("Content-Type", "application/problem+json"))
        body = problem(status, detail, retry_after=retry_after, **extra)
        return cls(status, tuple(out), body, reason)

    @property
    def retry_after(self) -> float | None:
        """The ``Retry-After`` seconds this refusal carries, if any."""
        for name, value in self.headers:
            if name == "Retry-After":
                return float(value)
        return None


def rate_limited(decision: Decision, style: HeaderStyle) -> Refusal:
    """429: over a limit, with the chosen rate-limit headers and ``Retry-After``."""
    retry_after = decision.retry_after if math.isfinite(decision.retry_after) else None
    detail = f"rate limit {decision.name!r} exceeded"
    if retry_after is None:
        detail += "; this request can never fit the limit"
    return Refusal.of(
        429,
        detail,
        reason=f"limited:{decision.name}",
        retry_after=retry_after,
        headers=limit_headers(decision, style),
    )


def unavailable(retry_after: float, reason: str, detail: str) -> Refusal:
    """503 + ``Retry-After``: the server cannot take the request now."""
    return Refusal.of(503, detail, reason=reason, retry_after=retry_after)


def _raw(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def send_response(
    send: Send, status: int, headers: Iterable[tuple[str, str]], body: bytes
) -> None:
    """Send a complete HTTP response (``content-length`` added)."""
    raw = _raw(headers)
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def send_refusal(send: Send, refusal: Refusal) -> None:
    """Send ``refusal`` as an HTTP response."""
    await send_response(send, refusal.status, refusal.headers, refusal.body)


async def send_websocket_refusal(scope: Scope, send: Send, refusal: Refusal) -> None:
    """Refuse a WebSocket handshake: the real status when the server supports it.

    With the ASGI ``websocket.http.response`` extension the client sees e.g. 429 +
    ``Retry-After``; without it the handshake is closed (servers answer 403).
    """
    if "websocket.http.response" in scope.get("extensions", {}):
        raw = _raw(refusal.headers)
        raw.append((b"content-length", str(len(refusal.body)).encode()))
        await send(
            {"type": "websocket.http.response.start", "status": refusal.status, "headers": raw}
        )
        await send({"type": "websocket.http.response.body", "body": refusal.body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": refusal.reason[:120]})
