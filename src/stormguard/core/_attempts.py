# Which attempt is this? The request headers that say so, read into one count.
#
# The attempt number N counts every send of one logical request: 1 for the first
# attempt, 2 for the first retry. Clients and proxies in the wild each say it their
# own way, so each header is converted to N:
#
#   header                       sent by                           value    N
#   ---------------------------  --------------------------------  -------  ------
#   retry-attempt                stormguard clients (on retries)   N        N
#   grpc-previous-rpc-attempts   gRPC clients (A6 retries)         N - 1    v + 1
#   x-envoy-attempt-count        Envoy (every attempt)             N        N
#   amz-sdk-request              AWS SDKs: "attempt=N; max=M"      N        N
#   x-stainless-retry-count      OpenAI/Anthropic SDKs (Stainless)  N - 1    v + 1
#
# No header means a first attempt (N = 1). Several sources (a client behind an
# Envoy that retried on its own) give the largest N: a request retried by any hop
# is a retry for the shedding order. Repeated or comma-joined values count by
# their largest member.
#
# Hostile input never raises: names and values are bytes or str of any kind; a
# value that is not a small non-negative integer (or lies outside a source's
# range: Retry-Attempt 0, a negative count) is ignored; values longer than
# _MAX_VALUE characters are not looked at; N is capped at MAX_ATTEMPT, so a
# client claiming attempt 10**100 costs one comparison.
# Pure: no I/O, no clock.
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._ratelimit_headers import HeadersLike, _text

__all__ = [
    "ATTEMPT_HEADERS",
    "GRPC_PREVIOUS_ATTEMPTS",
    "MAX_ATTEMPT",
    "RETRY_ATTEMPT",
    "attempt_from",
    "attempt_number",
]

RETRY_ATTEMPT = "retry-attempt"
GRPC_PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"
MAX_ATTEMPT = 1000
_MAX_VALUE = 256
_DIGITS = frozenset("0123456789")
_WS = " \t\r\n"

# lower-case name -> (what N is the value plus, the smallest valid value)
_SOURCES: dict[str, tuple[int, int]] = {
    RETRY_ATTEMPT: (0, 1),
    GRPC_PREVIOUS_ATTEMPTS: (1, 0),
    "x-envoy-attempt-count": (0, 1),
    "amz-sdk-request": (0, 1),
    "x-stainless-retry-count": (1, 0),
}
ATTEMPT_HEADERS: tuple[str, ...] = tuple(_SOURCES)


def _count(text: str) -> int | None:
    # A small non-negative decimal integer (surrounding whitespace allowed), else None.
    text = text.strip(_WS)
    if not text or len(text) > 12 or not _DIGITS.issuperset(text):
        return None
    return int(text)


def _amz_attempt(member: str) -> int | None:
    # "attempt=2; max=3" (AWS SDK "amz-sdk-request"): the attempt parameter.
    for part in member.split(";"):
        key, sep, value = part.partition("=")
        if sep and key.strip(_WS).lower() == "attempt":
            return _count(value)
    return None


def _value_attempt(name: str, value: str) -> int:
    # N from one header's value (0: nothing valid in it).
    plus, least = _SOURCES[name]
    best = 0
    for member in value.split(",")[:16]:
        count = _amz_attempt(member) if name == "amz-sdk-request" else _count(member)
        if count is not None and count >= least:
            best = max(best, min(count + plus, MAX_ATTEMPT))
    return best


def attempt_number(headers: HeadersLike) -> int:
    """The attempt number of a request (1 = first attempt) from its headers.

    ``headers`` is any mapping or iterable of ``(name, value)`` pairs, names and
    values ``str`` or ``bytes``, names case-insensitive (ASGI's raw header list and
    gRPC metadata work as they are). Read, converted to one count:
    ``Retry-Attempt: N``; ``grpc-previous-rpc-attempts: N - 1``;
    ``x-envoy-attempt-count: N`` and ``amz-sdk-request: attempt=N`` (1 on a first
    attempt); ``X-Stainless-Retry-Count: N - 1`` (0 on a first attempt). With none
    of them the answer is 1; with several, the largest count. Malformed values are
    ignored and the count is capped at 1000; never raises.
    """
    items: Iterable[Any] = headers.items() if isinstance(headers, Mapping) else headers
    best = 1
    try:
        for item in items:
            try:
                raw_name, raw_value = item
            except (TypeError, ValueError):
                continue
            name = _text(raw_name)
            if name is None or len(name) > 32:
                continue
            lname = name.strip(_WS).lower()
            if lname not in _SOURCES:
                continue
            value = _text(raw_value)
            if value is None or len(value) > _MAX_VALUE:
                continue
            best = max(best, _value_attempt(lname, value))
    except TypeError:  # not iterable at all
        return 1
    return best


def attempt_from(lookup: Callable[[str], str | None]) -> int:
    """:func:`attempt_number` through a look-up by lower-case name (a request view's
    ``header``), for front ends that already index their headers."""
    best = 1
    for name in ATTEMPT_HEADERS:
        value = lookup(name)
        if value is not None and len(value) <= _MAX_VALUE:
            best = max(best, _value_attempt(name, value))
    return best
