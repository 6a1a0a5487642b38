"""The retry policy state machine: validation and decide()."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from stormguard import ConfigError, Constant, Exponential, FullJitter, RetryPolicy
from stormguard.core import GiveUp, GiveUpReason, Retry, RetryFailure, RetryState, decide

FAIL = RetryFailure(True, "status 503")


def test_defaults_are_safe() -> None:
    """The default policy retries a bounded number of times with jitter, under a deadline."""
    policy = RetryPolicy()
    assert policy.attempts == 4
    assert isinstance(policy.backoff, FullJitter)
    assert (policy.backoff.base, policy.backoff.cap) == (0.5, 30.0)
    assert policy.deadline == 120.0 and policy.max_wait == 60.0
    assert policy.retry_if is None and policy.reraise is False
    assert policy.retry_statuses == frozenset({408, 425, 429, 502, 503, 504})


@pytest.mark.parametrize(
    ("kwargs", "field", "text"),
    [
        ({"attempts": 0}, "attempts", ">= 1"),
        ({"attempts": 2.5}, "attempts", "integer"),
        ({"attempts": True}, "attempts", "integer"),
        ({"deadline": 0}, "deadline", "> 0"),
        ({"deadline": -3}, "deadline", "> 0"),
        ({"max_wait": -1}, "max_wait", ">= 0"),
        ({"max_wait": float("nan")}, "max_wait", "finite"),
        ({"retry_statuses": {503, 200}}, "retry_statuses", "400-599"),
        ({"retry_statuses": {999}}, "retry_statuses", "400-599"),
        ({"retry_exceptions": (ValueError, "x")}, "retry_exceptions", "exception class"),
        ({"backoff": 3}, "backoff", "delay"),
        ({"budget": object()}, "budget", "try_retry"),
        ({"breaker": object()}, "breaker", "acquire"),
        ({"retry_if": 3}, "retry_if", "callable"),
        ({"reraise": "yes"}, "reraise", "True or False"),
        ({"deadline": float("inf")}, "deadline", "finite"),
    ],
)
def test_invalid_policy_fails_naming_the_field(
    kwargs: dict[str, object], field: str, text: str
) -> None:
    """Each invalid value raises ConfigError whose message names field and range."""
    with pytest.raises(ConfigError) as info:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert str(info.value).startswith(field) and text in str(info.value)


def test_policy_is_frozen_and_replace_validates() -> None:
    """Change means replace(), and replace() validates again."""
    policy = RetryPolicy()
    with pytest.raises(AttributeError):
        policy.attempts = 9  # type: ignore[misc]
    assert policy.replace(attempts=2).attempts == 2
    with pytest.raises(ConfigError):
        policy.replace(attempts=0)


def test_timedelta_deadline() -> None:
    """Deadlines may be given as timedelta."""
    assert RetryPolicy(deadline=timedelta(minutes=2)).deadline == 120.0


def run(
    policy: RetryPolicy, failures: list[RetryFailure], *, seed: int = 1
) -> list[Retry | GiveUp]:
    """Drive decide() over consecutive failures with a virtual clock that advances by each wait."""
    rng = random.Random(seed)
    now = 0.0
    state = RetryState(started_at=now)
    actions: list[Retry | GiveUp] = []
    for failure in failures:
        action = decide(policy, state, failure, now=now, rng=rng)
        actions.append(action)
        if isinstance(action, GiveUp):
            break
        now += action.wait
        state = state.after_wait(action.wait)
    return actions


def test_attempts_bound_the_retries() -> None:
    """attempts=4 gives three Retry decisions, then attempts exhausted."""
    actions = run(RetryPolicy(attempts=4, backoff=Constant(1, 1)), [FAIL] * 10)
    assert [type(a) for a in actions] == [Retry, Retry, Retry, GiveUp]
    assert actions[-1] == GiveUp(GiveUpReason.ATTEMPTS_EXHAUSTED)


def test_single_attempt_never_retries() -> None:
    """attempts=1 means no retry at all."""
    assert run(RetryPolicy(attempts=1), [FAIL]) == [GiveUp(GiveUpReason.ATTEMPTS_EXHAUSTED)]


def test_not_retryable_gives_up_at_once() -> None:
    """A failure the table forbids to retry ends the call with that reason."""
    actions = run(RetryPolicy(), [RetryFailure(False, "status 400")])
    assert actions == [GiveUp(GiveUpReason.NOT_RETRYABLE)]


def test_waits_follow_the_backoff_draws() -> None:
    """Without hints the waits are the backoff's draws for failures 1, 2, 3."""
    backoff = FullJitter(1, 100)
    actions = run(RetryPolicy(attempts=4, backoff=backoff), [FAIL] * 4, seed=5)
    rng = random.Random(5)
    expected = [backoff.delay(n, rng) for n in (1, 2, 3)]
    assert [a.wait for a in actions if isinstance(a, Retry)] == expected


