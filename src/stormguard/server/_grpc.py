# gRPC server interceptors (grpc and grpc.aio): the same rules, admission and
# idempotency conversation as the ASGI middlewares, translated to gRPC.
#
#   keys        `header:NAME` reads request metadata; `ip` is the peer address
#               without its port; rules match the full method "/pkg.Service/Method"
#               as their path prefix (gRPC methods count as POST);
#   over limit  UNAVAILABLE + trailer `grpc-retry-pushback-ms` (default: a gRPC
#               client with a retryPolicy waits exactly that long) or
#               RESOURCE_EXHAUSTED (clients do not retry it); an answer that can
#               never fit sends a pushback of -1 (gRPC A6: do not retry);
#   full        (bulkhead, store down in closed mode) UNAVAILABLE + pushback;
#   idempotency unary calls carrying the `idempotency-key` metadata run once; the
#               serialized response is stored and replayed (trailer
#               `idempotent-replayed: true`); a call ending in an error status is
#               released; in flight -> ABORTED + pushback; other request with the
#               same key or a bad key -> INVALID_ARGUMENT; store down -> UNAVAILABLE.
#   overload    (overload=OverloadControl(...)) the call's class (`priority`:
#               a callable or a metadata header; `priority_routes`: method
#               prefix -> class), its attempt (`grpc-previous-rpc-attempts` + 1,
#               or the HTTP retry headers) and its client (`overload_key`) rank it;
#               refused under overload -> UNAVAILABLE + pushback; the call's end
#               (an error status or exception: failed; UNAVAILABLE or
#               RESOURCE_EXHAUSTED: dropped; CANCELLED or DEADLINE_EXCEEDED: the
#               caller left, nothing learnt) feeds the control.
# The refusal is decided where the peer is known (inside the call), so the
# interceptor wraps each handler's behaviour; streaming calls hold their
# concurrency slot until the response stream ends.
from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, NoReturn
from urllib.parse import unquote

import grpc
import grpc.aio

from .._errors import ConfigError
from ..core._attempts import attempt_from
from ..core._decision import Decision
from ..core._idempotency import fingerprint
from ._admission import Admission
from ._decide import RuleSet
from ._idempotency import IdempotencyGuard, Replay, encode_response
from ._overload import OverloadControl, Ticket
from ._priority import PrioritySpec, compile_priority
from ._refusal import Refusal
from ._rules import ClientAddress, KeySpec, Rule, compile_key
from ._steps import RUN, Call, Steps, adrive, drive

__all__ = ["AsyncRateLimitServerInterceptor", "RateLimitServerInterceptor", "peer_address"]

PUSHBACK = "grpc-retry-pushback-ms"
_REFUSE = {
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "resource_exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
}
# Ends of a call that say "too much" to the overload control (no latency sample),
# and ends that teach it nothing (the caller left, or its own deadline passed).
_DROPPED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
_GONE = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED})
_CANCELLED = (asyncio.CancelledError, GeneratorExit)
_BY_STATUS = {
    409: grpc.StatusCode.ABORTED,
    400: grpc.StatusCode.INVALID_ARGUMENT,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
}


def peer_address(peer: str) -> str | None:
    """The address of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``), no port."""
    kind, _, rest = unquote(peer).partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        return rest[1 : rest.find("]")] if rest.startswith("[") else rest.rpartition(":")[0]
    return rest or None


class _CallView:
    # A RequestView over one call: metadata by lower-case name, the peer address.
    __slots__ = ("_metadata", "_peer", "raw", "ticket")

    def __init__(self, details: Any, context: Any) -> None:
        self.raw = details
        self.ticket: Ticket | None = None  # the overload control's, when it admitted the call
        metadata: dict[str, str] = {}
        for key, value in context.invocation_metadata() or ():
            if isinstance(value, bytes):
                continue  # binary (-bin) metadata never names a client
            k = key.lower()
            metadata[k] = f"{metadata[k]}, {value}" if k in metadata else value
        self._metadata = metadata
        self._peer = context.peer()

    def header(self, name: str) -> str | None:
        return self._metadata.get(name)

    def peer(self) -> str | None:
        return peer_address(self._peer) if self._peer else None


