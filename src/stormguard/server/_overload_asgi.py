# OverloadMiddleware: OverloadControl in front of an ASGI app (HTTP only).
#
# Per request: its class (server/_priority.py), its attempt number (the retry
# headers, core/_attempts.py) and its client (a key spec, for the usage that
# ranks heavy clients lower) make its rank; OverloadControl admits, queues or
# refuses it (503 + Retry-After). An admitted request runs with its slot held
# until it ends -- cancelled when its client disconnects, as ConcurrencyMiddleware
# does -- and its end tells the control how it went (_concurrency.run_admitted):
#   failed   the app answered 5xx or raised;
#   dropped  the app answered 503 (it is overloaded itself): the adaptive limit
#            learns "too much" from it rather than a latency;
#   nothing  the client left before the answer: its own deadline may have been
#            short, which says nothing about the app.
# `status_path` / `metrics_path` (off by default) answer the control's state as
# JSON and as Prometheus text, before any other processing.
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .._clock import Clock
from ..core._attempts import attempt_from
from ..protection._adaptive import AdaptiveLimit
from ..protection._admission_control import AdmissionControl
from ._concurrency import serve_overloaded
from ._overload import OverloadControl
from ._priority import PrioritySpec, compile_priority
from ._refusal import send_response
from ._rules import ClientAddress, KeySpec, compile_key
from ._types import ASGIApp, Receive, Scope, Send
from ._view import ScopeView

__all__ = ["OverloadMiddleware"]


class OverloadMiddleware:
    """Shed load in priority order before the app is overloaded (503 + Retry-After).

    ``limit``: requests in flight at most -- a number or an
    :class:`stormguard.AdaptiveLimit`; ``max_wait`` / ``max_queue``: how long and
    how many wait for a slot (``standing_wait`` once the line has not been empty
    for ``standing_after`` seconds: see :class:`OverloadControl`); ``admission``:
    an :class:`stormguard.AdmissionControl` (or ``True`` / its settings). Or pass
    a ready ``control`` (:class:`OverloadControl`) shared with other front ends.

    A request's class (critical, default, sheddable) comes from ``priority`` -- a
    callable of the scope, or ``{"header": NAME, "trust": "proxies" | "always"}``
    (the header believed from ``trusted_proxies`` only, unless ``always``) -- else
    from ``routes`` (path prefix -> class), else ``default``. Under overload lower
    classes are refused first; within a class retries (``Retry-Attempt``,
    ``x-envoy-attempt-count`` ... see :func:`stormguard.attempt_number`) before
    first attempts, then the heaviest clients (named by ``key``). Refusal reasons:
    ``shed:<class>``, ``concurrency_limit``, ``admission_control``.
    ``status_path`` / ``metrics_path`` serve the state as JSON / Prometheus text.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        control: OverloadControl | None = None,
        limit: int | AdaptiveLimit = 100,
        max_queue: int | None = None,
        max_wait: float = 0.05,
        admission: AdmissionControl | bool | Mapping[str, Any] | None = None,
        priority: PrioritySpec = None,
        routes: Mapping[str, str] | None = None,
        default: str = "default",
        key: KeySpec | None = "ip",
        trusted_proxies: Sequence[str] = (),
        retry_after: float = 1.0,
        cancel_on_disconnect: bool = True,
        status_path: str | None = None,
        metrics_path: str | None = None,
        clock: Clock | None = None,
        standing_wait: float | None = 0.005,
        standing_after: float = 0.1,
    ) -> None:
        self.app = app
        self.control = control or OverloadControl(
            limit,
            max_queue=max_queue,
            max_wait=max_wait,
            admission=admission,
            retry_after=retry_after,
            clock=clock,
            standing_wait=standing_wait,
            standing_after=standing_after,
        )
        address = ClientAddress.of(trusted_proxies)
        self.classify = compile_priority(priority, routes=routes, address=address, default=default)
        self.key_of = None if key is None else compile_key(key, address)
        self.cancel_on_disconnect = cancel_on_disconnect
        self.status_path = status_path
        self.metrics_path = metrics_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "/")
        if path == self.status_path or path == self.metrics_path:
            await self._state(path, send)
            return
        view = ScopeView(scope)
        client = None if self.key_of is None else self.key_of(view)
        await serve_overloaded(
            self.control,
            (self.classify(view, path), attempt_from(view.header), client),
            self.app,
            scope,
            receive,
            send,
            cancel_on_disconnect=self.cancel_on_disconnect,
        )

    async def _state(self, path: str, send: Send) -> None:
        if path == self.status_path:
            body = json.dumps(self.control.status(), separators=(",", ":")).encode()
            await send_response(send, 200, [("Content-Type", "application/json")], body)
        else:
            text = self.control.metrics_text().encode()
            await send_response(send, 200, [("Content-Type", "text/plain; version=0.0.4")], text)
