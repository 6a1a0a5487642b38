"""FastAPI integration: per-route limits as a dependency or a decorator.

>>> from fastapi import Depends, FastAPI
>>> from stormguard.fastapi import stormguard_limit
>>> app = FastAPI()
>>> search_limit = stormguard_limit("10/minute", key="header:X-API-Key")
>>> @app.get("/search", dependencies=[Depends(search_limit)])
... async def search(q: str) -> dict[str, str]: ...

Needs the ``fastapi`` extra (``pip install 'stormguard[fastapi]'``). For limits
over a whole app (any ASGI framework) use :mod:`stormguard.asgi`.
"""

from __future__ import annotations

from ._extras import require

require("fastapi", "fastapi")

from .server._fastapi import (  # noqa: E402
    RateLimitRefused,
    RouteLimit,
    install,
    limit,
    stormguard_limit,
)

__all__ = ["RateLimitRefused", "RouteLimit", "install", "limit", "stormguard_limit"]
