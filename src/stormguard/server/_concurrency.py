# ConcurrencyMiddleware: Admission in front of an ASGI app (HTTP only; WebSocket
# connections have their own limits, see _websocket.py).
#
# Slots come back on completion, on an exception, and on client disconnect: a pump
# task owns the server's `receive` and hands messages to the app through a
# one-slot queue (body streaming keeps its backpressure); when it sees
# `http.disconnect` before the app has finished, it cancels the app -- a handler
# working for a client that left only holds a slot somebody else could use. The
# middleware then returns normally (the cancellation was ours, not the server's).
#
# adaptive=...: the slots are an OverloadControl's (server/_overload.py) on an
# AdaptiveLimit, and `run_admitted` runs each admitted request and tells the
# control how it ended (OverloadMiddleware runs requests the same way).
from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import ConfigError
from ..core._attempts import attempt_from
from ..core._priority import Priority
from ..protection._adaptive import AdaptiveLimit
from ._admission import AdmissionGroups, SharedAdmission
from ._decide import close_on_shutdown, open_store
from ._overload import OverloadControl, Ticket
from ._refusal import Refusal, send_refusal
from ._rules import ClientAddress, KeySpec, compile_key
from ._types import ASGIApp, Message, Receive, Scope, Send
from ._view import ScopeView

__all__ = [
    "ConcurrencyMiddleware",
    "run_admitted",
    "run_cancelling_on_disconnect",
    "serve_overloaded",
]


async def run_cancelling_on_disconnect(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send
) -> None:
    """Run ``app``; cancel it if the client disconnects before it is done."""
    queue: asyncio.Queue[Message] = asyncio.Queue(maxsize=1)
    task = asyncio.current_task()
    assert task is not None
    state = {"done": False, "gone": False}

    async def pump() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect" and not state["done"]:
                state["gone"] = True
                task.cancel()
                return
            await queue.put(message)

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            state["done"] = True  # answered: a disconnect now is the normal end
        await send(message)

    pumping = asyncio.ensure_future(pump())
    try:
        await app(scope, queue.get, sending)
    except asyncio.CancelledError:
        if not state["gone"]:
            raise
        task.uncancel()
    finally:
        state["done"] = True
        pumping.cancel()


