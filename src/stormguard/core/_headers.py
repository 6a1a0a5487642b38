"""Headers and hints: what the server says about when to come back.

The public face of the header-parsing core. Parsing lives in two modules:
``_retry_after`` (delay-seconds, HTTP-dates, RFC 3339, Go durations) and
``_ratelimit_headers`` (rate-limit fields into :class:`Quota`). Everything here is
pure: ``now`` (Unix seconds) is passed in, nothing reads a clock.
"""

from __future__ import annotations

from ._ratelimit_headers import HeadersLike, Quota, _build, _collect, parse_rate_limits
from ._retry_after import parse_retry_after

__all__ = ["HeadersLike", "Quota", "parse_rate_limits", "parse_retry_after", "wait_hint"]


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
