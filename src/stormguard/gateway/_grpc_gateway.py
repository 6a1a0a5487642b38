# The gRPC leg of the gateway: routes -> limits -> breaker -> bulkhead -> upstream.
#
# One generic handler serves every method; a method no route names gets grpc's
# own UNIMPLEMENTED. Assembled from the HTTP leg's parts: the client's key by the
# server side's key specs, the route's limits as a server-side RuleSet, and the
# upstream's UpstreamPool for admission. For a routed call, in order:
#   1. the route's limits, all decided in one store call (RuleSet.adecide);
#   2. UpstreamPool.admit: the breaker (CircuitOpen carries the open time left),
#      then the server side's Admission: the client's share and the upstream's
#      bulkhead (a Refusal carrying its Retry-After);
#   3. the forwarded call (_grpc_proxy.forward), its retries run by the one retry
#      conversation (_retries.drive, as the HTTP leg's): tried again only when it
#      never reached the upstream, the request is whole in the pump, nothing went
#      back to the client, the attempts allow it and the upstream's budget pays.
# A refusal is UNAVAILABLE (or RESOURCE_EXHAUSTED for a limit where the route says
# so) with `grpc-retry-pushback-ms` in the trailers (gRFC A6): the wait in whole
# milliseconds, so grpcio clients with a retryPolicy wait exactly that long.
#
# The breaker counts UNAVAILABLE and DEADLINE_EXCEEDED answers (connect failures
# and dropped connections surface as UNAVAILABLE), and a call cancelled by grpc
# once the client's deadline has passed. Caller errors (INVALID_ARGUMENT,
# NOT_FOUND, ...) and an upstream's own refusal carrying a pushback trailer are
# successes for the breaker; a call the client cancelled gives its permit back.
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
import grpc.aio

from .._errors import CircuitOpen
from ..core._attempts import attempt_from
from ..core._engine import Outcome
from ..server._grpc import PUSHBACK, _CallView, _pushback_ms
from ..server._overload import Ticket
from ..server._refusal import Refusal
from ._clients import ClientIdentity, client_id
from ._grpc_proxy import (
    Forwarded,
    MetadataPairs,
    Pump,
    client_messages,
    finish,
    forward,
    forwardable,
    forwarded_for,
    never_reached,
    refuse,
)
from ._grpc_routes import CLIENT_KEY, GrpcRoute, RouteTable, target_of
from ._retries import drive, error_outcome
from ._upstream import UpstreamPool

__all__ = ["PUSHBACK", "GrpcGateway", "Record", "pushback"]

BUSY_RETRY_AFTER = 1.0  # the wait a full bulkhead suggests when it names none
_BREAKER_FAILURES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# What admission control counts as the upstream failing a call (the HTTP leg's 5xx).
_SERVER_FAILURES = _BREAKER_FAILURES | {
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DATA_LOSS,
}
# record(route, outcome, client key): one call per routed call.
Record = Callable[[str, str, str], None]
access_log = logging.getLogger("stormguard.gateway.access")


class _Exchange:
    # What one call came to: for the metrics and the access log.
    __slots__ = ("client", "code", "outcome", "rule")

    def __init__(self) -> None:
        self.client = self.rule = ""
        self.outcome = "allowed"
        self.code: grpc.StatusCode = grpc.StatusCode.OK


def _log_access(route: GrpcRoute, method: str, ex: _Exchange, started: float) -> None:
    # The HTTP leg's access-log line, with the gRPC method and status name.
    line = {
        "grpc": method,
        "route": route.name,
        "status": ex.code.name,
        "policy": ex.outcome,
        "client": client_id(ex.client) if ex.client else "",
        "client_rule": ex.rule,
        "upstream": route.upstream,
        "ms": round((time.perf_counter() - started) * 1000, 3),
    }
    access_log.info(json.dumps(line, separators=(",", ":")))


def pushback(seconds: float) -> MetadataPairs:
    """The gRFC A6 trailer asking a client to wait ``seconds`` (whole ms, rounded up;
    ``-1``, "do not retry", for a wait that never ends), as the server side sends it."""
    return ((PUSHBACK, _pushback_ms(max(0.0, seconds)) or "0"),)