def test_server_hint_wins_over_backoff() -> None:
    """A hint replaces the backoff draw (plus at most 10 % jitter) and is marked as used."""
    actions = run(RetryPolicy(backoff=Constant(9, 9)), [RetryFailure(True, "429", hint=2.5)])
    assert len(actions) == 1 and isinstance(actions[0], Retry) and actions[0].hint_used
    assert 2.5 <= actions[0].wait <= 2.75


def test_hint_longer_than_max_wait_is_not_slept() -> None:
    """A hint over max_wait ends the call now, carrying the hint."""
    actions = run(RetryPolicy(max_wait=10), [RetryFailure(True, "429", hint=86400)])
    assert actions == [GiveUp(GiveUpReason.HINT_TOO_LONG, 86400)]


def test_hint_past_the_deadline_is_not_slept() -> None:
    """A hint that would end after the deadline ends the call now."""
    actions = run(RetryPolicy(deadline=5, max_wait=60), [RetryFailure(True, "503", hint=6)])
    assert actions == [GiveUp(GiveUpReason.HINT_TOO_LONG, 6)]


def test_backoff_never_sleeps_past_the_deadline() -> None:
    """Exponential waits 1, 2, 4 fit a 10 s deadline; the next (8) would not."""
    actions = run(RetryPolicy(attempts=10, deadline=10, backoff=Exponential(1, 100)), [FAIL] * 10)
    assert [a.wait for a in actions if isinstance(a, Retry)] == [1, 2, 4]
    assert actions[-1] == GiveUp(GiveUpReason.DEADLINE)


def test_total_wait_never_exceeds_deadline_for_any_seed() -> None:
    """Across many seeds the waits of one call add up to less than the deadline."""
    policy = RetryPolicy(attempts=50, deadline=20, backoff=FullJitter(1, 30))
    for seed in range(200):
        actions = run(policy, [FAIL] * 50, seed=seed)
        assert sum(a.wait for a in actions if isinstance(a, Retry)) < 20


def test_state_tracks_attempts_and_previous_wait() -> None:
    """after_wait counts the attempt and remembers the wait for decorrelated jitter."""
    state = RetryState(started_at=3.0).after_wait(1.5).after_wait(2.0)
    assert (state.attempts, state.previous_wait, state.started_at) == (3, 2.0, 3.0)


def test_a_throttling_failure_draws_from_the_throttle_backoff(rng: random.Random) -> None:
    """throttle_backoff set: a throttled failure waits its draw, any other the backoff's."""
    policy = RetryPolicy(backoff=Constant(0.05, 0.05), throttle_backoff=Constant(1, 1))
    state = RetryState(started_at=0.0)
    throttled = decide(policy, state, RetryFailure(True, "429", throttled=True), now=0.0, rng=rng)
    transient = decide(policy, state, RetryFailure(True, "503"), now=0.0, rng=rng)
    assert throttled == Retry(1.0) and transient == Retry(0.05)


def test_a_throttle_backoff_must_be_a_backoff() -> None:
    """throttle_backoff without a delay() method fails at construction, naming the field."""
    with pytest.raises(ConfigError, match="throttle_backoff"):
        RetryPolicy(throttle_backoff=5)  # type: ignore[arg-type]
