# The gRPC leg of the gateway: routes -> limits -> breaker -> bulkhead -> upstream.
#
# One generic handler serves every method; a method no route names gets grpc's
# own UNIMPLEMENTED. For a routed call, in order:
#   1. the route's limits, all decided in one store call (AsyncRateLimiter.hit_many);
#   2. the upstream's breaker (a permit; CircuitOpen carries the open time left);
#   3. the upstream's bulkhead (a slot, waiting at most its max_wait);
#   4. the forwarded call (_grpc_proxy.forward), retried only when it never reached
#      the upstream, the request is one message the pump holds, nothing went back
#      to the client, the attempts allow it and the upstream's budget pays for it.
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
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio

from .._errors import BulkheadFull, CircuitOpen
from .._limiter import AsyncRateLimiter
from ..protection import Permit
from ._grpc_proxy import (
    Forwarded,
    MetadataPairs,
    Pump,
    finish,
    forward,
    forwardable,
    never_reached,
    refuse,
)
from ._grpc_routes import ClientKeys, GrpcRoute, GrpcUpstream, MetadataView, RouteTable

__all__ = ["PUSHBACK", "GrpcGateway", "pushback"]

PUSHBACK = "grpc-retry-pushback-ms"
BUSY_RETRY_AFTER = 1.0  # the wait a full bulkhead suggests
_BREAKER_FAILURES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_ANONYMOUS = "-"


def pushback(seconds: float) -> MetadataPairs:
    """The gRFC A6 trailer asking a client to wait ``seconds`` (whole ms, rounded up)."""
    return ((PUSHBACK, str(max(0, math.ceil(seconds * 1000)))),)


def _has_pushback(trailers: MetadataPairs) -> bool:
    return any(key == PUSHBACK for key, _ in trailers)


def _channel_options(upstream: GrpcUpstream) -> list[tuple[str, Any]]:
    # Reconnect quickly enough that a half-open probe finds a recovered upstream.
    millis = max(100, int(upstream.connect_timeout * 1000))
    return [
        ("grpc.initial_reconnect_backoff_ms", min(millis, 1000)),
        ("grpc.min_reconnect_backoff_ms", min(millis, 1000)),
        ("grpc.max_reconnect_backoff_ms", max(millis, 1000)),
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
    ]