def _has_pushback(trailers: MetadataPairs) -> bool:
    return any(key == PUSHBACK for key, _ in trailers)


def _wait_bound(pool: UpstreamPool, context: grpc.aio.ServicerContext[bytes, bytes]) -> float:
    """How long a retry may wait for the request or the upstream: the connect
    timeout, or less when the client's deadline is nearer."""
    remaining = context.time_remaining()
    wait = pool.settings.timeout.connect
    return wait if remaining is None else min(remaining, wait)


def _nothing(outcome: Outcome) -> None:
    """A failed gRPC attempt holds nothing to drop before the next (its answer never
    started)."""


def _channel_options(connect_timeout: float, balanced: bool) -> list[tuple[str, Any]]:
    # Reconnect quickly enough that a half-open probe finds a recovered upstream.
    millis = max(100, int(connect_timeout * 1000))
    options: list[tuple[str, Any]] = [
        ("grpc.initial_reconnect_backoff_ms", min(millis, 1000)),
        ("grpc.min_reconnect_backoff_ms", min(millis, 1000)),
        ("grpc.max_reconnect_backoff_ms", max(millis, 1000)),
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
    ]
    if balanced:
        options.append(("grpc.lb_policy_name", "round_robin"))
    return options


class GrpcGateway(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A generic grpc.aio handler proxying routed methods with the gateway's protection.

    ``upstreams`` are the gateway's :class:`UpstreamPool` objects by name;
    ``identity`` names the client (the gateway's ``clients`` section).
    ``record(route, outcome, client)`` receives ``allowed`` or the refusal reason
    (``limited:<limit>``, ``breaker_open``, ``bulkhead_full``, ``upstream_timeout``,
    ``store_unavailable``) per call; by default it adds to :attr:`stats`. With
    ``access_log`` each call is logged as one JSON line on
    ``stormguard.gateway.access`` (the client as a SHA-256 prefix, never the key).
    :meth:`update` swaps routes and upstreams (a reload); :meth:`close` closes the
    upstream channels.
    """

    def __init__(
        self,
        *,
        routes: Iterable[GrpcRoute],
        upstreams: Mapping[str, UpstreamPool],
        identity: ClientIdentity | None = None,
        record: Record | None = None,
        access_log: bool = False,
    ) -> None:
        self.identity = identity or ClientIdentity(("ip",), ())
        self.access_log = access_log
        self.stats: dict[str, Counter[str]] = {}
        self._record: Record = record or self._add
        self._channels: dict[str, tuple[UpstreamPool, grpc.aio.Channel]] = {}
        self._retired: list[grpc.aio.Channel] = []
        self.update(routes, upstreams)

    def update(self, routes: Iterable[GrpcRoute], upstreams: Mapping[str, UpstreamPool]) -> None:
        """Serve ``routes`` to ``upstreams`` from now on (calls in flight finish as they were)."""
        upstreams = dict(upstreams)
        table = RouteTable(routes, upstreams)
        self.upstreams, self.routes = upstreams, table
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def channel(self, name: str) -> grpc.aio.Channel:
        """The channel to upstream ``name`` (opened on first use, anew when it is replaced)."""
        pool = self.upstreams[name]
        entry = self._channels.get(name)
        if entry is not None and entry[0] is pool:
            return entry[1]
        if entry is not None:
            self._retired.append(entry[1])  # closed with the gateway: calls may still use it
        urls = [target.url for target in pool.targets]
        options = _channel_options(pool.settings.timeout.connect, len(urls) > 1)
        channel = grpc.aio.insecure_channel(target_of(urls), options=options)
        self._channels[name] = (pool, channel)
        return channel

    async def close(self) -> None:
        """Close every upstream channel."""
        channels = [channel for _, channel in self._channels.values()] + self._retired
        self._channels, self._retired = {}, []
        for channel in channels:
            await channel.close()

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        """The raw-bytes stream handler for a routed method; None (UNIMPLEMENTED) otherwise."""
        method: str = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is not None:
            return handler
        route = self.routes.resolve(method)
        if route is None:
            return None

        async def handle(_requests: Any, context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
            await self._handle(route, method, context)

        handler = grpc.stream_stream_rpc_method_handler(handle)
        if len(self._handlers) < 4096:  # methods are few; unknown names are not kept forever
            self._handlers[method] = handler
        return handler

    def _add(self, route: str, outcome: str, client: str) -> None:
        counter = self.stats.get(route)
        if counter is None:
            counter = self.stats[route] = Counter()
        counter[outcome] += 1

    async def _handle(
        self, route: GrpcRoute, method: str, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> None:
        started = time.perf_counter()
        ex = _Exchange()
        try:
            await self._limit(route, method, context, ex)
        finally:
            self._record(route.name, ex.outcome, ex.client)
            if self.access_log:
                _log_access(route, method, ex, started)

    async def _limit(
        self,
        route: GrpcRoute,
        method: str,
        context: grpc.aio.ServicerContext[bytes, bytes],
        ex: _Exchange,
    ) -> None:
        view = _CallView({}, context)  # raw: what a callable key gets (the client's key)
        ex.rule, ex.client = self.identity.identify(view)
        view.raw[CLIENT_KEY] = ex.client
        rules = route.rules
        decision = None if rules is None else await rules.adecide(view, "POST", method)
        if decision is not None and not decision.allowed:
            assert rules is not None
            if rules.store_down and rules.fails_closed:
                ex.code, ex.outcome = grpc.StatusCode.UNAVAILABLE, "store_unavailable"
            elif route.refuse_with == "resource_exhausted":
                ex.code = grpc.StatusCode.RESOURCE_EXHAUSTED
                ex.outcome = f"limited:{decision.name}"
            else:
                ex.code, ex.outcome = grpc.StatusCode.UNAVAILABLE, f"limited:{decision.name}"
            refuse(context, ex.code, "rate limited", pushback(decision.retry_after))
            return
        try:
            await self._overloaded(route, method, context, view, ex)
        finally:
            if decision is not None and route.leased:
                await route.release(decision, view)

    async def _overloaded(
        self,
        route: GrpcRoute,
        method: str,
        context: grpc.aio.ServicerContext[bytes, bytes],
        view: _CallView,
        ex: _Exchange,
    ) -> None:
        # The priority and overload stage (the HTTP leg's, _proxy._overload): the
        # call's class, attempt number (grpc-previous-rpc-attempts ...) and client
        # rank it in the upstream's line; a refusal is UNAVAILABLE + pushback.
        control = self.upstreams[route.upstream].overload
        if control is None or route.classify is None:
            await self._admit(route, method, context, view, ex)
            return
        priority = route.classify(view, method)
        ticket = await control.aenter(priority, attempt_from(view.header), ex.client)
        if not isinstance(ticket, Ticket):
            ex.code, ex.outcome = grpc.StatusCode.UNAVAILABLE, ticket.reason
            detail = ticket.reason.replace("_", " ")
            refuse(context, ex.code, detail, pushback(ticket.retry_after or BUSY_RETRY_AFTER))
            return
        try:
            reached = await self._admit(route, method, context, view, ex)
        except BaseException:
            if ex.code is grpc.StatusCode.CANCELLED:
                control.abandon(ticket)  # its client left; the upstream may go on
            else:
                control.leave(ticket, failed=True, measured=False)
            raise
        code = ex.code
        if not reached:
            control.release(ticket)
        elif code is grpc.StatusCode.CANCELLED:
            control.abandon(ticket)
        else:
            dropped = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            control.leave(ticket, failed=code in _SERVER_FAILURES, dropped=dropped)

    async def _admit(
        self,
        route: GrpcRoute,
        method: str,
        context: grpc.aio.ServicerContext[bytes, bytes],
        view: _CallView,
        ex: _Exchange,
    ) -> bool:
        # The upstream guard, then the call; False: the guard refused (answered).
        pool = self.upstreams[route.upstream]
        try:
            admission = await pool.admit(ex.client)
        except CircuitOpen as exc:
            ex.code, ex.outcome = grpc.StatusCode.UNAVAILABLE, "breaker_open"
            refuse(context, ex.code, "circuit open", pushback(exc.remaining))
            return False
        if isinstance(admission, Refusal):  # the bulkhead is full (the HTTP leg's 503)
            ex.code, ex.outcome = grpc.StatusCode.UNAVAILABLE, admission.reason
            wait = admission.retry_after or BUSY_RETRY_AFTER
            refuse(context, ex.code, admission.reason.replace("_", " "), pushback(wait))
            return False
        permit = admission.permit
        try:
            metadata = forwarded_for(
                forwardable(context.invocation_metadata()),
                self.identity.ip(view),
                self.identity.trusted_peer(view),
            )
            result = await self._call(pool, method, context, metadata)
        except asyncio.CancelledError:
            # grpc cancels the handler when the client cancels or its deadline passes.
            timed_out = (context.time_remaining() or 1.0) <= 0
            if timed_out:
                ex.code, ex.outcome = grpc.StatusCode.DEADLINE_EXCEEDED, "upstream_timeout"
            else:
                ex.code = grpc.StatusCode.CANCELLED
            if permit is not None:
                await (permit.arecord(failure=True) if timed_out else permit.arelease())
            raise
        except BaseException:
            ex.code = grpc.StatusCode.INTERNAL
            if permit is not None:
                await permit.arecord(failure=True)
            raise
        finally:
            pool.done(admission)
        ex.code = result.code
        if result.code is grpc.StatusCode.DEADLINE_EXCEEDED:
            ex.outcome = "upstream_timeout"
        if permit is not None:
            failed = result.code in _BREAKER_FAILURES and not _has_pushback(result.trailers)
            await permit.arecord(failure=failed)
        finish(context, result)
        return True

    async def _call(
        self,
        pool: UpstreamPool,
        method: str,
        context: grpc.aio.ServicerContext[bytes, bytes],
        metadata: MetadataPairs,
    ) -> Forwarded:
        channel = self.channel(pool.name)
        total = pool.settings.timeout.total

        def send(requests: AsyncIterator[bytes]) -> Awaitable[Forwarded]:
            time_left = context.time_remaining()
            if total is not None:  # the upstream's own bound on a whole exchange
                time_left = total if time_left is None else min(time_left, total)
            return forward(
                channel, method, context, requests, metadata=metadata, time_left=time_left
            )

        if pool.attempts <= 1:
            return await send(client_messages(context))
        # Retries run the one retry conversation (_retries.drive), as the HTTP leg's
        # do: a call is tried again only when it never reached the upstream (the
        # table's "never sent" row, retried for any method), nothing went back to
        # the client, the request is whole in the pump, and the budget pays.
        pump = Pump(context)
        last: list[Forwarded] = []

        async def attempt(n: int) -> Outcome:
            if n > 1 and not await self._reachable(pool, channel, context):
                return Outcome(None, False, last[-1])  # cannot go again: the answer
            result = await send(pump.messages() if n == 1 else pump.replay())
            last.append(result)
            error = result.error
            if error is None or result.replied or not never_reached(error, result.headers_seen):
                return Outcome(None, False, result)  # the upstream's answer, final
            if not await self._whole(pool, pump, context):
                return Outcome(None, False, result)
            return error_outcome(error, True, "POST", False)

        try:
            finish = await drive(pool.grpc_policy, None, attempt, _nothing, pool.clock)
        finally:
            pump.close()
        outcome = finish.outcome
        if outcome is not None and isinstance(outcome.value, Forwarded):
            return outcome.value
        return last[-1]

    async def _whole(
        self, pool: UpstreamPool, pump: Pump, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bool:
        # Whether the request can be sent again: the pump holds all of it (waited
        # for, bounded by the connect timeout and the client's deadline).
        wait = _wait_bound(pool, context)
        try:
            async with asyncio.timeout(wait):
                await pump.settled.wait()
        except TimeoutError:
            return False
        return pump.replayable

    async def _reachable(
        self,
        pool: UpstreamPool,
        channel: grpc.aio.Channel,
        context: grpc.aio.ServicerContext[bytes, bytes],
    ) -> bool:
        # Whether the upstream became reachable (waited for, bounded as _whole is)
        # before the retry the conversation decided.
        try:
            async with asyncio.timeout(_wait_bound(pool, context)):
                await channel.channel_ready()
        except TimeoutError:
            return False
        return True
