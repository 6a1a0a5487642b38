# The WebSocket leg. Before the handshake: the route's limits (one store call), the
# client's concurrent connections (a Concurrency lease in the store, so it holds
# across gateway processes, released whatever ends the socket), its connection rate,
# and the upstream's breaker -- a refusal is a real 429/503 + Retry-After when the
# ASGI server supports `websocket.http.response`. Then two pumps copy text and
# binary messages both ways and pass close codes through; a message over
# `max_message` closes with 1009, a client over its message rate with 1008.
# Ping/pong are answered on each hop (ASGI does not expose control frames).
# On shutdown the gateway closes every socket with 1001 (going away).
from __future__ import annotations

import asyncio
import logging
from typing import Any

from .. import AsyncRateLimiter
from .._errors import CircuitOpen
from ..core._limiters import Concurrency, TokenBucket
from ..server._refusal import Refusal, rate_limited, send_websocket_refusal, unavailable
from ..server._types import Receive, Scope, Send
from ..server._view import ScopeView
from ..server._websocket import WebSocketGuard, WebSocketLimits
from ._clients import client_id
from ._config import WebSocketSettings
from ._runtime import CLIENT_KEY, CompiledRoute, Runtime
from ._urls import split_userinfo
from ._wire import request_headers

log = logging.getLogger("stormguard.gateway")

__all__ = ["WebSocketHub", "handle_websocket"]

# A connection slot is a lease in the store, renewed while the socket lives, so a
# gateway that dies frees its clients' slots within LEASE seconds.
LEASE = 90.0
GOING_AWAY = 1001
POLICY = 1008
TOO_BIG = 1009


class _Limits:
    """The limiters of one WebSocket route (built lazily, kept per runtime)."""

    def __init__(self, rt: Runtime, settings: WebSocketSettings, route: str) -> None:
        store = rt.store
        mode = rt.config.on_store_error
        self.connections = (
            AsyncRateLimiter(
                Concurrency(settings.connections_per_client, lease=LEASE),
                store,
                name=f"ws-conn:{route}",
                on_store_error=mode,
            )
            if settings.connections_per_client
            else None
        )
        self.connect_rate = (
            AsyncRateLimiter(
                TokenBucket(
                    settings.connections_per_second, max(1.0, settings.connections_per_second)
                ),
                store,
                name=f"ws-rate:{route}",
                on_store_error=mode,
            )
            if settings.connections_per_second
            else None
        )
        # Message limits are the server side's WebSocketGuard: per connection in
        # memory, per client through the store, max_message -> 1009, rate -> 1008.
        self.guard = WebSocketGuard(
            WebSocketLimits(
                messages_per_second=settings.messages_per_second,
                burst=settings.burst,
                client_messages_per_second=settings.client_messages_per_second,
                client_burst=settings.burst,
                max_message=settings.max_message,
            ),
            store=store,
            on_store_error=mode,
        )


class WebSocketHub:
    """The open WebSocket connections of a process (closed with 1001 on shutdown)."""

    def __init__(self) -> None:
        self.open: set[asyncio.Task[Any]] = set()
        self.closing = False
        self._limits: dict[tuple[int, str], _Limits] = {}

    def limits(self, rt: Runtime, route: CompiledRoute) -> _Limits:
        key = (id(rt), route.name)
        if self._limits and next(iter(self._limits))[0] != id(rt):
            self._limits = {}  # a reload: open connections keep the limits they hold
        found = self._limits.get(key)
        if found is None:
            assert route.websocket is not None
            found = self._limits[key] = _Limits(rt, route.websocket, route.name)
        return found

    def shutdown(self) -> None:
        """Close every open connection with 1001 (the pumps see the cancellation)."""
        self.closing = True
        for task in list(self.open):
            task.cancel()


