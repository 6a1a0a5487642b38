"""ASGI apps the server tests run in-process and under uvicorn (factories read SG_* env)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

Scope = dict[str, Any]


async def read_body(receive: Any) -> bytes:
    """The whole request body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def respond(send: Any, status: int, payload: dict[str, Any]) -> None:
    """A JSON response."""
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Counting:
    """A plain ASGI app that counts its executions per path (in memory or in Redis)."""

    def __init__(self, redis_url: str | None = None, prefix: str = "", delay: float = 0.0):
        self.counts: dict[str, int] = {}
        self.delay = delay
        self.prefix = prefix
        self.redis: Any = None
        if redis_url:
            import redis.asyncio

            self.redis = redis.asyncio.Redis.from_url(redis_url)

    async def count(self, name: str) -> int:
        """Count one execution of ``name``; return the running total."""
        if self.redis is not None:
            return int(await self.redis.incr(f"{self.prefix}runs:{name}"))
        self.counts[name] = self.counts.get(name, 0) + 1
        return self.counts[name]

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] == "websocket":
            await self.echo(scope, receive, send)
            return
        body = await read_body(receive)
        path = scope["path"]
        headers = dict(scope["headers"])
        key = headers.get(b"idempotency-key", b"").decode()
        tenant = headers.get(b"x-api-key", b"").decode()
        runs = await self.count(f"{path}:{tenant}:{key}")
        if self.delay:
            await asyncio.sleep(self.delay)
        if path.startswith("/flaky") and runs == 1:
            await respond(send, 500, {"error": "first attempt fails"})
            return
        if path.startswith("/boom"):
            raise RuntimeError("handler crashed")
        await respond(
            send, 201 if scope["method"] == "POST" else 200, {"runs": runs, "body": body.decode()}
        )

    async def echo(self, scope: Scope, receive: Any, send: Any) -> None:
        """WebSocket echo until the client goes."""
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            await send({"type": "websocket.send", "text": message.get("text") or ""})


def ratelimit_app() -> Any:
    """RateLimitMiddleware over Counting, configured from SG_* environment variables."""
    from stormguard.asgi import RateLimitMiddleware, Rule
    from stormguard.stores import AsyncRedisStore

    store = AsyncRedisStore(
        os.environ["SG_REDIS"], prefix=os.environ["SG_PREFIX"], socket_timeout=5, connect_timeout=5
    )
    rules = [Rule(os.environ.get("SG_LIMIT", "5/minute"), key="header:X-API-Key")]
    return RateLimitMiddleware(
        Counting(),
        rules,
        store=store,
        headers=os.environ.get("SG_HEADERS", "both"),
        on_store_error=os.environ.get("SG_MODE", "open"),
    )


def idempotent_app() -> Any:
    """IdempotencyMiddleware over a Redis-counting app (SG_REDIS, SG_PREFIX, SG_DELAY)."""
    from stormguard.asgi import IdempotencyMiddleware
    from stormguard.stores import AsyncRedisStore

    url, prefix = os.environ["SG_REDIS"], os.environ["SG_PREFIX"]
    counts_in = None if os.environ.get("SG_COUNT") == "memory" else url
    app = Counting(counts_in, prefix, delay=float(os.environ.get("SG_DELAY", "0")))
    # Generous timeouts: 50 concurrent requests on a loaded 2-core test machine.
    store = AsyncRedisStore(url, prefix=prefix, socket_timeout=5, connect_timeout=5)
    return IdempotencyMiddleware(app, store=store, scope="header:X-API-Key")


def concurrency_app() -> Any:
    """ConcurrencyMiddleware(limit=1) over an app whose /hang waits for the client to go."""
    from stormguard.asgi import ConcurrencyMiddleware

    inner = Counting()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/hang":
            await asyncio.Event().wait()
        await inner(scope, receive, send)

    return ConcurrencyMiddleware(app, limit=1)


def websocket_app() -> Any:
    """RateLimitMiddleware with WebSocket limits over the echo app (SG_LIMIT per key)."""
    from stormguard.asgi import RateLimitMiddleware, Rule, WebSocketLimits

    limits = WebSocketLimits(
        connections_per_client=2,
        messages_per_second=0.05,  # 3 at once, then one per 20 s: no refill during a test
        burst=3,
        on_message_limit=os.environ.get("SG_ON_LIMIT", "close"),  # type: ignore[arg-type]
    )
    rules = [Rule(os.environ.get("SG_LIMIT", "100/minute"), key="header:X-API-Key", paths="/ws")]
    return RateLimitMiddleware(
        Counting(), rules, websocket=limits, websocket_key="header:X-API-Key"
    )
