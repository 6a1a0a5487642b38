"""Headers and hints: what the server says about when to come back.

The public face of the header-parsing core. Parsing lives in two modules:
``_retry_after`` (delay-seconds, HTTP-dates, RFC 3339, Go durations) and
``_ratelimit_headers`` (rate-limit fields into :class:`Quota`). Everything here is
pure: ``now`` (Unix seconds) is passed in, nothing reads a clock.
"""

from __future__ import annotations

from typing import NamedTuple

from ._ratelimit_headers import HeadersLike, Quota, _build, _collect, parse_rate_limits
from ._retry_after import parse_delay_ms, parse_retry_after

__all__ = [
    "HeadersLike",
    "Quota",
    "ResponseSignals",
    "parse_rate_limits",
    "parse_retry_after",
    "response_signals",
    "server_should_retry",
    "table_status",
    "wait_hint",
]

# Servers that say themselves whether a failed request may be repeated:
#   x-should-retry: true|false        OpenAI and Anthropic (their SDKs obey it first)
#   Stripe-Should-Retry: true|false   Stripe
# "false" means never retry this response; "true" means the server vouches that
# repeating it is safe, even for a POST without an idempotency key.
_SHOULD_RETRY = ("x-should-retry", "stripe-should-retry")
_WS = " \t\r\n"


def _retry_after_ms(values: list[str]) -> float | None:
    for value in values:
        seconds = parse_delay_ms(value)
        if seconds is None and "," in value:  # repeated fields merged by a mapping
            seconds = parse_delay_ms(value.split(",", 1)[0])
        if seconds is not None:
            return seconds
    return None


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


def _verdict(fields: dict[str, list[str]]) -> bool | None:
    for name in _SHOULD_RETRY:
        for value in fields.get(name, ()):
            verdict = value.strip(_WS).lower()
            if verdict == "true":
                return True
            if verdict == "false":
                return False
    return None


def server_should_retry(headers: HeadersLike) -> bool | None:
    """The server's own verdict on repeating this request, else ``None``.

    Reads ``x-should-retry`` (OpenAI, Anthropic) and ``Stripe-Should-Retry``
    (Stripe), names and values case-insensitively: ``true`` -> ``True``, ``false``
    -> ``False``; absent or any other value -> ``None``. Should both say opposite
    things, ``x-should-retry`` counts. Never raises on malformed headers.
    """
    return _verdict(_collect(headers)[1])


class ResponseSignals(NamedTuple):
    """What a failed response's headers say, read in one pass.

    ``status``: the status the decision table reads (a rate-limit 403 reads as
    429). ``should_retry``: the server's verdict (:func:`server_should_retry`).
    ``hint``: seconds to wait from ``now`` (:func:`wait_hint`).
    """

    status: int
    should_retry: bool | None
    hint: float | None


def response_signals(status: int, headers: HeadersLike, *, now: float) -> ResponseSignals:
    """The table status, the server's should-retry verdict and the wait hint, in one pass.

    An AWS throttling error answered with a 4xx (``x-amzn-ErrorType:
    ThrottlingException`` on a 400, as JSON-protocol services send it) reads as
    429 too. A rate-limit refusal sent as 403 reads as 429: GitHub answers a primary rate
    limit with 403 or 429 plus ``x-ratelimit-remaining: 0`` (and a reset), and a
    secondary limit with 403 or 429 plus ``Retry-After``. Such a 403 means "not
    processed, come back later" exactly like a 429, so it is retried after the
    hint, even for a POST. A 403 without those headers ("Bad credentials",
    "Resource not accessible") stays a 403 and is never retried. Every other status
    is kept as it is. Never raises on malformed headers.
    """
    retry_after, fields = _collect(headers)
    millis = fields.get("retry-after-ms") or fields.get("x-amz-retry-after")
    hint = _retry_after_ms(millis) if millis else None
    if hint is None:
        hint = _retry_after_seconds(retry_after, now)
    exhausted = False
    if hint is None or status == 403:
        quotas = _build(fields, now) if fields else ()
        resets = []
        for quota in quotas:
            if quota.remaining == 0:
                exhausted = True
                if quota.reset_after is not None:
                    resets.append(quota.reset_after)
        if hint is None and resets:
            hint = max(resets)
    if (status == 403 and (exhausted or hint is not None)) or (
        400 <= status < 500 and _aws_throttled(fields.get("x-amzn-errortype"))
    ):
        status = 429
    return ResponseSignals(status, _verdict(fields), hint)


# The error codes AWS services answer a throttled request with (botocore's
# ThrottledRetryableChecker and the SDKs' lists): as a 4xx they mean exactly what
# a 429 means -- not processed, come back later.
_AWS_THROTTLING = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)


def _aws_throttled(values: list[str] | None) -> bool:
    # x-amzn-ErrorType: "ThrottlingException:http://internal.amazon.com/..." or a
    # shape id "com.amazonaws.dynamodb.v20120810#ThrottlingException".
    if not values:
        return False
    code = values[0].split(":", 1)[0].rpartition("#")[2].strip(_WS)
    return code in _AWS_THROTTLING


def table_status(status: int, headers: HeadersLike, *, now: float) -> int:
    """The status the decision table reads: a GitHub-style rate-limit 403 reads as 429.

    See :func:`response_signals`; every status but such a 403 is returned as it is.
    """
    return response_signals(status, headers, now=now).status


def wait_hint(status: int, headers: HeadersLike, *, now: float) -> float | None:
    """The server's own answer to "how long should I wait", in seconds from ``now``.

    1. ``retry-after-ms`` (OpenAI, Anthropic: milliseconds, more precise) or
       ``x-amz-retry-after`` (AWS, milliseconds), when one parses;
    2. else ``Retry-After``, when one parses (the first that does, if repeated);
    3. else the reset of an exhausted quota (``remaining == 0``); with several
       exhausted quotas the longest reset, since every one of them must recover
       before a request can pass;
    4. else ``None``: the caller's backoff decides.

    ``status`` does not change the answer: a server that sends these headers means
    them on any status, and the caller only asks after deciding the response is
    worth retrying. Huge hints are returned as they are; ``max_wait`` in the retry
    policy decides whether to honour them. A hint of ``0`` means "no wait asked"
    (the policy then uses its jittered backoff). Never raises on malformed header
    values.
    """
    return response_signals(status, headers, now=now).hint
