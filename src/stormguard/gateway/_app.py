# The gateway as two ASGI apps: the proxy (HTTP + WebSocket on `listen.http`) and
# the admin app (`listen.admin`: /metrics, /status, /history, /healthz, /readyz,
# /dashboard).
#
# `Gateway.runtime` is the one mutable reference: a reload builds a new Runtime and
# assigns it; every request reads it once on arrival, so a request never sees half
# of two configurations.
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from .._clock import Clock
from ..server._types import Receive, Scope, Send
from ._config import GatewayConfig
from ._dashboard import DASHBOARD_PATHS, send_dashboard
from ._metrics import GatewayMetrics, StatusBuilder
from ._runtime import Runtime
from ._ws import WebSocketHub, handle_websocket
from .chain import driver_of, entry_for, handle_http

__all__ = ["AdminApp", "Gateway"]

log = logging.getLogger("stormguard.gateway")


class Gateway:
    """The proxy ASGI app over a swappable :class:`Runtime`.

    ``clock`` (default: the system clock) is handed to every time-dependent part of
    every runtime (see :class:`Runtime`): a test passes a ``FakeClock`` and advances
    it to run a breaker's cooldown, a limit's window or a shaping delay.
    """

    def __init__(
        self, config: GatewayConfig, *, workers: int = 1, clock: Clock | None = None
    ) -> None:
        self.metrics = GatewayMetrics()
        self.workers = workers
        # STORMGUARD_GATEWAY_DRIVER (chain/__init__.py): a bad value stops the start.
        self.driver = driver_of()
        self._entry = entry_for(self.driver)
        self.runtime = Runtime(config, self.metrics, workers=workers, clock=clock)
        self.clock: Clock = self.runtime.clock
        # The chain's entry for the current runtime (chain.begin, or begin_resume,
        # bound to it), ``fast(proto, scope, keep_alive, host)``: the listener calls it
        # for each request it can hand over with its head (None: the listener runs
        # the ASGI app for it). Replaced with the runtime.
        self.fast: Callable[..., Any] = partial(self._entry, self.runtime)
        self.hub = WebSocketHub()
        self.ready = False
        self._refresher: asyncio.Task[None] | None = None

    def swap(self, config: GatewayConfig) -> None:
        """Atomically replace the configuration (the new one is already validated)."""
        new = Runtime(config, self.metrics, workers=self.workers, previous=self.runtime)
        old, self.runtime = self.runtime, new
        self.fast = partial(self._entry, new)
        asyncio.get_running_loop().call_later(
            old.config.drain + 1.0, lambda: asyncio.ensure_future(new.close_retired())
        )

    def allows_trace(self, path: str, host: str | None) -> bool:
        """Whether a route lists TRACE for this path and host (else the listener
        answers TRACE with 405)."""
        route = self.runtime.match(path, "TRACE", host)
        return route is not None and route.methods is not None and "TRACE" in route.methods

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await handle_http(self.runtime, scope, receive, send)
        elif kind == "websocket":
            await handle_websocket(self.runtime, self.hub, scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def start(self) -> None:
        """Begin publishing gauges; mark the gateway ready."""
        if self._refresher is None:
            self._refresher = asyncio.ensure_future(self._refresh())
        self.ready = True

    async def stop(self) -> None:
        """Close WebSockets (1001), connection pools and the store."""
        self.ready = False
        self.hub.shutdown()
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None
        self.metrics.flush()
        await self.runtime.aclose()

    async def _refresh(self) -> None:
        while True:
            try:
                self.metrics.flush()
                await self.runtime.refresh_gauges()
            except Exception:  # a store hiccup must not stop the gauges
                log.debug("gauge refresh failed", exc_info=True)
            await asyncio.sleep(0.25)


class AdminApp:
    """/metrics, /status, /history, /healthz, /readyz (``ready`` says whether to accept
    traffic).

    Between lifespan startup and shutdown a sampler closes a bucket of the status
    builder's history every ``history.bucket`` seconds (the clock is ``clock``, Unix
    seconds), so /history holds the last few minutes whether anyone watched or not.
    """

    def __init__(
        self, status: StatusBuilder, ready: Any = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.status = status
        self.ready = ready  # () -> bool
        self.clock = clock
        self._sampler: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        status = self.status
        while True:
            try:
                status.sample(self.clock())
            except Exception:  # a torn multiprocess file must not end the history
                log.debug("history sample failed", exc_info=True)
            await asyncio.sleep(status.history.bucket)

    def start(self) -> None:
        """Start the history sampler (what ASGI lifespan startup does)."""
        if self._sampler is None:
            self.status.history.start(self.clock())
            self._sampler = asyncio.ensure_future(self._sample())

    def stop(self) -> None:
        """Stop the history sampler (what ASGI lifespan shutdown does)."""
        if self._sampler is not None:
            self._sampler.cancel()
            self._sampler = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self.start()
                elif message["type"] == "lifespan.shutdown":
                    self.stop()
                reply = message["type"] + ".complete"
                await send({"type": reply})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/metrics":
            body = self.status.metrics_text()
            await _send(send, 200, body, b"text/plain; version=0.0.4; charset=utf-8")
        elif path == "/status":
            body = json.dumps(self.status.status(), sort_keys=True).encode()
            await _send(send, 200, body, b"application/json")
        elif path == "/history":
            body = json.dumps(self.status.history_document(), sort_keys=True).encode()
            await _send(send, 200, body, b"application/json")
        elif path == "/healthz":
            await _send(send, 200, b'{"status":"ok"}', b"application/json")
        elif path == "/readyz":
            ready = self.ready() if self.ready is not None else True
            body = b'{"status":"ready"}' if ready else b'{"status":"not ready"}'
            await _send(send, 200 if ready else 503, body, b"application/json")
        elif path in DASHBOARD_PATHS:
            await send_dashboard(send, path)
        else:
            await _send(send, 404, b'{"status":"not found"}', b"application/json")


async def _send(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
