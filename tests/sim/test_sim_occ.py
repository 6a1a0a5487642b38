"""The occ scenario: the fast engine follows the library's backoffs and the model."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import numpy as np
import pytest

from stormguard._errors import ConfigError
from stormguard.sim import _occ


class _Uniforms(random.Random):
    """A Random whose ``random()`` replays given uniforms (``uniform`` builds on it)."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(0)
        self._values = list(values)

    def random(self) -> float:
        return self._values.pop(0)


UNIFORMS = [0.0, 1e-9, 0.123456789, 0.5, 0.987654321, 1.0 - 2.0**-53]


@pytest.mark.parametrize("strategy", _occ.STRATEGIES)
def test_vectorised_sleeps_equal_library_backoff(strategy: str) -> None:
    """Fed the same uniforms, the numpy sleeps equal the library's delay(attempt + 1)."""
    backoff = _occ.library_backoff(strategy)
    attempts, previous, uniforms, expected = [], [], [], []
    for attempt in range(1, 16):
        for u in UNIFORMS:
            for prev in (_occ.BASE, 17.25, 900.0, _occ.CAP):
                attempts.append(attempt)
                previous.append(prev)
                uniforms.append(u)
                expected.append(backoff.delay(attempt + 1, _Uniforms([u]), prev))
    got = _occ.sleep_draws(
        strategy, np.array(attempts, float), np.array(previous), np.array(uniforms)
    )
    assert got.tolist() == expected


def test_model_attempt_maps_to_library_failures() -> None:
    """The first retry (attempt 1) sleeps under base * 2 = 10, as the issue's formula says."""
    ceiling = _occ.sleep_draws("exponential", np.array([1.0, 2.0, 9.0]), np.zeros(3), np.zeros(3))
    assert ceiling.tolist() == [10.0, 20.0, _occ.CAP]


def test_single_client_writes_once() -> None:
    """A lone client never conflicts: one call, done after four messages (~40 units)."""
    calls, times = _occ.run_batch("full", 1, 2000, np.random.SeedSequence(7))
    assert set(calls.tolist()) == {1}
    assert times.mean() == pytest.approx(40.0, abs=5 * 4.0 / math.sqrt(2000))


def test_every_client_succeeds_exactly_once() -> None:
    """Calls are at least the number of clients; every run finishes with a time."""
    calls, times = _occ.run_batch("none", 30, 50, np.random.SeedSequence(1))
    assert (calls >= 30).all()
    assert np.isfinite(times).all() and (times > 0).all()


@pytest.mark.parametrize("strategy", _occ.STRATEGIES)
def test_batches_replay_as_one_sequential_server(strategy: str) -> None:
    """Replaying every decided write in time order gives the engine's own verdicts.

    The server rule: a write succeeds iff no write succeeded between its read and
    it. Rounds must also never decide a write earlier than one already decided.
    """
    trace: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    calls, _ = _occ.run_batch(strategy, 25, 8, np.random.SeedSequence(9), trace=trace)
    for run in range(8):
        rounds = [
            (r[mine], w[mine], ok[mine]) for rows, r, w, ok in trace if (mine := rows == run).any()
        ]
        for (_, before, _), (_, after, _) in itertools.pairwise(rounds):
            assert before.max() < after.min()
        reads, writes, verdicts = (np.concatenate(part) for part in zip(*rounds))
        assert len(writes) == calls[run]
        assert verdicts.sum() == 25
        last_success = -math.inf
        for index in np.argsort(writes):
            expected = bool(reads[index] > last_success)
            assert verdicts[index] == expected
            if expected:
                last_success = writes[index]


@pytest.mark.parametrize("strategy", _occ.STRATEGIES)
def test_fast_engine_matches_message_event_loop(strategy: str) -> None:
    """The batch engine and the plain heapq message loop agree on calls and time."""
    clients, runs = 20, 300
    rng = random.Random(11)
    reference = [_occ.run_events(strategy, clients, rng) for _ in range(runs)]
    calls, times = _occ.run_batch(strategy, clients, runs, np.random.SeedSequence(5))
    for ref, fast in (([r[0] for r in reference], calls), ([r[1] for r in reference], times)):
        spread = math.sqrt(statistics.variance(ref) / runs + float(np.var(fast, ddof=1)) / runs)
        assert abs(statistics.fmean(ref) - float(fast.mean())) < 5 * spread


def test_same_seed_same_rows_whatever_the_jobs() -> None:
    """Rows depend on the seed only, not on how many worker processes ran them."""
    one = _occ.sweep(["full", "none"], [10, 30], 20, seed=3, jobs=1)
    two = _occ.sweep(["full", "none"], [10, 30], 20, seed=3, jobs=2)
    other = _occ.sweep(["full", "none"], [10, 30], 20, seed=4, jobs=1)
    assert one == two
    assert one != other
    assert [(r.strategy, r.clients) for r in one] == [
        ("full", 10),
        ("full", 30),
        ("none", 10),
        ("none", 30),
    ]


def test_unknown_strategy_is_rejected() -> None:
    """A strategy outside the model is a ConfigError naming the choices."""
    with pytest.raises(ConfigError, match="decorrelated"):
        _occ.library_backoff("linear")
