"""Seeding, progress and the retrying callers of the simulator."""

from __future__ import annotations

import random

import pytest

from stormguard.core._backoff import Constant
from stormguard.core._budget import RetryBudgetCore
from stormguard.core._policy import RetryFailure, RetryPolicy
from stormguard.sim import _engine


def test_py_rng_is_stable_per_seed_and_keys() -> None:
    """The same seed and keys give the same stream; other keys give another one."""
    a = [_engine.py_rng(1, "storm", "full").random() for _ in range(2)]
    b = _engine.py_rng(1, "storm", "immediate").random()
    assert a[0] == a[1]
    assert a[0] != b
    assert _engine.seed_words(1, "x") == _engine.seed_words(1, "x")


def test_progress_bar_ticks_to_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    """An enabled progress bar draws with rich on stderr and accepts fractional ticks."""
    with _engine.progress("occ", 1.0, enabled=True) as tick:
        tick(0.25)
        tick(0.75)
    assert "occ" in capsys.readouterr().err


def test_progress_is_silent_when_disabled(capsys: pytest.CaptureFixture[str]) -> None:
    """A disabled progress bar prints nothing."""
    with _engine.progress("occ", 3, enabled=False) as tick:
        tick()
    assert capsys.readouterr() == ("", "")


def _callers(rate: float = 50.0, **kwargs: object) -> _engine.Callers:
    """Callers on a seeded stream for 2 seconds, retrying with Constant(0.05) backoff."""
    policy = RetryPolicy(attempts=3, backoff=Constant(0.05))
    failure = RetryFailure(retryable=True, reason="503")
    return _engine.Callers(rate, 2.0, random.Random(5), policy=policy, failure=failure, **kwargs)  # type: ignore[arg-type]


def test_callers_merge_retries_into_the_stream_in_time_order() -> None:
    """Attempts come in time order; a failing call gets `attempts` attempts, then gives up."""
    callers = _callers()
    per_call: dict[float, int] = {}
    times, gave_up = [], 0
    for now, state in callers:
        times.append(now)
        per_call[state.started_at] = state.attempts
        gave_up += not callers.retry(state, now + 0.01)
    assert times == sorted(times)
    assert len(per_call) == callers.calls > 50
    early = [attempts for started, attempts in per_call.items() if started < 1.5]
    assert set(early) == {3}  # the stream stops at `duration`: later retries are cut
    assert gave_up >= len(early)  # each of those gave up once, after its third attempt


def test_callers_budget_records_calls_and_can_refuse_retries() -> None:
    """Each new call is recorded in the budget; a refused retry ends the call."""
    budget = RetryBudgetCore(ratio=0.0, min_per_second=0.0, window=10.0)
    callers = _callers(budget=budget)
    attempts = [(now, callers.retry(state, now)) for now, state in callers]
    assert len(attempts) == callers.calls > 0  # no retry ever sent
    assert not any(scheduled for _, scheduled in attempts)
