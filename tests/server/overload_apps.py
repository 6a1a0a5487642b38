"""ASGI apps of the overload tests (run in-process and under uvicorn)."""

from __future__ import annotations

import asyncio
from typing import Any

from asgi_apps import respond

Scope = dict[str, Any]


class Held:
    """An app whose /hold requests wait until released; it records the order requests
    entered it (by their `X-Name` header). /fail answers 500, anything else 200."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered: list[str] = []
        self.arrived = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = dict(scope.get("headers", ()))
        self.entered.append(headers.get(b"x-name", b"").decode())
        self.arrived.set()
        if scope["path"].startswith("/hold"):
            await self.gate.wait()
        await respond(send, 500 if scope["path"] == "/fail" else 200, {"ok": True})


def overload_app() -> Any:
    """OverloadMiddleware(limit=1, a line of 2, X-Priority believed from anyone) over a
    Held app; /release opens the gate and /entered lists the entry order (both
    answered before the middleware)."""
    from stormguard.asgi import OverloadMiddleware

    held = Held()
    guarded = OverloadMiddleware(
        held,
        limit=1,
        max_queue=2,
        max_wait=30.0,
        standing_wait=None,  # the test holds the line on purpose, step by step
        priority={"header": "x-priority", "trust": "always"},
        status_path="/status",
        retry_after=2,
    )

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/release":
            held.gate.set()
            await respond(send, 200, {"released": True})
        elif scope["type"] == "http" and scope["path"] == "/entered":
            await respond(send, 200, held.entered)
        else:
            await guarded(scope, receive, send)

    return app
