# RateLimitMiddleware: an ASGI 3 middleware deciding each HTTP request and each
# WebSocket handshake against a RuleSet, in one store call per request.
#
#   allowed  -> the app runs; with headers_on_allowed the quota headers are added
#               to its response start;
#   over     -> 429 + Retry-After + the chosen headers + an RFC 9457 body
#               (a WebSocket handshake: the same 429 via websocket.http.response,
#               or a close -- the server answers 403 -- where that is missing);
#   store down, on_store_error="closed" -> 503 + Retry-After (we cannot count: not
#               the client's fault); "open" admits; "local" decides per process.
# Nothing here lets a store outage become a 500.
from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict, Unpack

from ..core._decision import Decision
from ._decide import RuleSet, close_on_shutdown
from ._refusal import (
    HeaderStyle,
    Refusal,
    check_style,
    limit_headers,
    rate_limited,
    send_refusal,
    send_websocket_refusal,
    unavailable,
)
from ._rules import ClientAddress, KeySpec, Rule, compile_key
from ._types import ASGIApp, Message, Receive, Scope, Send
from ._view import ScopeView
from ._websocket import WebSocketGuard, WebSocketLimits

__all__ = ["RateLimitMiddleware", "RequestLimits", "StoreOptions", "refusal_for"]


def refusal_for(decision: Decision, rules: RuleSet, style: HeaderStyle) -> Refusal:
    """The answer to a denied decision: 503 while the store is down in closed mode, else 429."""
    if rules.store_down and rules.fails_closed:
        return unavailable(
            decision.retry_after, "store_unavailable", "rate limit store unavailable"
        )
    return rate_limited(decision, style)


class StoreOptions(TypedDict, total=False):
    """Where a rule set keeps its counts (the :class:`RuleSet` keywords, same defaults)."""

    store: object
    on_store_error: str
    trusted_proxies: Sequence[str]
    instances: int | None
    retry_store_after: float


class RequestLimits:
    """The rate limits of one HTTP request, for the middleware and the FastAPI
    dependency alike: one store call for every matching rule, then a refusal or the
    quota headers an admitted response carries (``headers_on_allowed``)."""

    __slots__ = ("headers_on_allowed", "rules", "style")

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        headers: str,
        headers_on_allowed: bool,
        **options: Unpack[StoreOptions],
    ) -> None:
        self.style: HeaderStyle = check_style(headers)
        self.headers_on_allowed = headers_on_allowed
        self.rules = RuleSet(rules, asyncio=True, **options)

    async def adecide(self, view: ScopeView) -> Refusal | list[tuple[str, str]] | None:
        """A Refusal; else the headers for the response (None: no rule applied)."""
        scope = view.raw
        decision = await self.rules.adecide(
            view, scope.get("method", "GET"), scope.get("path", "/")
        )
        if decision is None:
            return None
        if not decision.allowed:
            return refusal_for(decision, self.rules, self.style)
        return limit_headers(decision, self.style) if self.headers_on_allowed else []


class RateLimitMiddleware:
    """Rate limits for any ASGI app: per client, per route, global; HTTP and WebSocket.

    ``rules``: :class:`Rule` objects; all rules matching a request are decided in one
    store call, all or nothing. ``store``: a store object or URL (``"memory://"``,
    ``"redis://host:6379/0"``; default: in memory). ``on_store_error``: ``"open"``,
    ``"closed"`` (503 while the store is down) or ``"local"``. ``headers``:
    ``"ietf"``, ``"github"`` or ``"both"``; ``headers_on_allowed`` adds them to
    admitted responses too. ``trusted_proxies``: CIDRs whose ``X-Forwarded-For`` /
    ``Forwarded`` is believed for ``key="ip"`` (none by default). ``websocket``:
    :class:`WebSocketLimits` for WebSocket connections, per client as named by
    ``websocket_key`` (after the rules admitted the handshake).
    """

    def __init__(
        self,
        app: ASGIApp,
        rules: Sequence[Rule],
        *,
        store: object = None,
        on_store_error: str = "open",
        headers: str = "ietf",
        headers_on_allowed: bool = False,
        trusted_proxies: Sequence[str] = (),
        instances: int | None = None,
        retry_store_after: float = 1.0,
        websocket: WebSocketLimits | None = None,
        websocket_key: KeySpec = "ip",
    ) -> None:
        self.app = app
        self.limits = RequestLimits(
            rules,
            headers=headers,
            headers_on_allowed=headers_on_allowed,
            store=store,
            on_store_error=on_store_error,
            trusted_proxies=trusted_proxies,
            instances=instances,
            retry_store_after=retry_store_after,
        )
        self.rules = self.limits.rules
        self.websocket = None
        if websocket is not None:
            self.websocket = WebSocketGuard(
                websocket, store=self.rules.store, on_store_error=on_store_error
            )
            self.websocket_key = compile_key(websocket_key, ClientAddress.of(trusted_proxies))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            if kind == "lifespan" and self.rules.owns_store:
                send = close_on_shutdown(send, self.rules.store)
            await self.app(scope, receive, send)
            return
        view = ScopeView(scope)
        answer = await self.limits.adecide(view)
        if isinstance(answer, Refusal):
            if kind == "http":
                await send_refusal(send, answer)
            else:
                await receive()  # websocket.connect
                await send_websocket_refusal(scope, send, answer)
            return
        if answer and kind == "http":
            send = _with_headers(send, answer)
        await self._pass(kind, view, scope, receive, send)

    async def _pass(
        self, kind: str, view: ScopeView, scope: Scope, receive: Receive, send: Send
    ) -> None:
        if kind == "websocket" and self.websocket is not None:
            await self.websocket.run(self.app, scope, receive, send, self.websocket_key(view))
        else:
            await self.app(scope, receive, send)


def _with_headers(send: Send, headers: list[tuple[str, str]]) -> Send:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", ()), *raw]
        await send(message)

    return sending
