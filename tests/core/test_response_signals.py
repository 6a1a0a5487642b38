"""What a failed response's headers say: GitHub 403s, should-retry verdicts, retry-after-ms."""

from __future__ import annotations

import random
from typing import Any

import pytest

from stormguard import RetryPolicy
from stormguard.client._http import error_failure, response_failure
from stormguard.core import (
    Failure,
    GiveUp,
    GiveUpReason,
    Retry,
    RetryFailure,
    RetryState,
    decide,
)
from stormguard.core._headers import (
    response_signals,
    server_should_retry,
    table_status,
    wait_hint,
)

NOW = 1_700_000_000.0
PRIMARY = {
    "x-ratelimit-limit": "5000",
    "x-ratelimit-remaining": "0",
    "x-ratelimit-reset": "1700000030",
}
SECONDARY = {"retry-after": "60", "x-ratelimit-remaining": "4990"}
BAD_CREDENTIALS = {"x-ratelimit-limit": "60", "x-ratelimit-remaining": "59"}


def judge(
    status: int, headers: dict[str, str], method: str = "GET", **policy: Any
) -> RetryFailure | None:
    """response_failure for one response, with the wall clock at NOW."""
    return response_failure(
        RetryPolicy(**policy),
        status,
        list(headers.items()),
        method=method,
        has_key=False,
        wall_now=NOW,
        subject=("response", status),
    )


@pytest.mark.parametrize(
    ("headers", "expected"),
    [(PRIMARY, 429), (SECONDARY, 429), ({"Retry-After": "Tue, 14 Nov 2023 22:14:20 GMT"}, 429)],
    ids=["primary-remaining-0", "secondary-retry-after", "retry-after-date"],
)
def test_github_rate_limit_403_is_a_429(headers: dict[str, str], expected: int) -> None:
    """A 403 with x-ratelimit-remaining: 0 or Retry-After reads as 429 in the decision table."""
    assert table_status(403, headers, now=NOW) == expected


@pytest.mark.parametrize(
    "headers",
    [{}, BAD_CREDENTIALS, {"Retry-After": "soon"}, {"content-type": "application/json"}],
    ids=["bare", "bad-credentials", "unparseable-retry-after", "json"],
)
def test_403_without_rate_limit_headers_stays_403(headers: dict[str, str]) -> None:
    """A 403 such as "Bad credentials" stays a 403: not a rate-limit refusal."""
    assert table_status(403, headers, now=NOW) == 403


@pytest.mark.parametrize("status", [200, 404, 429, 500, 503])
def test_other_statuses_are_not_reclassified(status: int) -> None:
    """Only 403 is ever read as something else, whatever the headers."""
    assert table_status(status, PRIMARY, now=NOW) == status


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_github_403_with_remaining_0_waits_for_the_reset_and_retries(method: str) -> None:
    """A primary-limit 403 is retried (even a POST: not processed) after the reset."""
    failure = judge(403, PRIMARY, method)
    assert failure is not None and failure.retryable and not failure.repeat_unsafe
    assert failure.hint == 30.0 and "rate limited" in failure.reason
    action = decide(
        RetryPolicy(), RetryState(started_at=0.0), failure, now=0.0, rng=random.Random(1)
    )
    assert isinstance(action, Retry) and action.hint_used and 30.0 <= action.wait <= 31.0


def test_github_secondary_403_with_retry_after_is_retried_after_it() -> None:
    """A secondary-limit 403 with Retry-After: 60 is retried after 60 s, with max_wait=60."""
    failure = judge(403, SECONDARY, "POST")
    assert failure is not None and failure.retryable and failure.hint == 60.0


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_github_403_bad_credentials_is_never_retried(method: str) -> None:
    """A 403 without rate-limit headers is a final answer: returned as it is."""
    assert judge(403, BAD_CREDENTIALS, method) is None


def test_403_is_not_retried_when_429_is_not_in_the_table() -> None:
    """A rate-limit 403 follows 429's row: removing 429 from the table removes both."""
    assert judge(403, PRIMARY, retry_statuses={503}) is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-should-retry": "true"}, True),
        ({"X-Should-Retry": "FALSE"}, False),
        ({"Stripe-Should-Retry": "True"}, True),
        ({"stripe-should-retry": " false "}, False),
        ({"STRIPE-SHOULD-RETRY": "false"}, False),
        ({"x-should-retry": "maybe"}, None),
        ({"x-should-retry": "1"}, None),
        ({}, None),
        ([(b"X-Should-Retry", b"true")], True),
    ],
    ids=[
        "x-true",
        "x-FALSE",
        "stripe-True",
        "stripe-spaces",
        "stripe-upper",
        "maybe",
        "one",
        "absent",
        "bytes",
    ],
)
def test_should_retry_headers_are_read_case_insensitively(
    headers: object, expected: bool | None
) -> None:
    """x-should-retry and Stripe-Should-Retry: names and values in any case; others are None."""
    assert server_should_retry(headers) is expected  # type: ignore[arg-type]