def _pushback_ms(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return str(math.ceil(seconds * 1000)) if math.isfinite(seconds) else "-1"


def _pushback(seconds: float | None) -> tuple[tuple[str, str], ...]:
    pushback = _pushback_ms(seconds)
    return ((PUSHBACK, pushback),) if pushback is not None else ()


class Abort(NamedTuple):
    """How a call is refused: its status code, details and trailing metadata."""

    code: Any
    details: str
    trailers: tuple[tuple[str, str], ...]


def _fp(method: str, request: Any) -> str:
    serialize = getattr(request, "SerializeToString", None)
    body = (
        serialize()
        if serialize is not None
        else (request if isinstance(request, bytes) else repr(request).encode())
    )
    return fingerprint(b"grpc", method.encode(), body)


def _stored(body: bytes, context: Any) -> bytes | None:
    # What a keyed call keeps: its answer when it ended OK; None (release) otherwise.
    code = context.code()
    return encode_response(200, (), body) if code is None or code == grpc.StatusCode.OK else None


class _Interceptor:
    # What both interceptors share: the options, the per-call conversations (written
    # once, driven by each), the translation of a decision or Refusal into an Abort,
    # and the handler rewrap.
    _asyncio: ClassVar[bool] = False

    def __init__(
        self,
        rules: Sequence[Rule] = (),
        *,
        store: object = None,
        on_store_error: str = "open",
        refuse_with: str = "unavailable",
        trusted_proxies: Sequence[str] = (),
        concurrency: Admission | int | None = None,
        concurrency_per_client: int | None = None,
        concurrency_max_wait: float = 0.0,
        concurrency_key: KeySpec = "ip",
        idempotency: IdempotencyGuard | bool = False,
        idempotency_key: str = "idempotency-key",
        idempotency_scope: KeySpec | None = None,
        overload: OverloadControl | None = None,
        priority: PrioritySpec = None,
        priority_routes: Mapping[str, str] | None = None,
        overload_key: KeySpec | None = "ip",
    ) -> None:
        if refuse_with not in _REFUSE:
            raise ConfigError("refuse_with", f"must be one of {tuple(_REFUSE)}: {refuse_with!r}")
        self._refuse_code = _REFUSE[refuse_with]
        self._rules = (
            RuleSet(
                rules,
                store=store,
                on_store_error=on_store_error,
                trusted_proxies=trusted_proxies,
                asyncio=self._asyncio,
            )
            if rules
            else None
        )
        address = ClientAddress.of(trusted_proxies)
        if isinstance(concurrency, bool):
            raise ConfigError("concurrency", "must be a number of calls or an Admission")
        if isinstance(concurrency, int):
            concurrency = Admission(
                concurrency, per_client=concurrency_per_client, max_wait=concurrency_max_wait
            )
        self._concurrency: Admission | None = concurrency
        self._client_of = compile_key(concurrency_key, address)
        if idempotency is True:
            shared = self._rules.store if self._rules is not None else store
            idempotency = IdempotencyGuard(store=shared, methods=("POST",), asyncio=self._asyncio)
        self._idempotency = idempotency or None
        self._idempotency_key = idempotency_key.lower()
        self._scope_of = (
            None if idempotency_scope is None else compile_key(idempotency_scope, address)
        )
        if overload is not None and not isinstance(overload, OverloadControl):
            raise ConfigError("overload", f"must be an OverloadControl, got {overload!r}")
        self._overload = overload
        self._classify = compile_priority(priority, routes=priority_routes, address=address)
        self._overload_key = None if overload_key is None else compile_key(overload_key, address)

    def _limited(self, decision: Decision) -> Abort:
        if self._rules is not None and self._rules.store_down and self._rules.fails_closed:
            code = grpc.StatusCode.UNAVAILABLE
            details = "rate limit store unavailable"
        else:
            code, details = self._refuse_code, f"rate limit {decision.name!r} exceeded"
        return Abort(code, details, _pushback(decision.retry_after))

    @staticmethod
    def _refused(refusal: Refusal) -> Abort:
        code = _BY_STATUS.get(refusal.status, grpc.StatusCode.FAILED_PRECONDITION)
        return Abort(code, refusal.reason.replace("_", " "), _pushback(refusal.retry_after))

    def _leave(self, client: str | None, view: _CallView, context: Any) -> None:
        """Give back the concurrency slot and the overload ticket of a call that took them."""
        if self._concurrency is not None:
            self._concurrency.leave(client)
        if view.ticket is not None and self._overload is not None:
            error = sys.exc_info()[1]
            code = context.code()
            if code in _GONE or isinstance(error, _CANCELLED):
                self._overload.release(view.ticket)  # the caller left: nothing learnt
                return
            failed = error is not None or (code is not None and code != grpc.StatusCode.OK)
            self._overload.leave(view.ticket, failed=failed, dropped=code in _DROPPED)

    def _overloaded(self, view: _CallView) -> Steps[Abort | None]:
        """The overload control's admission of a call: None (admitted), or an Abort."""
        assert self._overload is not None
        client = None if self._overload_key is None else self._overload_key(view)
        method = view.raw.method
        priority = self._classify(view, method)
        ticket = yield Call(self._overload, "enter", (priority, attempt_from(view.header), client))
        if isinstance(ticket, Refusal):
            return self._refused(ticket)
        view.ticket = ticket
        return None

    # The two conversations of a call, written once (server/_steps.py); each
    # interceptor drives them with its own flavour of the rules, admission and
    # claim store calls and aborts the call when they end in an Abort.

    def _entering(self, view: _CallView) -> Steps[Abort | str | None]:
        """Rules, then a concurrency slot: an Abort, or the client holding the slot."""
        if self._rules is not None:
            decision = yield Call(self._rules, "decide", (view, "POST", view.raw.method))
            if decision is not None and not decision.allowed:
                return self._limited(decision)
        if self._overload is not None:
            shed = yield from self._overloaded(view)
            if shed is not None:
                return shed
        client = None
        if self._concurrency is not None:
            client = self._client_of(view) if self._concurrency.per_client else None
            refusal = yield Call(self._concurrency, "enter", (client,))
            if refusal is not None:
                if view.ticket is not None and self._overload is not None:
                    self._overload.release(view.ticket)
                return self._refused(refusal)
        return client

    def _answering(self, view: _CallView, request: Any, context: Any) -> Steps[bytes | Abort]:
        """A unary call of an idempotency-guarded method: RUN it (unkeyed), refuse it,
        replay it (trailer ``idempotent-replayed``), or RUN it once and keep its
        answer when it ends OK (an error status or an exception releases the key)."""
        guard = self._idempotency
        assert guard is not None
        key = view.header(self._idempotency_key)
        admitted = guard.admit("POST", key)
        if isinstance(admitted, Refusal):
            return self._refused(admitted)
        if not admitted or key is None:
            return (yield RUN)  # type: ignore[no-any-return]
        scope = (self._scope_of(view) or "") if self._scope_of is not None else ""
        fp = _fp(view.raw.method, request)
        answer = yield from guard.once(scope, key, fp, lambda body: _stored(body, context))
        if isinstance(answer, Refusal):
            return self._refused(answer)
        if isinstance(answer, Replay):
            context.set_trailing_metadata((("idempotent-replayed", "true"),))
            return answer.body
        return answer  # type: ignore[no-any-return]

    def _streamed(self, behaviour: Any, details: Any) -> Any:
        raise NotImplementedError

    def _unary(self, behaviour: Any, details: Any, serialize: Any) -> Any:
        raise NotImplementedError

    def _rewrap(self, handler: Any, details: Any) -> Any:
        # The handler with its behaviour wrapped: calls whose answer streams hold
        # their slot until the stream ends; keyed unary calls answer raw bytes (the
        # answer is serialized once, to be stored); serialize None: not keyed.
        if handler is None:
            return None
        for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            behaviour = getattr(handler, kind)
            if behaviour is None:
                continue
            if kind.endswith("stream"):
                return handler._replace(**{kind: self._streamed(behaviour, details)})
            if kind == "unary_unary" and self._idempotency is not None:
                serialize = handler.response_serializer or _raw
                wrapped = self._unary(behaviour, details, serialize)
                return handler._replace(unary_unary=wrapped, response_serializer=_raw)
            return handler._replace(**{kind: self._unary(behaviour, details, None)})
        return handler


class RateLimitServerInterceptor(_Interceptor, grpc.ServerInterceptor):  # type: ignore[misc]
    """Rate limits, concurrency and idempotency for a ``grpc.server``.

    ``rules``: :class:`stormguard.asgi.Rule` objects (``key="header:x-api-key"``
    reads metadata; ``"ip"`` the peer without port; ``paths`` match
    ``"/pkg.Service/Method"``). ``refuse_with``: ``"unavailable"`` (default, with
    ``grpc-retry-pushback-ms``) or ``"resource_exhausted"``. ``concurrency``: calls in
    flight at most (each client at most ``concurrency_per_client``, named by
    ``concurrency_key``; a bounded wait of ``concurrency_max_wait`` seconds).
    ``idempotency=True`` (or an ``IdempotencyGuard``) runs a unary call once per
    ``idempotency_key`` metadata value, scoped by ``idempotency_scope``.
    ``overload``: an :class:`stormguard.asgi.OverloadControl` shedding calls in
    priority order under overload (UNAVAILABLE + ``grpc-retry-pushback-ms``); a
    call's class comes from ``priority`` (a callable of the call details, or
    ``{"header": NAME, "trust": "proxies" | "always"}`` for metadata) or
    ``priority_routes`` (method prefix -> class); its attempt number from
    ``grpc-previous-rpc-attempts``; its client from ``overload_key``.
    """

    _asyncio = False

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        return self._rewrap(continuation(details), details)

    def _enter(self, view: _CallView, context: Any) -> str | None:
        # Rules, then a concurrency slot; aborts the call when refused.
        entered = drive(self._entering(view))
        if isinstance(entered, Abort):
            self._abort(context, entered)
        return entered

    @staticmethod
    def _abort(context: Any, abort: Abort) -> NoReturn:
        context.set_trailing_metadata(abort.trailers)
        context.abort(abort.code, abort.details)
        raise AssertionError("context.abort() returned")  # it raises

    def _streamed(self, behaviour: Any, details: Any) -> Any:
        enter, leave = self._enter, self._leave

        def streamed(request: Any, context: Any) -> Iterator[Any]:
            view = _CallView(details, context)
            client = enter(view, context)
            try:
                yield from behaviour(request, context)
            finally:
                leave(client, view, context)

        return streamed

    def _unary(self, behaviour: Any, details: Any, serialize: Any) -> Any:
        enter, leave, answering = self._enter, self._leave, self._answering

        def unary(request: Any, context: Any) -> Any:
            view = _CallView(details, context)
            client = enter(view, context)
            try:
                if serialize is None:
                    return behaviour(request, context)
                answer = drive(
                    answering(view, request, context),
                    lambda: bytes(serialize(behaviour(request, context))),
                )
                if isinstance(answer, Abort):
                    self._abort(context, answer)
                return answer
            finally:
                leave(client, view, context)

        return unary


def _raw(value: Any) -> bytes:
    return value if isinstance(value, bytes) else bytes(value)


class AsyncRateLimitServerInterceptor(_Interceptor, grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The ``grpc.aio`` twin of :class:`RateLimitServerInterceptor` (same options)."""

    _asyncio = True

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        return self._rewrap(await continuation(details), details)

    async def _enter(self, view: _CallView, context: Any) -> str | None:
        entered = await adrive(self._entering(view))
        if isinstance(entered, Abort):
            await self._abort(context, entered)
        return entered

    @staticmethod
    async def _abort(context: Any, abort: Abort) -> NoReturn:
        context.set_trailing_metadata(abort.trailers)
        await context.abort(abort.code, abort.details)
        raise AssertionError("context.abort() returned")  # it raises

    def _streamed(self, behaviour: Any, details: Any) -> Any:
        enter, leave = self._enter, self._leave

        async def streamed(request: Any, context: Any) -> AsyncIterator[Any]:
            view = _CallView(details, context)
            client = await enter(view, context)
            try:
                async for item in behaviour(request, context):
                    yield item
            finally:
                leave(client, view, context)

        return streamed

    def _unary(self, behaviour: Any, details: Any, serialize: Any) -> Any:
        enter, leave, answering = self._enter, self._leave, self._answering

        async def unary(request: Any, context: Any) -> Any:
            view = _CallView(details, context)
            client = await enter(view, context)
            try:
                if serialize is None:
                    return await behaviour(request, context)

                async def run() -> bytes:
                    return bytes(serialize(await behaviour(request, context)))

                answer = await adrive(answering(view, request, context), run)
                if isinstance(answer, Abort):
                    await self._abort(context, answer)
                return answer
            finally:
                leave(client, view, context)

        return unary
