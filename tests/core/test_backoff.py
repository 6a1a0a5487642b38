"""Backoff schedules: bounds, formulas and validation."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stormguard import (
    ConfigError,
    Constant,
    DecorrelatedJitter,
    EqualJitter,
    Exponential,
    FullJitter,
    NoBackoff,
)

bases = st.floats(min_value=0.001, max_value=10.0, allow_nan=False)
growth = st.floats(min_value=1.0, max_value=1000.0, allow_nan=False)
failures = st.integers(min_value=1, max_value=2000)
seeds = st.integers(min_value=0, max_value=2**32)


def ceiling(base: float, cap: float, n: int) -> float:
    """Reference formula, computed the slow way with exact integers."""
    return min(cap, base * 2.0 ** min(n - 1, 1000))


@given(bases, growth, failures, seeds)
def test_full_jitter_lies_under_the_ceiling(base: float, factor: float, n: int, seed: int) -> None:
    """Full jitter draws lie in [0, min(cap, base * 2**(n-1))]."""
    cap = base * factor
    draw = FullJitter(base, cap).delay(n, random.Random(seed))
    assert 0.0 <= draw <= ceiling(base, cap, n)


@given(bases, growth, failures, seeds)
def test_equal_jitter_lies_in_the_upper_half(base: float, factor: float, n: int, seed: int) -> None:
    """Equal jitter draws lie in [ceiling/2, ceiling]."""
    cap = base * factor
    draw = EqualJitter(base, cap).delay(n, random.Random(seed))
    top = ceiling(base, cap, n)
    assert top / 2 <= draw <= top


@given(bases, growth, failures, seeds, st.floats(min_value=0.0, max_value=1e4))
def test_decorrelated_lies_between_base_and_three_times_previous(
    base: float, factor: float, n: int, seed: int, previous: float
) -> None:
    """Decorrelated draws lie in [base, min(cap, 3 * previous)] (previous at least base)."""
    cap = base * factor
    draw = DecorrelatedJitter(base, cap).delay(n, random.Random(seed), previous)
    assert base <= draw <= min(cap, 3 * max(previous, base)) + 1e-9


@given(bases, growth, failures)
def test_exponential_is_the_ceiling(base: float, factor: float, n: int) -> None:
    """Exponential without jitter returns exactly min(cap, base * 2**(n-1))."""
    cap = base * factor
    assert Exponential(base, cap).delay(n, random.Random(0)) == pytest.approx(ceiling(base, cap, n))


def test_exponential_schedule_doubles_then_caps() -> None:
    """The schedule for base 1, cap 10 is 1, 2, 4, 8, 10, 10."""
    backoff = Exponential(1, 10)
    assert [backoff.delay(n, random.Random(0)) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_decorrelated_starts_from_base() -> None:
    """Without a previous wait the first draw lies in [base, 3 * base]."""
    rng = random.Random(7)
    draws = [DecorrelatedJitter(1, 100).delay(1, rng) for _ in range(1000)]
    assert min(draws) >= 1 and max(draws) <= 3
    assert max(draws) > 2.5  # it really draws, not a constant


def test_constant_and_none() -> None:
    """Constant waits base every time; NoBackoff never waits."""
    assert Constant(2, 2).delay(9, random.Random(0)) == 2
    assert NoBackoff().delay(3, random.Random(0)) == 0


def test_full_jitter_spreads_draws() -> None:
    """Full-jitter draws for one failure count spread over the whole interval."""
    rng = random.Random(3)
    draws = sorted(FullJitter(1, 100).delay(5, rng) for _ in range(2000))
    assert draws[0] < 0.5 and draws[-1] > 15.5
    assert 7 < draws[1000] < 9  # median of uniform(0, 16)


def test_timedelta_durations_are_normalised() -> None:
    """Durations may be timedeltas; they become float seconds once."""
    backoff = FullJitter(timedelta(milliseconds=500), timedelta(seconds=30))
    assert (backoff.base, backoff.cap) == (0.5, 30.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"base": -1, "cap": 1}, "base"),
        ({"base": 2, "cap": 1}, "cap"),
        ({"base": float("nan"), "cap": 1}, "base"),
        ({"base": 1, "cap": float("inf")}, "cap"),
        ({"base": "1", "cap": 2}, "base"),
    ],
)
@pytest.mark.parametrize(
    "cls", [Constant, Exponential, FullJitter, EqualJitter, DecorrelatedJitter]
)
def test_invalid_values_fail_at_construction(
    cls: type, kwargs: dict[str, object], field: str
) -> None:
    """Bad base/cap values raise ConfigError naming the field."""
    with pytest.raises(ConfigError) as info:
        cls(**kwargs)
    assert info.value.field == field
    assert field in str(info.value)


def test_failure_count_must_be_positive() -> None:
    """A failure count below 1 is a programming error."""
    with pytest.raises(ValueError, match="failures"):
        FullJitter().delay(0, random.Random(0))