class GrpcGateway(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A generic grpc.aio handler proxying routed methods with the gateway's protection.

    ``stats`` counts, per route service name, ``allowed`` calls and refusals by
    reason (``limited:<limit>``, ``breaker_open``, ``bulkhead_full``,
    ``upstream_timeout``). Call :meth:`close` to close the upstream channels.
    """

    def __init__(
        self,
        *,
        routes: Iterable[GrpcRoute],
        upstreams: Mapping[str, GrpcUpstream] | Sequence[GrpcUpstream],
        client_keys: Sequence[str] = ("ip",),
        trusted_proxies: Sequence[str] = (),
        stats: dict[str, Counter[str]] | None = None,
    ) -> None:
        if not isinstance(upstreams, Mapping):
            upstreams = {upstream.name: upstream for upstream in upstreams}
        self.upstreams: dict[str, GrpcUpstream] = dict(upstreams)
        self.routes = RouteTable(routes, self.upstreams)
        self.client_key = ClientKeys(client_keys, trusted_proxies)
        self.stats: dict[str, Counter[str]] = stats if stats is not None else {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def channel(self, name: str) -> grpc.aio.Channel:
        """The channel to upstream ``name`` (opened on first use)."""
        upstream = self.upstreams[name]
        channel = self._channels.get(name)
        if channel is None:
            channel = grpc.aio.insecure_channel(upstream.target, options=_channel_options(upstream))
            self._channels[name] = channel
        return channel

    async def close(self) -> None:
        """Close every upstream channel."""
        channels, self._channels = list(self._channels.values()), {}
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

    def _count(self, route: GrpcRoute, outcome: str) -> None:
        counter = self.stats.get(route.service)
        if counter is None:
            counter = self.stats[route.service] = Counter()
        counter[outcome] += 1

    async def _handle(
        self, route: GrpcRoute, method: str, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> None:
        upstream = self.upstreams[route.upstream]
        metadata = context.invocation_metadata()
        if route.limits:
            key = self.client_key(MetadataView(metadata, context.peer())) or _ANONYMOUS
            decision = await AsyncRateLimiter.hit_many(
                [
                    (limit.limiter, key if limit.per == "client" else "global")
                    for limit in route.limits
                ]
            )
            if not decision.allowed:
                self._count(route, f"limited:{decision.name}")
                code = (
                    grpc.StatusCode.RESOURCE_EXHAUSTED
                    if route.refuse_with == "resource_exhausted"
                    else grpc.StatusCode.UNAVAILABLE
                )
                refuse(context, code, "rate limited", pushback(decision.retry_after))
                return
        permit: Permit | None = None
        if upstream.breaker is not None:
            try:
                permit = await upstream.breaker.aacquire()
            except CircuitOpen as exc:
                self._count(route, "breaker_open")
                refuse(
                    context, grpc.StatusCode.UNAVAILABLE, "circuit open", pushback(exc.remaining)
                )
                return
        bulkhead = upstream.bulkhead
        if bulkhead is not None:
            try:
                await bulkhead.aacquire()
            except BulkheadFull:
                if permit is not None:
                    await permit.arelease()
                self._count(route, "bulkhead_full")
                refuse(
                    context,
                    grpc.StatusCode.UNAVAILABLE,
                    "bulkhead full",
                    pushback(BUSY_RETRY_AFTER),
                )
                return
        try:
            result = await self._call(upstream, method, context, forwardable(metadata))
        except asyncio.CancelledError:
            if permit is not None:
                # grpc cancels the handler when the client cancels or its deadline passes.
                if (context.time_remaining() or 1.0) <= 0:
                    self._count(route, "upstream_timeout")
                    await permit.arecord(failure=True)
                else:
                    await permit.arelease()
            raise
        except BaseException:
            if permit is not None:
                await permit.arecord(failure=True)
            raise
        finally:
            if bulkhead is not None:
                bulkhead.release()
        if result.code is grpc.StatusCode.DEADLINE_EXCEEDED:
            self._count(route, "upstream_timeout")
        else:
            self._count(route, "allowed")
        if permit is not None:
            failed = result.code in _BREAKER_FAILURES and not _has_pushback(result.trailers)
            await permit.arecord(failure=failed)
        finish(context, result)

    async def _call(
        self,
        upstream: GrpcUpstream,
        method: str,
        context: grpc.aio.ServicerContext[bytes, bytes],
        metadata: MetadataPairs,
    ) -> Forwarded:
        channel = self.channel(upstream.name)
        budget = upstream.budget
        if budget is not None:
            await budget.arecord_request()
        pump = Pump(context)
        try:
            result = await forward(
                channel,
                method,
                context,
                pump.messages(),
                metadata=metadata,
                time_left=context.time_remaining(),
            )
            attempt = 1
            while (
                attempt < upstream.attempts
                and result.error is not None
                and not result.replied
                and never_reached(result.error, result.headers_seen)
                and await self._ready_to_replay(upstream, channel, pump, context)
            ):
                attempt += 1
                result = await forward(
                    channel,
                    method,
                    context,
                    pump.replay(),
                    metadata=metadata,
                    time_left=context.time_remaining(),
                )
            return result
        finally:
            pump.close()

    async def _ready_to_replay(
        self,
        upstream: GrpcUpstream,
        channel: grpc.aio.Channel,
        pump: Pump,
        context: grpc.aio.ServicerContext[bytes, bytes],
    ) -> bool:
        # Wait (bounded by connect_timeout and the client's deadline) for the whole
        # request; pay from the budget; wait for the upstream to be reachable.
        remaining = context.time_remaining()
        wait = upstream.connect_timeout
        if remaining is not None:
            wait = min(remaining, wait)
        try:
            async with asyncio.timeout(wait):
                await pump.settled.wait()
                if not pump.replayable:
                    return False
                if upstream.budget is not None and not await upstream.budget.atry_retry():
                    return False
                await channel.channel_ready()
        except TimeoutError:
            return False
        return True
