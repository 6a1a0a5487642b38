"""Headers and hints: what the server says about when to come back.

The public face of the header-parsing core. Parsing lives in two modules:
``_retry_after`` (delay-seconds, HTTP-dates, RFC 3339, Go durations) and
``_ratelimit_headers`` (rate-limit fields into :class:`Quota`). Everything here is
pure: ``now`` (Unix seconds) is passed in, nothing reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._ratelimit_headers import HeadersLike, Quota, _build, _collect, _text, parse_rate_limits
from ._retry_after import parse_retry_after

__all__ = [
    "HeadersLike",
    "Quota",
    "parse_rate_limits",
    "parse_retry_after",
    "server_should_retry",
    "table_status",
    "wait_hint",
]

# Servers that say themselves whether a failed request may be repeated:
#   x-should-retry: true|false        OpenAI and Anthropic (their SDKs obey it first)
#   Stripe-Should-Retry: true|false   Stripe
# "false" means never retry this response; "true" means the server vouches that
# repeating it is safe, even for a POST without an idempotency key.
_SHOULD_RETRY = frozenset({"x-should-retry", "stripe-should-retry"})
_MAX_HEADERS = 512  # look at no more fields than this for a should-retry verdict


def _retry_after_seconds(values: list[str], now: float) -> float | None:
    for value in values:
        seconds = parse_retry_after(value, now=now)
        if seconds is None and "," in value:
            # A mapping that merged repeated fields ("120, 120"). An HTTP-date has
            # its own comma, but its first piece ("Sun") never parses on its own.
            seconds = parse_retry_after(value.split(",", 1)[0], now=now)
        if seconds is not None:
            return seconds
    return None


def _pairs(headers: HeadersLike) -> Iterable[Any]:
    return headers.items() if isinstance(headers, Mapping) else headers


def server_should_retry(headers: HeadersLike) -> bool | None:
    """The server's own verdict on repeating this request, else ``None``.

    Reads ``x-should-retry`` (OpenAI, Anthropic) and ``Stripe-Should-Retry``
    (Stripe), names and values case-insensitively: ``true`` -> ``True``, ``false``
    -> ``False``; absent or any other value -> ``None``. The first field that
    reads as a verdict counts. Never raises on malformed headers.
    """
    for count, item in enumerate(_pairs(headers)):
        if count >= _MAX_HEADERS:
            break
        try:
            raw_name, raw_value = item
        except (TypeError, ValueError):
            continue
        name = _text(raw_name)
        if name is None or len(name) > 32 or name.strip().lower() not in _SHOULD_RETRY:
            continue
        value = _text(raw_value)
        if value is None or len(value) > 16:
            continue
        verdict = value.strip().lower()
        if verdict == "true":
            return True
        if verdict == "false":
            return False
    return None


def table_status(status: int, headers: HeadersLike, *, now: float) -> int:
    """The status the decision table reads for this response.

    A rate-limit refusal sent as 403 reads as 429: GitHub answers a primary rate
    limit with 403 or 429 plus ``x-ratelimit-remaining: 0`` (and a reset), and a
    secondary limit with 403 or 429 plus ``Retry-After``. Such a 403 means "not
    processed, come back later" exactly like a 429, so it is retried after the
    hint, even for a POST. A 403 without those headers ("Bad credentials",
    "Resource not accessible") stays a 403 and is never retried. Every other status
    is returned as it is. Never raises on malformed headers.
    """
    if status != 403:
        return status
    retry_after, fields = _collect(headers)
    if _retry_after_seconds(retry_after, now) is not None:
        return 429
    if fields and any(quota.remaining == 0 for quota in _build(fields, now)):
        return 429
    return status


def wait_hint(status: int, headers: HeadersLike, *, now: float) -> float | None:
    """The server's own answer to "how long should I wait", in seconds from ``now``.

    1. ``Retry-After``, when one parses (the first that does, if repeated);
    2. else the reset of an exhausted quota (``remaining == 0``); with several
       exhausted quotas the longest reset, since every one of them must recover
       before a request can pass;
    3. else ``None``: the caller's backoff decides.

    ``status`` does not change the answer today: a server that sends these
    headers means them on any status, and the caller only asks after deciding
    the response is worth retrying. It is part of the signature so status-aware
    rules can be added without breaking callers. Huge hints are returned as they
    are; ``max_wait`` in the retry policy decides whether to honour them. Never
    raises on malformed header values.
    """
    del status  # see docstring
    retry_after, fields = _collect(headers)
    seconds = _retry_after_seconds(retry_after, now)
    if seconds is not None:
        return seconds
    resets = [
        quota.reset_after
        for quota in (_build(fields, now) if fields else ())
        if quota.remaining == 0 and quota.reset_after is not None
    ]
    return max(resets) if resets else None
