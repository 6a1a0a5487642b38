# The gRPC leg's forwarding: any method, as raw bytes, to an upstream channel.
#
# A proxy without the services' .proto files cannot know whether a method is
# unary or streaming: that is an API notion, not a wire one. On the wire every
# call is a stream of length-prefixed messages in each direction, closed by a
# status in the trailers. So both legs are handled as stream-stream with no
# serializers (messages stay bytes): a unary call is a stream of one message each
# way, and the upstream's own handler enforces its cardinality exactly as it would
# for a direct call (grpc-proxy in Go does the same with a both-ways StreamDesc).
#
# One forwarded call:
#   * the upstream call reads the client's messages (context.read) as it goes;
#     where a retry is possible a pump task reads them instead, one small queue
#     ahead, keeping the first message and noting whether the client closed
#     after it, so a unary request can be sent again;
#   * request metadata goes upstream minus transport headers, with
#     x-forwarded-for naming the client as the HTTP leg does; the client's
#     deadline (context.time_remaining) becomes the upstream call's timeout, so
#     the upstream is cancelled when the client gives up;
#   * the upstream's initial metadata is sent back as soon as it arrives, then
#     each response message, then its status, details and trailing metadata;
#   * a handler cancelled by grpc (client cancel or deadline) cancels the upstream
#     call and the pump in its `finally`.
#
# A call "never reached the upstream" when it failed UNAVAILABLE with no response
# headers and grpc-core's connect-failure wording. Only such a call may be sent
# again, and only when the whole request is one message that the pump holds and
# nothing has gone back to the client yet: streams are never replayed.
#
# Status goes back through set_code/set_details/set_trailing_metadata and a
# normal return, never context.abort(): that needs a tuple of pairs (a
# grpc.aio.Metadata object there turns the status into UNKNOWN on the client),
# and trailers are always handed over as a tuple here.
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

__all__ = [
    "Forwarded",
    "MetadataPairs",
    "Pump",
    "client_messages",
    "finish",
    "forward",
    "forwardable",
    "forwarded_for",
    "never_reached",
    "refuse",
]

MetadataPairs = tuple[tuple[str, str | bytes], ...]

# Headers that belong to one HTTP/2 hop or to grpc itself, never forwarded
# (grpc-core sets its own; a duplicate `grpc-timeout` or `te` breaks the call).
_TRANSPORT = frozenset(
    {
        "connection",
        "content-length",
        "content-type",
        "host",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
    }
)
# Reserved grpc-* names that describe the transport; application trailers such as
# grpc-retry-pushback-ms pass through.
_GRPC_TRANSPORT = frozenset(
    {
        "grpc-accept-encoding",
        "grpc-encoding",
        "grpc-message",
        "grpc-status",
        "grpc-status-details-bin",
        "grpc-timeout",
    }
)
_CONNECT_FAILURE = ("failed to connect", "connection refused", "dns resolution failed")
_EOF: Any = grpc.aio.EOF
_QUEUE = 4  # client messages read ahead of the upstream


def forwardable(metadata: Iterable[tuple[str, str | bytes]] | None) -> MetadataPairs:
    """The pairs of ``metadata`` that may cross the proxy (transport headers dropped)."""
    if not metadata:
        return ()
    return tuple(
        (key, value)
        for key, value in metadata
        if not key.startswith(":") and key not in _TRANSPORT and key not in _GRPC_TRANSPORT
    )


def forwarded_for(metadata: MetadataPairs, client_ip: str, trusted_peer: bool) -> MetadataPairs:
    """``metadata`` with ``x-forwarded-for`` naming the client, as the HTTP leg sets it.

    The incoming chain is kept (and the client appended) only when the peer is a
    trusted proxy; otherwise the client's own claim is replaced.
    """
    chain = [v for k, v in metadata if k == "x-forwarded-for" and isinstance(v, str)]
    rest = tuple(pair for pair in metadata if pair[0] != "x-forwarded-for")
    value = ", ".join([*chain, client_ip]) if trusted_peer and chain else client_ip
    return (*rest, ("x-forwarded-for", value))


def never_reached(error: grpc.aio.AioRpcError, headers_seen: bool) -> bool:
    """True when the upstream call failed before the upstream saw it (connect failure)."""
    if headers_seen or error.code() is not grpc.StatusCode.UNAVAILABLE:
        return False
    details = (error.details() or "").lower()
    return any(marker in details for marker in _CONNECT_FAILURE)


