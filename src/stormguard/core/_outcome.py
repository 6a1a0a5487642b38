# What a failed attempt tells us, and whether trying again is safe.
#
# The decision table (DESIGN.md, adapter rule 1). "Safe" methods and requests that
# carry an Idempotency-Key may be repeated without a second side effect; POST and
# PATCH without a key may only be repeated when the failure proves the server never
# processed the request.
#
#   failure                                   idempotent / keyed     POST, PATCH, no key
#   ----------------------------------------  ---------------------  -------------------
#   connection never established (NOT_SENT)   retry                  retry
#   429 Too Many Requests                     retry                  retry
#   408, 425, 502, 503, 504 (retryable set)   retry                  give up
#   sent, then timeout/reset (MAYBE_PROCESSED) retry                  give up
#   other 4xx, 500, 501, ... (FINAL)          give up                give up
#   2xx, 3xx                                  success                success
#
# One more row is the HTTP adapters' (client/_http.py), since it needs the hint:
# a keyed request's 409 with a Retry-After is an idempotency layer saying the
# first request with that key is still running: retried after the hint.
#
# A status counts as a failure of the *server* (for circuit breakers) when it is 5xx
# or 429-less transport trouble; 4xx are the caller's own failures.
from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

__all__ = [
    "DEFAULT_RETRY_STATUSES",
    "IDEMPOTENT_METHODS",
    "NOT_PROCESSED_STATUSES",
    "Failure",
    "Verdict",
    "classify_error",
    "classify_status",
    "counts_against_server",
    "is_idempotent",
]

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
DEFAULT_RETRY_STATUSES = frozenset({408, 425, 429, 502, 503, 504})
# Statuses that prove the server refused the request before processing it.
NOT_PROCESSED_STATUSES = frozenset({429})


class Failure(enum.Enum):
    """What kind of failure a transport error is."""

    NOT_SENT = "not sent"  # the request never reached the server: always safe to retry
    MAYBE_PROCESSED = "maybe processed"  # sent, then lost: safe only when idempotent
    FINAL = "final"  # not a transient failure at all


class Verdict(enum.Enum):
    """The table's answer for one attempt."""

    SUCCESS = "success"
    RETRY = "retry"
    GIVE_UP = "give up"


def is_idempotent(method: str, *, has_idempotency_key: bool = False) -> bool:
    """True when repeating the request cannot cause a second side effect."""
    return has_idempotency_key or method.upper() in IDEMPOTENT_METHODS


@dataclass(frozen=True, slots=True)
class _Row:
    idempotent: Verdict
    unkeyed: Verdict


def classify_status(
    status: int,
    method: str,
    *,
    has_idempotency_key: bool = False,
    retry_statuses: Collection[int] = DEFAULT_RETRY_STATUSES,
) -> Verdict:
    """Classify an HTTP response status by the decision table."""
    if status < 400:
        return Verdict.SUCCESS
    if status not in retry_statuses:
        return Verdict.GIVE_UP
    if status in NOT_PROCESSED_STATUSES:
        return Verdict.RETRY
    if is_idempotent(method, has_idempotency_key=has_idempotency_key):
        return Verdict.RETRY
    return Verdict.GIVE_UP


def classify_error(failure: Failure, method: str, *, has_idempotency_key: bool = False) -> Verdict:
    """Classify a transport error by the decision table."""
    if failure is Failure.NOT_SENT:
        return Verdict.RETRY
    if failure is Failure.MAYBE_PROCESSED and is_idempotent(
        method, has_idempotency_key=has_idempotency_key
    ):
        return Verdict.RETRY
    return Verdict.GIVE_UP


def counts_against_server(status: int | None, failure: Failure | None) -> bool:
    """Whether a breaker should count this attempt as the upstream failing.

    5xx and transport errors count; 4xx (including 429, which is the server
    protecting itself as designed) and successes do not.
    """
    if failure is not None:
        return failure is not Failure.FINAL
    return status is not None and status >= 500
