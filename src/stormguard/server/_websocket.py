# WebSocket limits: long-lived connections get their own.
#
#   connections_per_client  concurrent connections of one client (this process);
#                           over it the handshake is refused: 429 + Retry-After via
#                           websocket.http.response (403/close without it). The
#                           slot comes back when the connection ends, however it
#                           ends: the app returning, raising, or the peer vanishing.
#   messages_per_second     inbound messages per connection (token bucket with
#   + burst                 `burst`, the core algorithm stepped in place: no store);
#   client_messages_per_second  inbound messages of one client over all its
#                           connections (a limiter on the store, so a fleet shares it);
#   max_message             bytes (text: UTF-8) of one inbound message; over it the
#                           connection is closed with 1009.
# Over a message rate: on_message_limit="close" closes with 1008 and a reason;
# "drop" discards the message and keeps the connection.
# When the guard closes a connection it tells the app with websocket.disconnect
# (same code) and swallows what the app still sends.
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Literal

from .. import AsyncRateLimiter, TokenBucket
from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError
from ._refusal import Refusal, send_websocket_refusal
from ._types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["WebSocketGuard", "WebSocketLimits"]


def _optional_positive(name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(name, f"must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class WebSocketLimits:
    """Limits for WebSocket connections (None: no limit of that kind).

    ``connections_per_client``: concurrent connections per client (per process).
    ``messages_per_second`` / ``burst``: inbound messages per connection.
    ``client_messages_per_second`` / ``client_burst``: per client, all connections
    (shared through the store). ``max_message``: bytes per inbound message (close
    1009). ``on_message_limit``: ``"close"`` (1008 with a reason) or ``"drop"``.
    """

    connections_per_client: int | None = None
    messages_per_second: float | None = None
    burst: float | None = None
    client_messages_per_second: float | None = None
    client_burst: float | None = None
    max_message: int | None = None
    on_message_limit: Literal["close", "drop"] = "close"

    def __post_init__(self) -> None:
        for name in (
            "connections_per_client",
            "messages_per_second",
            "burst",
            "client_messages_per_second",
            "client_burst",
            "max_message",
        ):
            _optional_positive(name, getattr(self, name))
        if self.on_message_limit not in ("close", "drop"):
            raise ConfigError(
                "on_message_limit", f"must be 'close' or 'drop', got {self.on_message_limit!r}"
            )


class _Closed(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class WebSocketGuard:
    """Applies :class:`WebSocketLimits` around one ASGI app's WebSocket connections.

    ``store`` backs the per-client message limiter (an async store; default memory).
    """

    def __init__(
        self,
        limits: WebSocketLimits,
        *,
        store: Any = None,
        on_store_error: str = "open",
        clock: Clock | None = None,
    ) -> None:
        self.limits = limits
        self.clock: Clock = clock or SYSTEM_CLOCK
        self._connections: dict[str, int] = {}
        self._lock = threading.Lock()
        self._bucket = (
            None
            if limits.messages_per_second is None
            else TokenBucket(limits.messages_per_second, limits.burst or limits.messages_per_second)
        )
        rate = limits.client_messages_per_second
        self._client_limiter = (
            None
            if rate is None
            else AsyncRateLimiter(
                TokenBucket(rate, limits.client_burst or rate),
                store,
                name="ws-messages",
                on_store_error=on_store_error,  # type: ignore[arg-type]
                clock=clock,
            )
        )

    def connections(self, client: str) -> int:
        """Open connections of ``client`` in this process."""
        return self._connections.get(client, 0)

    def _enter(self, client: str) -> bool:
        cap = self.limits.connections_per_client
        with self._lock:
            count = self._connections.get(client, 0)
            if cap is not None and count >= cap:
                return False
            self._connections[client] = count + 1
            return True

    def _leave(self, client: str) -> None:
        with self._lock:
            count = self._connections.get(client, 0) - 1
            if count > 0:
                self._connections[client] = count
            else:
                self._connections.pop(client, None)

    async def run(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, client: str | None
    ) -> None:
        """Run ``app`` for one WebSocket connection of ``client`` under the limits."""
        if client is None:
            client = ""
        if not self._enter(client):
            await receive()  # websocket.connect
            cap = self.limits.connections_per_client
            refusal = Refusal.of(
                429,
                f"at most {cap} concurrent WebSocket connections per client",
                reason="limited:connections",
                retry_after=1.0,
            )
            await send_websocket_refusal(scope, send, refusal)
            return
        try:
            await self._connection(app, scope, receive, send, client)
        finally:
            self._leave(client)

    async def _connection(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, client: str
    ) -> None:
        limits = self.limits
        bucket, limiter = self._bucket, self._client_limiter
        state: list[Any] = [None]  # the connection's token bucket state
        closed: list[_Closed] = []

        async def close(code: int, reason: str) -> Message:
            closed.append(_Closed(code, reason))
            await send({"type": "websocket.close", "code": code, "reason": reason})
            return {"type": "websocket.disconnect", "code": code, "reason": reason}

        async def guarded_receive() -> Message:
            while True:
                if closed:
                    return {"type": "websocket.disconnect", "code": closed[0].code}
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                if limits.max_message is not None:
                    text = message.get("text")
                    size = (
                        len(text.encode()) if text is not None else len(message.get("bytes") or b"")
                    )
                    if size > limits.max_message:
                        return await close(1009, f"message over {limits.max_message} bytes")
                allowed = True
                if bucket is not None:
                    outcome = bucket.advance(state[0], self.clock.monotonic(), 1.0)
                    state[0], allowed = outcome[0], outcome[1]
                if allowed and limiter is not None:
                    allowed = (await limiter.hit(client)).allowed
                if allowed:
                    return message
                if limits.on_message_limit == "close":
                    return await close(1008, "message rate exceeded")
                # "drop": discard it and wait for the next one

        async def guarded_send(message: Message) -> None:
            if not closed:
                await send(message)

        await app(scope, guarded_receive, guarded_send)
