"""The decision table: what gets retried."""

from __future__ import annotations

import pytest

from stormguard.core import (
    Failure,
    Verdict,
    classify_error,
    classify_status,
    counts_against_server,
    is_idempotent,
)

IDEMPOTENT = ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE", "get"]
UNSAFE = ["POST", "PATCH"]


@pytest.mark.parametrize("method", IDEMPOTENT + UNSAFE)
@pytest.mark.parametrize("status", [200, 201, 204, 301, 304])
def test_success_statuses(method: str, status: int) -> None:
    """2xx and 3xx end the call as a success."""
    assert classify_status(status, method) is Verdict.SUCCESS


@pytest.mark.parametrize("method", IDEMPOTENT)
@pytest.mark.parametrize("status", [408, 425, 429, 502, 503, 504])
def test_idempotent_methods_retry_retryable_statuses(method: str, status: int) -> None:
    """Idempotent methods retry every status in the retryable set."""
    assert classify_status(status, method) is Verdict.RETRY


@pytest.mark.parametrize("method", UNSAFE)
@pytest.mark.parametrize("status", [408, 425, 502, 503, 504])
def test_unkeyed_post_does_not_retry_maybe_processed_statuses(method: str, status: int) -> None:
    """POST/PATCH without a key give up on statuses that do not prove non-processing."""
    assert classify_status(status, method) is Verdict.GIVE_UP


@pytest.mark.parametrize("method", UNSAFE)
def test_unkeyed_post_retries_429(method: str) -> None:
    """429 proves the request was refused, so even an unkeyed POST retries it."""
    assert classify_status(429, method) is Verdict.RETRY


@pytest.mark.parametrize("status", [408, 425, 429, 502, 503, 504])
def test_keyed_post_retries_like_idempotent(status: int) -> None:
    """An Idempotency-Key makes a POST as safe to retry as a GET."""
    assert classify_status(status, "POST", has_idempotency_key=True) is Verdict.RETRY


@pytest.mark.parametrize("method", IDEMPOTENT + UNSAFE)
@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422, 500, 501, 505])
def test_other_errors_are_final(method: str, status: int) -> None:
    """4xx other than 408/425/429, and 500/501, are never retried."""
    assert classify_status(status, method, has_idempotency_key=True) is Verdict.GIVE_UP


def test_custom_retry_statuses() -> None:
    """A custom status set replaces the default one."""
    assert classify_status(500, "GET", retry_statuses={500}) is Verdict.RETRY
    assert classify_status(503, "GET", retry_statuses={500}) is Verdict.GIVE_UP


@pytest.mark.parametrize("method", IDEMPOTENT + UNSAFE)
def test_never_sent_is_always_retryable(method: str) -> None:
    """A request that never reached the server may be retried whatever its method."""
    assert classify_error(Failure.NOT_SENT, method) is Verdict.RETRY


@pytest.mark.parametrize(
    ("method", "keyed", "verdict"),
    [
        ("GET", False, Verdict.RETRY),
        ("PUT", False, Verdict.RETRY),
        ("POST", False, Verdict.GIVE_UP),
        ("PATCH", False, Verdict.GIVE_UP),
        ("POST", True, Verdict.RETRY),
    ],
)
def test_maybe_processed_needs_idempotency(method: str, keyed: bool, verdict: Verdict) -> None:
    """Sent-then-lost is retried only for idempotent or keyed requests."""
    assert classify_error(Failure.MAYBE_PROCESSED, method, has_idempotency_key=keyed) is verdict


def test_final_errors_are_never_retried() -> None:
    """An error that is no transient failure gives up."""
    assert classify_error(Failure.FINAL, "GET") is Verdict.GIVE_UP


def test_idempotency() -> None:
    """Methods are compared case-insensitively; a key makes anything idempotent."""
    assert is_idempotent("delete") and not is_idempotent("POST")
    assert is_idempotent("POST", has_idempotency_key=True)


@pytest.mark.parametrize(
    ("status", "failure", "counts"),
    [
        (503, None, True),
        (500, None, True),
        (429, None, False),
        (404, None, False),
        (200, None, False),
        (None, Failure.NOT_SENT, True),
        (None, Failure.MAYBE_PROCESSED, True),
        (None, Failure.FINAL, False),
    ],
)
def test_breaker_counts_server_failures(
    status: int | None, failure: Failure | None, counts: bool
) -> None:
    """5xx and transport errors count against the server; 4xx do not."""
    assert counts_against_server(status, failure) is counts
