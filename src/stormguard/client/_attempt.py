# Attempt numbers on the wire (DESIGN.md, "Attempt numbers on the wire").
#
# A retry says it is one, so a server or gateway under overload can shed retries
# before first attempts:
#
#   HTTP   Retry-Attempt: N                  N = 2 on the first retry; absent on a
#                                            first attempt (RFC 6648: no X- prefix)
#   gRPC   grpc-previous-rpc-attempts: N-1   as gRPC A6 counts (1 on the first retry)
#
# The HTTP adapters and the gRPC interceptors write them themselves. A decorated
# function (`@retry`, `retrying()`) makes its own calls, which stormguard cannot
# see: it asks `current_attempt()` / `attempt_headers()` and sends them. Both read
# a context variable the decorator sets around a retry only, so a first attempt
# (nearly every call) costs nothing, and the value follows the call into threads
# started with contextvars.copy_context() and into asyncio tasks it creates.
from __future__ import annotations

from contextvars import ContextVar

__all__ = [
    "GRPC_PREVIOUS_ATTEMPTS",
    "RETRY_ATTEMPT",
    "attempt_headers",
    "current_attempt",
    "numbered",
    "unnumbered",
]

RETRY_ATTEMPT = "Retry-Attempt"
GRPC_PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"

_ATTEMPT: ContextVar[int] = ContextVar("stormguard_attempt", default=1)


def current_attempt() -> int:
    """The number of the attempt being made by the innermost ``@retry`` or
    ``retrying()`` call around the caller: 1 on a first attempt (and outside any
    retrying call), 2 on the first retry, and so on."""
    return _ATTEMPT.get()


def attempt_headers() -> dict[str, str]:
    """The HTTP headers that say which attempt this is: ``{"Retry-Attempt": "N"}``
    on a retry (N = :func:`current_attempt`, 2 on the first retry), ``{}`` on a
    first attempt. Merge them into the request a retried function sends::

        @stormguard.retry(on=httpx.HTTPStatusError)
        def charge() -> httpx.Response:
            return client.post(url, headers=stormguard.attempt_headers()).raise_for_status()
    """
    number = _ATTEMPT.get()
    return {} if number < 2 else {RETRY_ATTEMPT: str(number)}


def numbered(number: int) -> object | None:
    """Set the attempt number for the code run next (a retry only); the token to
    give :func:`unnumbered`, or None when nothing was set (a first attempt)."""
    return _ATTEMPT.set(number) if number > 1 else None


def unnumbered(token: object | None) -> None:
    """Undo :func:`numbered`."""
    if token is not None:
        _ATTEMPT.reset(token)  # type: ignore[arg-type]
