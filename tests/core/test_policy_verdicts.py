"""Who decides a retry: the server's should-retry verdict, then retry_if, then the table."""

from __future__ import annotations

import random
from typing import Any

import pytest

from stormguard import Constant, RetryPolicy
from stormguard.core import GiveUp, GiveUpReason, Retry, RetryFailure, RetryState, decide
from stormguard.core._policy import is_retryable

NOW = 0.0
SUBJECT = object()  # stands for a response or an exception


def one(policy: RetryPolicy, failure: RetryFailure) -> Retry | GiveUp:
    """The decision after the first failed attempt of a call started at NOW."""
    return decide(policy, RetryState(started_at=NOW), failure, now=NOW, rng=random.Random(7))


def test_should_retry_false_is_never_retried() -> None:
    """x-should-retry: false ends the call although the table would retry (a 503 GET)."""
    failure = RetryFailure(True, "status 503", should_retry=False)
    assert one(RetryPolicy(), failure) == GiveUp(GiveUpReason.NOT_RETRYABLE)


def test_should_retry_true_retries_an_unkeyed_post() -> None:
    """should-retry: true retries a failure the table forbids and that may have been processed."""
    failure = RetryFailure(False, "status 500", should_retry=True, repeat_unsafe=True)
    assert isinstance(one(RetryPolicy(backoff=Constant(1, 1)), failure), Retry)


def test_should_retry_beats_retry_if() -> None:
    """The server's verdict wins over the predicate, which is not even consulted."""
    calls: list[Any] = []

    def never(subject: Any) -> bool:
        calls.append(subject)
        return False

    policy = RetryPolicy(retry_if=never, backoff=Constant(1, 1))
    failure = RetryFailure(False, "status 500", should_retry=True, subject=SUBJECT)
    assert isinstance(one(policy, failure), Retry)
    assert calls == []


@pytest.mark.parametrize(
    ("verdict", "table", "expected"),
    [
        (True, False, True),  # a 409 on GET made retryable
        (False, True, False),  # a 503 the user does not want retried
        (None, True, True),  # None: the table decides
        (None, False, False),
    ],
)
def test_retry_if_true_false_none(verdict: bool | None, table: bool, expected: bool) -> None:
    """retry_if returns True (retry), False (never) or None (the decision table decides)."""
    seen: list[Any] = []

    def predicate(subject: Any) -> bool | None:
        seen.append(subject)
        return verdict

    policy = RetryPolicy(retry_if=predicate)
    failure = RetryFailure(table, "status", subject=SUBJECT)
    assert is_retryable(policy, failure) is expected
    assert seen == [SUBJECT]


def test_retry_if_cannot_retry_an_unkeyed_post_that_may_have_been_processed() -> None:
    """retry_if=True does not make a maybe-processed unkeyed POST retryable."""
    policy = RetryPolicy(retry_if=lambda subject: True)
    failure = RetryFailure(False, "status 503", repeat_unsafe=True, subject=SUBJECT)
    assert one(policy, failure) == GiveUp(GiveUpReason.NOT_RETRYABLE)


def test_retry_if_is_not_called_without_a_subject() -> None:
    """A failure that carries no response or exception is judged by the table alone."""
    policy = RetryPolicy(retry_if=lambda subject: pytest.fail("called"))
    assert is_retryable(policy, RetryFailure(True, "status 503"))


def test_deadline_none_is_bounded_by_attempts() -> None:
    """deadline=None: no overall deadline, a long backoff is slept, attempts still end the call."""
    policy = RetryPolicy(deadline=None, attempts=3, backoff=Constant(500, 500))
    assert policy.deadline is None and policy.deadline_s == float("inf")
    rng = random.Random(1)
    state = RetryState(started_at=0.0)
    now = 0.0
    waits = []
    while isinstance(
        action := decide(policy, state, RetryFailure(True, "x"), now=now, rng=rng), Retry
    ):
        waits.append(action.wait)
        now += action.wait
        state = state.after_wait(action.wait)
    assert waits == [500.0, 500.0]
    assert action == GiveUp(GiveUpReason.ATTEMPTS_EXHAUSTED)


def test_deadline_none_honours_a_hint_up_to_max_wait() -> None:
    """Without a deadline the only bound on a server hint is max_wait."""
    policy = RetryPolicy(deadline=None, max_wait=3600)
    action = one(policy, RetryFailure(True, "status 429", hint=1800.0))
    assert isinstance(action, Retry) and action.hint_used and action.wait >= 1800.0
    assert one(policy, RetryFailure(True, "status 429", hint=3601.0)) == GiveUp(
        GiveUpReason.HINT_TOO_LONG, 3601.0
    )


def test_default_deadline_honours_a_sixty_second_hint() -> None:
    """Retry-After: 60 with the default policy is waited, not refused (deadline 120 s)."""
    action = one(RetryPolicy(), RetryFailure(True, "status 429", hint=60.0))
    assert isinstance(action, Retry) and action.hint_used and action.wait >= 60.0


def test_default_deadline_honours_a_sixty_second_hint_after_earlier_waits() -> None:
    """Even 30 s into the call, a 60 s hint still fits the default deadline."""
    state = RetryState(started_at=0.0).after_wait(10.0)
    action = decide(
        RetryPolicy(), state, RetryFailure(True, "429", hint=60.0), now=30.0, rng=random.Random(1)
    )
    assert isinstance(action, Retry) and action.hint_used


def test_reraise_is_a_policy_field() -> None:
    """reraise defaults to False and is carried by replace()."""
    assert RetryPolicy().reraise is False
    assert RetryPolicy().replace(reraise=True).reraise is True