async def run_admitted(
    control: OverloadControl,
    ticket: Ticket,
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    cancel_on_disconnect: bool = True,
) -> None:
    """Run ``app`` for an admitted request and tell ``control`` how it ended: a 5xx or
    an exception failed it, a 503 also says "overloaded" (dropped); a client that
    left before the answer teaches nothing (its own deadline may have been short)."""
    status = 0

    async def sending(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        await send(message)

    try:
        if cancel_on_disconnect:
            await run_cancelling_on_disconnect(app, scope, receive, sending)
        else:
            await app(scope, receive, sending)
    except BaseException:
        control.leave(ticket, failed=True, measured=False)
        raise
    if status == 0:
        control.release(ticket)  # the client left before an answer
    else:
        control.leave(ticket, failed=status >= 500, dropped=status == 503)


async def serve_overloaded(
    control: OverloadControl,
    request: tuple[Priority, int, str | None],
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    cancel_on_disconnect: bool = True,
) -> None:
    """Admit a request of ``(priority, attempt, client)`` through ``control`` and run
    ``app`` for it (:func:`run_admitted`), or send the refusal."""
    ticket = await control.aenter(*request)
    if not isinstance(ticket, Ticket):
        await send_refusal(send, ticket)
        return
    await run_admitted(
        control, ticket, app, scope, receive, send, cancel_on_disconnect=cancel_on_disconnect
    )


class ConcurrencyMiddleware:
    """A bulkhead for an ASGI app: requests in flight per route group and per client.

    ``limit``: requests in flight (the default group); ``groups``: path prefix ->
    its own limit (longest prefix wins). ``per_client``: each client's share of a
    group (None: no share cap), the client named by ``key`` (``"ip"``,
    ``"header:NAME"`` or a callable of the scope). A request waits up to
    ``max_wait`` seconds for a slot, then gets 503 + ``Retry-After: retry_after``.
    Slots are released on completion, error and client disconnect (the handler is
    cancelled when its client goes; ``cancel_on_disconnect=False`` keeps it running).
    Slots are per process (with N workers, N times the limit) unless ``store`` is
    given (an async store object or URL): then ``limit`` and ``per_client`` hold
    across the fleet as leases in the store (no waiting; a dead holder's slot frees
    after ``lease`` seconds; ``on_store_error`` as for the limiters; ``groups`` are
    per process).

    ``adaptive``: ``True``, an :class:`stormguard.AdaptiveLimit` or a mapping of its
    settings -- the limit then follows measured latency (``limit`` is its upper
    bound unless the settings say ``max_limit``), waiters are served retries last
    and heavy clients (by ``key``) after light ones, and a refusal's reason is
    ``concurrency_limit``. Per process; not combined with ``per_client``,
    ``groups`` or ``store``. ``self.overload.status()`` is its state.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int = 100,
        per_client: int | None = None,
        key: KeySpec = "ip",
        max_wait: float = 0.0,
        groups: Mapping[str, int] | None = None,
        retry_after: float = 1.0,
        trusted_proxies: Sequence[str] = (),
        cancel_on_disconnect: bool = True,
        store: object = None,
        on_store_error: str = "open",
        lease: float = 60.0,
        adaptive: bool | AdaptiveLimit | Mapping[str, Any] | None = None,
    ) -> None:
        self.app = app
        self.shared = None
        self.owned_store = None
        self.overload = _adaptive_control(adaptive, limit, max_wait, retry_after)
        if self.overload is not None and (per_client, groups, store) != (None, None, None):
            raise ConfigError("adaptive", "does not combine with per_client, groups or store")
        if store is not None:
            opened = open_store(store, asyncio=True)
            self.owned_store = opened if isinstance(store, str) else None
            self.shared = SharedAdmission(
                limit,
                store=opened,
                per_client=per_client,
                lease=lease,
                retry_after=retry_after,
                on_store_error=on_store_error,
            )
        self.admission = AdmissionGroups(
            limit, groups=groups, per_client=per_client, max_wait=max_wait, retry_after=retry_after
        )
        self.key_of = compile_key(key, ClientAddress.of(trusted_proxies))
        self.per_client = per_client is not None
        self.cancel_on_disconnect = cancel_on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan" and self.owned_store is not None:
                send = close_on_shutdown(send, self.owned_store)
            await self.app(scope, receive, send)
            return
        if self.overload is not None:
            await self._adaptive(self.overload, scope, receive, send)
            return
        client = self.key_of(ScopeView(scope)) if self.per_client else None
        if self.shared is not None:
            await self._shared(self.shared, client, scope, receive, send)
            return
        admission = self.admission.for_path(scope.get("path", "/"))
        refusal = await admission.aenter(client)
        if refusal is not None:
            await send_refusal(send, refusal)
            return
        try:
            await self._run(scope, receive, send)
        finally:
            admission.leave(client)

    async def _run(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.cancel_on_disconnect:
            await run_cancelling_on_disconnect(self.app, scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _adaptive(
        self, control: OverloadControl, scope: Scope, receive: Receive, send: Send
    ) -> None:
        view = ScopeView(scope)
        await serve_overloaded(
            control,
            (Priority.DEFAULT, attempt_from(view.header), self.key_of(view)),
            self.app,
            scope,
            receive,
            send,
            cancel_on_disconnect=self.cancel_on_disconnect,
        )

    async def _shared(
        self,
        shared: SharedAdmission,
        client: str | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        admitted = await shared.aenter(client)
        if isinstance(admitted, Refusal):
            await send_refusal(send, admitted)
            return
        try:
            await self._run(scope, receive, send)
        finally:
            await shared.aleave(client, admitted)


def _adaptive_control(
    adaptive: bool | AdaptiveLimit | Mapping[str, Any] | None,
    limit: int,
    max_wait: float,
    retry_after: float,
) -> OverloadControl | None:
    # ConcurrencyMiddleware(adaptive=...): an OverloadControl on an AdaptiveLimit.
    if adaptive is None or adaptive is False:
        return None
    if adaptive is True:
        adaptive = AdaptiveLimit(max_limit=limit)
    elif isinstance(adaptive, Mapping):
        adaptive = AdaptiveLimit(**{"max_limit": limit, **adaptive})
    elif not isinstance(adaptive, AdaptiveLimit):
        raise ConfigError("adaptive", "True, an AdaptiveLimit or a mapping of its settings")
    return OverloadControl(adaptive, max_wait=max_wait, retry_after=retry_after)