async def handle_websocket(
    rt: Runtime, hub: WebSocketHub, scope: Scope, receive: Receive, send: Send
) -> None:
    """Serve one WebSocket connection through ``rt``."""
    host = dict(scope["headers"]).get(b"host")
    hostname = host.decode("latin-1").rsplit(":", 1)[0].lower() if host else None
    route = rt.match(scope["path"], "GET", hostname)
    message = await receive()  # websocket.connect
    if message["type"] != "websocket.connect":
        return
    if route is None or route.websocket is None or hub.closing:
        reason = "not_found" if not hub.closing else "shutting_down"
        await send(
            {
                "type": "websocket.close",
                "code": POLICY if not hub.closing else GOING_AWAY,
                "reason": reason,
            }
        )
        rt.metrics.count(route.name if route else "-", reason)
        return
    view = ScopeView(scope)
    _, key = rt.identity.identify(view)
    scope[CLIENT_KEY] = key
    limits = hub.limits(rt, route)
    refusal, lease = await _admit(rt, route, limits, view, scope, key)
    if refusal is not None:
        rt.metrics.count(route.name, refusal.reason)
        rt.metrics.refused_clients.labels(client_id(key), refusal.reason).inc()
        await send_websocket_refusal(scope, send, refusal)
        return
    task = asyncio.current_task()
    assert task is not None
    hub.open.add(task)
    gauge = rt.metrics.websockets.labels(route.name)
    gauge.inc()
    rt.metrics.count(route.name, "allowed")

    async def leg(scope: Scope, receive: Receive, send: Send) -> None:
        await _proxy(rt, route, scope, receive, send, hub)

    renewer = (
        asyncio.ensure_future(_renew(limits.connections, key, lease))
        if lease is not None and limits.connections is not None
        else None
    )
    try:
        await limits.guard.run(leg, scope, receive, send, key)
    finally:
        if renewer is not None:
            renewer.cancel()
        hub.open.discard(task)
        gauge.dec()
        if lease is not None and limits.connections is not None:
            await asyncio.shield(limits.connections.release(key, lease))


async def _renew(limiter: Any, key: str, lease: str) -> None:
    while True:
        await asyncio.sleep(LEASE / 3)
        await limiter.renew(key, lease)


async def _admit(
    rt: Runtime, route: CompiledRoute, limits: _Limits, view: ScopeView, scope: Scope, key: str
) -> tuple[Refusal | None, str | None]:
    if route.rules is not None:
        decision = await route.rules.adecide(view, "GET", scope["path"])
        if decision is not None and not decision.allowed:
            return rate_limited(decision, "ietf"), None
    if limits.connect_rate is not None:
        decision = await limits.connect_rate.hit(key)
        if not decision.allowed:
            return rate_limited(decision, "ietf"), None
    pool = route.upstream
    if pool.breaker is not None:
        try:
            permit = await pool.breaker.aacquire()
        except CircuitOpen as exc:
            detail = f"upstream {pool.name!r} is failing; its circuit is open"
            return unavailable(exc.remaining, "breaker_open", detail), None
        await permit.arelease()  # the handshake below reports the outcome
    lease = None
    if limits.connections is not None:
        decision = await limits.connections.hit(key)
        if not decision.allowed:
            refusal = rate_limited(decision, "ietf")
            return Refusal.of(
                429,
                "too many open WebSocket connections for this client",
                reason=f"limited:{decision.name}",
                retry_after=max(1.0, min(decision.retry_after, 60.0)),
                headers=[h for h in refusal.headers if h[0] != "Content-Type"],
            ), None
        lease = decision.lease
    return None, lease


