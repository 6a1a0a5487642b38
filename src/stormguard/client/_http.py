# What the HTTP adapters (httpx, requests) share: turning a response or a transport
# error into a RetryFailure by the decision table, idempotency keys, and log-safe
# request descriptions. No HTTP library is imported here.
from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..core._body_hints import MAX_BODY, wait_hint_from_body
from ..core._headers import response_signals
from ..core._outcome import (
    NOT_PROCESSED_STATUSES,
    Failure,
    Verdict,
    classify_error,
    classify_status,
    is_idempotent,
)
from ..core._policy import RetryFailure, RetryPolicy

__all__ = [
    "BODY_HINT_STATUSES",
    "IDEMPOTENCY_KEY",
    "body_worth_reading",
    "KEYED_METHODS",
    "describe",
    "error_failure",
    "mentions_quota",
    "new_idempotency_key",
    "response_failure",
]

IDEMPOTENCY_KEY = "Idempotency-Key"
# Methods that get a generated key with idempotency_keys=True.
KEYED_METHODS = frozenset({"POST", "PATCH"})


def new_idempotency_key() -> str:
    """A fresh key (UUID4), created once per logical request."""
    return str(uuid.uuid4())


def describe(method: str, url: str) -> str:
    """``"GET https://host/path"``: the query and credentials are left out of logs."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        return f"{method} {urlunsplit((parts.scheme, host, parts.path, '', ''))}"
    except ValueError:
        return method


# Statuses whose body may say how long to wait when the headers do not.
BODY_HINT_STATUSES = frozenset({429, 503})


def body_worth_reading(status: int, content_length: str | None) -> bool:
    """Whether a failed response's body is small enough to look for a wait hint in it."""
    if status not in BODY_HINT_STATUSES or content_length is None:
        return False
    try:
        return 0 < int(content_length) <= MAX_BODY
    except ValueError:
        return False


def mentions_quota(names: Iterable[str]) -> bool:
    """Whether lower-cased header ``names`` include a rate-limit header of any provider."""
    return any("ratelimit" in name or "rate-limit" in name for name in names)


def response_failure(
    policy: RetryPolicy,
    status: int,
    headers: Iterable[tuple[str, str]],
    *,
    method: str,
    has_key: bool,
    wall_now: float,
    body: bytes | None = None,
    content_type: str | None = None,
    subject: Any = None,
) -> RetryFailure | None:
    """``None`` when the response ends the call as it is (success or a final status).

    Callers pass every response (no pre-filtering by ``retry_statuses``): a
    GitHub-style rate-limit 403 reads as 429, and a status outside the table is
    still worth a failure when the server says ``x-should-retry: true`` or the
    policy has a ``retry_if`` predicate (called later with ``subject``, the
    response). The wait hint comes from the headers; failing that, from ``body``
    when given (Discord-style ``{"retry_after": 1.5}``, "try again in 20s").
    """
    if status < 400:
        return None
    effective, verdict_of_server, hint = response_signals(status, headers, now=wall_now)
    # A keyed request's 409 with a Retry-After is an idempotency layer's "the first
    # request with this key is still running" (stormguard's IdempotencyMiddleware
    # and gateway answer so): this copy was not processed, and once the first ends
    # the same key gets its stored answer. It is retried after the hint by default
    # (Stripe's and OpenAI's SDKs retry 409 too); retry_if=False can refuse it.
    in_flight = effective == 409 and has_key and hint is not None
    if (
        effective not in policy.retry_statuses
        and verdict_of_server is not True
        and policy.retry_if is None
        and not in_flight
    ):
        return None  # a final answer such as 400 or 404 is returned as it is
    verdict = classify_status(
        effective, method, has_idempotency_key=has_key, retry_statuses=policy.retry_statuses
    )
    if hint is None and body:
        hint = wait_hint_from_body(body, content_type)
    refused = effective in NOT_PROCESSED_STATUSES or in_flight  # the server did not process it
    unsafe = not refused and not is_idempotent(method, has_idempotency_key=has_key)
    reason = f"status {status}" if effective == status else f"status {status} (rate limited)"
    if in_flight:
        reason = "status 409 (the same key is in flight)"
    return RetryFailure(
        verdict is Verdict.RETRY or in_flight,
        reason,
        hint,
        should_retry=verdict_of_server,
        repeat_unsafe=unsafe,
        subject=subject,
        throttled=effective == 429,
    )


def error_failure(
    failure: Failure, exc: BaseException, *, method: str, has_key: bool
) -> RetryFailure:
    """A transport error as a RetryFailure."""
    verdict = classify_error(failure, method, has_idempotency_key=has_key)
    reason = f"{type(exc).__name__} ({failure.value})"
    unsafe = failure is not Failure.NOT_SENT and not is_idempotent(
        method, has_idempotency_key=has_key
    )
    return RetryFailure(verdict is Verdict.RETRY, reason, repeat_unsafe=unsafe, subject=exc)