async def client_messages(context: grpc.aio.ServicerContext[bytes, bytes]) -> AsyncIterator[bytes]:
    """The client's messages read as the upstream call asks for them (nothing kept)."""
    while True:
        message = await context.read()
        if message is _EOF:
            return
        yield message


class Pump:
    """Reads the client's request stream for the upstream call, one small queue ahead.

    ``replayable`` is True once the client half-closed after at most one message
    (kept in ``first``); ``settled`` is set as soon as that is known either way.
    """

    __slots__ = ("_queue", "_task", "count", "eof", "first", "settled")

    def __init__(self, context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue(_QUEUE)
        self.first: bytes | None = None
        self.count = 0
        self.eof = False
        self.settled = asyncio.Event()
        self._task = asyncio.create_task(self._run(context))

    @property
    def replayable(self) -> bool:
        """The whole request is known and is at most one message."""
        return self.eof and self.count <= 1

    async def _run(self, context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
        try:
            while True:
                message = await context.read()
                if message is _EOF:
                    self.eof = True
                    self.settled.set()
                    await self._queue.put(_EOF)
                    return
                self.count += 1
                if self.count == 1:
                    self.first = message
                else:
                    self.first = None
                    self.settled.set()
                await self._queue.put(message)
        except Exception:  # the client's stream broke: the upstream sees it end
            self.settled.set()
            await self._queue.put(_EOF)

    async def messages(self) -> AsyncIterator[bytes]:
        """The client's messages in order, for the upstream call."""
        while True:
            message = await self._queue.get()
            if message is _EOF:
                return
            yield message

    async def replay(self) -> AsyncIterator[bytes]:
        """The kept request again (only when :attr:`replayable`)."""
        if self.first is not None:
            yield self.first

    def close(self) -> None:
        """Stop reading from the client."""
        self._task.cancel()


@dataclass(slots=True)
class Forwarded:
    """What the upstream answered, as sent back to the client."""

    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""
    trailers: MetadataPairs = ()
    headers_seen: bool = False  # upstream response headers arrived
    replied: bool = False  # something went back to the client
    error: grpc.aio.AioRpcError | None = field(default=None, repr=False)


async def forward(
    channel: grpc.aio.Channel,
    method: str,
    context: grpc.aio.ServicerContext[bytes, bytes],
    requests: AsyncIterator[bytes],
    *,
    metadata: MetadataPairs,
    time_left: float | None,
) -> Forwarded:
    """Run one upstream call, streaming its answer to ``context``; return its status.

    ``time_left`` (the client's, in seconds; None: no deadline) becomes the
    upstream call's timeout. The upstream status is *not* applied to ``context``
    here (the caller decides whether to retry first): see :func:`finish`.
    """
    call = channel.stream_stream(method)(requests, timeout=time_left, metadata=metadata)
    result = Forwarded()
    try:
        headers = await call.initial_metadata()
        # Trailers-only answers (errors, mostly) report empty headers once done.
        result.headers_seen = bool(headers) or not call.done()
        if result.headers_seen:
            await context.send_initial_metadata(forwardable(headers))
            result.replied = True
        async for message in call:
            if not result.replied:
                result.replied = True
            await context.write(message)
    except grpc.aio.AioRpcError as error:
        result.error = error
        result.code = error.code()
        result.details = error.details() or ""
        result.trailers = forwardable(error.trailing_metadata())
        return result
    except BaseException:
        call.cancel()
        raise
    result.code = await call.code()
    result.details = await call.details() or ""
    result.trailers = forwardable(await call.trailing_metadata())
    return result


def finish(context: grpc.aio.ServicerContext[bytes, bytes], result: Forwarded) -> None:
    """Hand the upstream's status, details and trailers to the client."""
    if result.trailers:
        context.set_trailing_metadata(result.trailers)
    if result.code is not grpc.StatusCode.OK:
        context.set_code(result.code)
        context.set_details(result.details)


def refuse(
    context: grpc.aio.ServicerContext[bytes, bytes],
    code: grpc.StatusCode,
    details: str,
    trailers: MetadataPairs,
) -> None:
    """Set the refusal's status and ``trailers``; the handler then returns."""
    finish(context, Forwarded(code=code, details=details, trailers=tuple(trailers)))