def test_x_should_retry_false_stops_a_retryable_503() -> None:
    """x-should-retry: false on a 503 GET: never retried although the table says retry."""
    failure = judge(503, {"x-should-retry": "false"})
    assert failure is not None and failure.should_retry is False
    action = decide(RetryPolicy(), RetryState(0.0), failure, now=0.0, rng=random.Random(1))
    assert action == GiveUp(GiveUpReason.NOT_RETRYABLE)


@pytest.mark.parametrize("status", [500, 409, 503])
def test_stripe_should_retry_true_retries_an_unkeyed_post(status: int) -> None:
    """Stripe-Should-Retry: true retries an unkeyed POST, also for a status outside the table."""
    failure = judge(status, {"Stripe-Should-Retry": "true"}, "POST")
    assert failure is not None and failure.should_retry is True
    action = decide(RetryPolicy(), RetryState(0.0), failure, now=0.0, rng=random.Random(1))
    assert isinstance(action, Retry)


def test_unkeyed_post_503_may_have_been_processed() -> None:
    """A 503 to an unkeyed POST is marked repeat-unsafe, so retry_if cannot retry it."""
    failure = judge(503, {}, "POST", retry_if=lambda response: True)
    assert failure is not None and failure.repeat_unsafe and not failure.retryable
    action = decide(
        RetryPolicy(retry_if=lambda response: True),
        RetryState(0.0),
        failure,
        now=0.0,
        rng=random.Random(1),
    )
    assert action == GiveUp(GiveUpReason.NOT_RETRYABLE)


def test_retry_if_sees_a_status_outside_the_table() -> None:
    """With retry_if set, a 409 on GET becomes a failure whose subject is the response."""
    policy = RetryPolicy(retry_if=lambda response: response == ("response", 409))
    failure = judge(409, {}, retry_if=policy.retry_if)
    assert failure is not None and failure.subject == ("response", 409)
    action = decide(policy, RetryState(0.0), failure, now=0.0, rng=random.Random(1))
    assert isinstance(action, Retry)


def test_error_failure_carries_the_exception_and_safety() -> None:
    """A transport error's failure carries the exception; maybe-processed POSTs are unsafe."""
    exc = ConnectionResetError("reset")
    sent = error_failure(Failure.MAYBE_PROCESSED, exc, method="POST", has_key=False)
    never = error_failure(Failure.NOT_SENT, exc, method="POST", has_key=False)
    assert sent.subject is exc and sent.repeat_unsafe and not sent.retryable
    assert never.retryable and not never.repeat_unsafe


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"Retry-After-Ms": "250.5"}, 0.2505),
        ({"retry-after-ms": "20", "retry-after": "1"}, 0.02),
        ({"retry-after-ms": "soon", "retry-after": "2"}, 2.0),
        ({"retry-after-ms": "-5"}, None),
        ({"retry-after-ms": "1e3"}, None),
        ({"retry-after-ms": "\u0661\u0662"}, None),
        ([("retry-after-ms", "300, 300")], 0.3),
    ],
    ids=[
        "ms",
        "decimal",
        "ms-beats-seconds",
        "bad-ms-falls-back",
        "negative",
        "exponent",
        "arabic-digits",
        "merged-repeat",
    ],
)
def test_retry_after_ms_is_a_wait_hint(headers: object, expected: float | None) -> None:
    """retry-after-ms (OpenAI, Anthropic) gives the wait in milliseconds, before Retry-After."""
    assert wait_hint(429, headers, now=NOW) == expected  # type: ignore[arg-type]


def test_response_signals_in_one_pass() -> None:
    """response_signals returns the table status, the verdict and the hint together."""
    headers = {**PRIMARY, "x-should-retry": "true"}
    assert response_signals(403, headers, now=NOW) == (429, True, 30.0)


def test_x_amz_retry_after_is_a_hint_in_milliseconds() -> None:
    """AWS's x-amz-retry-after: 1500 asks for 1.5 s (like retry-after-ms)."""
    assert wait_hint(503, {"x-amz-retry-after": "1500"}, now=NOW) == 1.5


@pytest.mark.parametrize(
    "error_type",
    [
        "ThrottlingException",
        "ThrottlingException:http://internal.amazon.com/coral/com.amazon.coral.availability/",
        "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
    ],
)
def test_an_aws_throttling_error_on_a_400_reads_as_429(error_type: str) -> None:
    """x-amzn-ErrorType naming a throttling code makes a 400 a refusal (a 429)."""
    signals = response_signals(400, {"x-amzn-ErrorType": error_type}, now=NOW)
    assert signals.status == 429


def test_an_aws_validation_error_stays_a_400() -> None:
    """Any other error type is the caller's own mistake: the 400 stays."""
    headers = {"x-amzn-ErrorType": "ValidationException"}
    assert response_signals(400, headers, now=NOW).status == 400