async def _proxy(
    rt: Runtime, route: CompiledRoute, scope: Scope, receive: Receive, send: Send, hub: WebSocketHub
) -> None:
    import aiohttp

    settings = route.websocket
    assert settings is not None
    pool = route.upstream
    target = pool.pick()
    base, authorization = split_userinfo(target.base)  # credentials: Authorization
    base = base.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    query = scope.get("query_string") or b""
    url = base + scope["path"] + ("?" + query.decode("latin-1") if query else "")
    view = ScopeView(scope)
    headers = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in request_headers(scope, rt.identity.trusted_peer(view))
        if not k.lower().startswith(b"sec-websocket")
        and not (authorization is not None and k.lower() == b"authorization")
    ]
    if authorization is not None:
        headers.append(("Authorization", authorization.decode("ascii")))
    protocols = [
        p.strip()
        for k, v in scope["headers"]
        if k == b"sec-websocket-protocol"
        for p in v.decode("latin-1").split(",")
    ]
    try:
        upstream = await pool.session().ws_connect(
            url,
            headers=headers,
            protocols=protocols,
            max_msg_size=settings.max_message,
            server_hostname=pool.server_name if pool.tls is not None else None,
            autoping=True,
            timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        pool.report(target, True)
        await _record(pool, failure=True)
        if isinstance(exc, aiohttp.ClientSSLError):  # a wrong CA or name: say why
            log.warning("TLS to upstream %s (WebSocket) failed: %s", target.base, exc)
        status = 504 if isinstance(exc, TimeoutError) else 502
        reason = "upstream_timeout" if status == 504 else "upstream_error"
        await send_websocket_refusal(
            scope, send, Refusal.of(status, "upstream WebSocket failed", reason=reason)
        )
        return
    pool.report(target, False)
    await _record(pool, failure=False)
    accept: dict[str, Any] = {"type": "websocket.accept"}
    if upstream.protocol:
        accept["subprotocol"] = upstream.protocol
    await send(accept)
    close_code: list[Any] = [1000, ""]
    to_up = asyncio.ensure_future(_client_to_upstream(rt, route, receive, upstream, close_code))
    to_client = asyncio.ensure_future(_upstream_to_client(rt, route, upstream, send, close_code))
    try:
        _done, _ = await asyncio.wait({to_up, to_client}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        close_code[:] = [GOING_AWAY, "gateway shutting down"]
    finally:
        for task in (to_up, to_client):
            task.cancel()
        await asyncio.gather(to_up, to_client, return_exceptions=True)
        code, reason = int(str(close_code[0])), str(close_code[1])
        if not upstream.closed:
            await upstream.close(code=code if code != TOO_BIG else POLICY, message=reason.encode())
        try:
            await send({"type": "websocket.close", "code": code, "reason": reason})
        except Exception:  # the client is gone already
            pass


async def _record(pool: Any, *, failure: bool) -> None:
    if pool.breaker is None:
        return
    try:
        permit = await pool.breaker.aacquire()
    except CircuitOpen:
        return
    await permit.arecord(failure=failure)


async def _client_to_upstream(
    rt: Runtime, route: CompiledRoute, receive: Receive, upstream: Any, close_code: list[Any]
) -> None:
    counter = rt.metrics.ws_messages.labels(route.name, "in")
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            code = message.get("code", 1000)
            close_code[:] = [code, message.get("reason") or ""]
            if code in (POLICY, TOO_BIG):  # the guard closed it: a refusal
                reason = "limited:messages" if code == POLICY else "too_large"
                rt.metrics.count(route.name, reason)
            return
        counter.inc()
        text = message.get("text")
        if text is not None:
            await upstream.send_str(text)
        else:
            await upstream.send_bytes(message.get("bytes") or b"")


async def _upstream_to_client(
    rt: Runtime, route: CompiledRoute, upstream: Any, send: Send, close_code: list[Any]
) -> None:
    import aiohttp

    counter = rt.metrics.ws_messages.labels(route.name, "out")
    async for message in upstream:
        if message.type == aiohttp.WSMsgType.TEXT:
            await send({"type": "websocket.send", "text": message.data})
        elif message.type == aiohttp.WSMsgType.BINARY:
            await send({"type": "websocket.send", "bytes": message.data})
        elif message.type == aiohttp.WSMsgType.ERROR:
            close_code[:] = [
                TOO_BIG if "too big" in str(message.data).lower() else 1011,
                "upstream error",
            ]
            return
        counter.inc()
    code = upstream.close_code
    close_code[:] = [code if code and code not in (1005, 1006) else 1000, ""]
