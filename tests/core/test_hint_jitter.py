"""Server hints get a little jitter; a hint of zero falls back to the jittered backoff."""

from __future__ import annotations

import random

import pytest

from stormguard import Constant, FullJitter, RetryPolicy
from stormguard.core import GiveUp, GiveUpReason, Retry, RetryFailure, RetryState, decide


def first_wait(policy: RetryPolicy, hint: float | None, seed: int) -> Retry | GiveUp:
    """The decision after the first failure of a call, with a seeded RNG."""
    failure = RetryFailure(True, "status 429", hint=hint)
    return decide(policy, RetryState(started_at=0.0), failure, now=0.0, rng=random.Random(seed))


def test_hundred_clients_with_the_same_hint_spread_out() -> None:
    """100 clients told "come back in 30 s" at the same instant spread over about a second."""
    waits = []
    for seed in range(100):
        action = first_wait(RetryPolicy(), 30.0, seed)
        assert isinstance(action, Retry) and action.hint_used
        waits.append(action.wait)
    assert min(waits) >= 30.0 and max(waits) <= 31.0
    assert max(waits) - min(waits) > 0.5  # a measurable interval, not one millisecond
    assert len({round(wait, 3) for wait in waits}) > 90  # nearly every client its own ms


@pytest.mark.parametrize(
    ("hint", "spread"), [(0.5, 0.05), (2.0, 0.2), (10.0, 1.0), (60.0, 1.0), (3000.0, 1.0)]
)
def test_hint_jitter_is_at_most_ten_percent_and_one_second(hint: float, spread: float) -> None:
    """The jitter on a positive hint is uniform(0, min(1 s, 10 % of the hint))."""
    policy = RetryPolicy(max_wait=3600, deadline=None)
    waits = [first_wait(policy, hint, seed) for seed in range(200)]
    extras = [action.wait - hint for action in waits if isinstance(action, Retry)]
    assert len(extras) == 200
    assert all(0.0 <= extra <= spread for extra in extras)
    assert max(extras) > spread * 0.8  # the whole range is used


def test_sixty_second_hint_is_honoured_with_max_wait_sixty() -> None:
    """The jitter is added after the max_wait comparison: Retry-After: 60 is waited."""
    action = first_wait(RetryPolicy(max_wait=60), 60.0, 3)
    assert isinstance(action, Retry) and action.hint_used and 60.0 <= action.wait <= 61.0


def test_hint_just_over_max_wait_still_fails_fast() -> None:
    """A hint longer than max_wait is refused before any jitter is drawn."""
    assert first_wait(RetryPolicy(max_wait=60), 60.001, 3) == GiveUp(
        GiveUpReason.HINT_TOO_LONG, 60.001
    )


def test_retry_after_zero_uses_the_backoff_draw() -> None:
    """Retry-After: 0 (or a past date) asks for no wait: the jittered backoff draw is used."""
    policy = RetryPolicy(backoff=FullJitter(1, 1))
    waits = []
    for seed in range(100):
        action = first_wait(policy, 0.0, seed)
        assert isinstance(action, Retry) and not action.hint_used
        waits.append(action.wait)
    assert waits == [FullJitter(1, 1).delay(1, random.Random(seed)) for seed in range(100)]
    assert max(waits) - min(waits) > 0.5  # no lockstep at 0.0


def test_jitter_never_pushes_a_hint_past_the_deadline() -> None:
    """A hint that fits the time left is slept; its jitter shrinks to fit, never over."""
    policy = RetryPolicy(deadline=10.05, backoff=Constant(1, 1))
    for seed in range(50):
        action = first_wait(policy, 10.0, seed)
        assert isinstance(action, Retry) and 10.0 <= action.wait < 10.05
