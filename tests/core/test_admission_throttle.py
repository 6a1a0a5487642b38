"""Admission control (Envoy) and client-side adaptive throttling (SRE): formulas and
the fractions they refuse, under virtual time and a seeded RNG."""

from __future__ import annotations

import math
import random

import pytest

from stormguard._errors import ConfigError
from stormguard.core._admission_control import (
    AdmissionControlCore,
    admission_reject_probability,
)
from stormguard.core._throttle import AdaptiveThrottleCore, throttle_probability

DRAWS = 20_000


@pytest.mark.parametrize(
    ("n", "s", "rate", "aggression", "expected"),
    [
        (100, 100, 0.95, 1.0, 0.0),
        (100, 95, 0.95, 1.0, 0.0),
        (100, 50, 0.95, 1.0, (100 - 50 / 0.95) / 101),
        (100, 0, 0.95, 1.0, 0.8),  # capped
        (100, 80, 0.95, 2.0, ((100 - 80 / 0.95) / 101) ** 0.5),
        (100, 50, 0.5, 1.0, 0.0),
    ],
)
def test_admission_formula(n: int, s: int, rate: float, aggression: float, expected: float) -> None:
    """P = min(max_reject, max(0, (n - s/K) / (n + 1)) ** (1/aggression))."""
    probability = admission_reject_probability(
        n, s, success_rate=rate, aggression=aggression, max_reject=0.8
    )
    assert probability == pytest.approx(expected)


def _fill(core: AdmissionControlCore, now: float, requests: int, successes: int) -> None:
    for i in range(requests):
        core.record(now, i < successes)


def test_admission_refuses_the_expected_fraction(rng: random.Random) -> None:
    """Half the requests failing: the refused share matches P within sampling noise."""
    core = AdmissionControlCore(window=10.0, min_rps=0)
    _fill(core, 100.0, 200, 100)
    expected = (200 - 100 / 0.95) / 201
    refused = sum(not core.admits(100.0, rng) for _ in range(DRAWS))
    assert core.reject_probability(100.0) == pytest.approx(expected)
    assert refused / DRAWS == pytest.approx(expected, abs=4 * math.sqrt(0.25 / DRAWS))


def test_admission_is_off_below_the_minimum_rate(rng: random.Random) -> None:
    """Fewer than min_rps * window requests in the window: nothing is refused."""
    core = AdmissionControlCore(window=10.0, min_rps=5.0)
    _fill(core, 0.0, 49, 0)
    assert core.reject_probability(0.0) == 0.0
    assert all(core.admits(0.0, rng) for _ in range(100))
    core.record(0.0, False)
    assert core.reject_probability(0.0) == 0.8


def test_admission_forgets_with_the_window() -> None:
    """Failures older than the window no longer count."""
    core = AdmissionControlCore(window=10.0, min_rps=0, buckets=10)
    _fill(core, 0.0, 100, 0)
    assert core.reject_probability(5.0) == 0.8
    assert core.reject_probability(10.5) == 0.0
    assert core.counts(10.5) == (0, 0)


def test_admission_draws_nothing_while_healthy() -> None:
    """P = 0 takes no draw from the RNG (healthy traffic costs no randomness)."""

    class NoDraws(random.Random):
        def random(self) -> float:
            raise AssertionError("drew")

    core = AdmissionControlCore(min_rps=0)
    _fill(core, 0.0, 50, 50)
    assert core.admits(0.0, NoDraws())


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"window": 0}, "window"),
        ({"success_rate": 0}, "success_rate"),
        ({"success_rate": 1.5}, "success_rate"),
        ({"aggression": 0.5}, "aggression"),
        ({"max_reject": -0.1}, "max_reject"),
        ({"min_rps": -1}, "min_rps"),
        ({"buckets": 0}, "buckets"),
    ],
)
def test_admission_validation(kwargs: dict[str, float], field: str) -> None:
    """Invalid settings fail at construction naming the field."""
    with pytest.raises(ConfigError) as raised:
        AdmissionControlCore(**kwargs)  # type: ignore[arg-type]
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("requests", "accepts", "expected"),
    [(100, 100, 0.0), (100, 50, 0.0), (100, 40, 20 / 101), (100, 0, 100 / 101), (0, 0, 0.0)],
)
def test_throttle_formula(requests: int, accepts: int, expected: float) -> None:
    """p = max(0, (requests - K * accepts) / (requests + 1)) with K = 2."""
    assert throttle_probability(requests, accepts, k=2.0) == pytest.approx(expected)


def test_throttle_sends_about_k_times_what_is_accepted(rng: random.Random) -> None:
    """Demand 1000/s against a backend that accepts 100/s: once the window is full the
    client sends about K * 100 = 200/s and refuses the rest locally."""
    core = AdaptiveThrottleCore(k=2.0, window=10.0, buckets=10)
    sent_per_second: list[int] = []
    for second in range(30):
        sent = accepted = 0
        for i in range(1000):
            now = second + i / 1000
            if core.request(now, rng):
                sent += 1
                if accepted < 100:
                    accepted += 1
                    core.accept(now)
        sent_per_second.append(sent)
    steady = sent_per_second[15:]
    assert sum(steady) / len(steady) == pytest.approx(200, rel=0.1)
    assert core.counts(29.999)[0] == 10_000  # the refused ones count as requests


def test_throttle_stays_open_while_everything_is_accepted(rng: random.Random) -> None:
    """A healthy backend: p = 0 and every attempt is sent."""
    core = AdaptiveThrottleCore()
    for i in range(1000):
        assert core.request(float(i), rng)
        core.accept(float(i))
    assert core.probability(1000.0) == 0.0


def test_throttle_recovers_as_the_window_slides(rng: random.Random) -> None:
    """After an outage the refusals age out of the window and p returns to 0."""
    core = AdaptiveThrottleCore(window=10.0, buckets=10)
    for _ in range(100):
        core.request(0.0, rng)
    assert core.probability(0.0) == pytest.approx(100 / 101)
    assert core.probability(11.0) == 0.0


def test_throttle_retract_and_cap(rng: random.Random) -> None:
    """retract() takes back an accept (never below 0); max_reject caps p."""
    core = AdaptiveThrottleCore(max_reject=0.5)
    for _ in range(10):
        core.request(0.0, rng)
    core.accept(0.0)
    core.retract(0.0)
    core.retract(0.0)
    assert core.counts(0.0) == (10, 0)
    assert core.probability(0.0) == 0.5


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"k": 0.5}, "k"), ({"window": -1}, "window"), ({"max_reject": 2}, "max_reject")],
)
def test_throttle_validation(kwargs: dict[str, float], field: str) -> None:
    """Invalid settings fail at construction naming the field."""
    with pytest.raises(ConfigError) as raised:
        AdaptiveThrottleCore(**kwargs)
    assert raised.value.field == field
