"""Server-side protection for any ASGI 3 app (no framework import).

>>> from stormguard.asgi import RateLimitMiddleware, Rule
>>> app = RateLimitMiddleware(app, rules=[
...     Rule("10/minute", key="header:X-API-Key"),   # per client
...     Rule("1000/second", key="global"),            # everyone together
... ], store="redis://127.0.0.1:6379/0", headers="ietf")

Works under uvicorn, hypercorn, granian and in FastAPI, Starlette or Litestar
(``app.add_middleware(RateLimitMiddleware, rules=[...])``). Redis stores need the
``redis`` extra.
"""

from __future__ import annotations

from .server._concurrency import ConcurrencyMiddleware
from .server._idempotency import IdempotencyMiddleware
from .server._overload import OverloadControl
from .server._overload_asgi import OverloadMiddleware
from .server._ratelimit import RateLimitMiddleware
from .server._rules import Rule
from .server._websocket import WebSocketLimits

__all__ = [
    "ConcurrencyMiddleware",
    "IdempotencyMiddleware",
    "OverloadControl",
    "OverloadMiddleware",
    "RateLimitMiddleware",
    "Rule",
    "WebSocketLimits",
]
