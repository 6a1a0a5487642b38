# Backoff schedules. Each is a frozen value with (base, cap) in seconds and one pure
# method, `delay(failures, rng, previous)`, that draws the wait after the n-th
# consecutive failure (n = 1, 2, ...). Nothing here reads the clock or sleeps.
#
# For the exponential family the ceiling after the n-th failure is
#     ceiling(n) = min(cap, base * 2**(n - 1))
# and the schedules differ only in how they draw under it (AWS Architecture Blog,
# "Exponential Backoff And Jitter", 2015):
#     Exponential   ceiling(n)                        (no jitter: clients synchronise)
#     FullJitter    uniform(0, ceiling(n))            (the default: spreads best)
#     EqualJitter   ceiling(n)/2 + uniform(0, ceiling(n)/2)
#     Decorrelated  min(cap, uniform(base, 3 * previous)), previous starting at base
# `2**(n-1)` is computed without overflow for any n: once base * 2**(n-1) passes cap
# the ceiling is cap.
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from .._errors import ConfigError

__all__ = [
    "Backoff",
    "Constant",
    "DecorrelatedJitter",
    "EqualJitter",
    "Exponential",
    "FullJitter",
    "NoBackoff",
    "seconds",
]


def seconds(value: float | timedelta, field: str, *, allow_zero: bool = True) -> float:
    """Normalise a duration to float seconds, rejecting negatives, NaN and infinity."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(field, f"must be a number of seconds or a timedelta, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(field, f"must be finite, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(field, f"must be {bound} seconds, got {value!r}")
    return value


class Backoff(Protocol):
    """A backoff schedule: the wait after the n-th consecutive failure."""

    def delay(self, failures: int, rng: random.Random, previous: float | None = None) -> float:
        """Seconds to wait after failure number ``failures`` (1-based).

        ``previous`` is the wait drawn after the failure before (``None`` at first);
        only :class:`DecorrelatedJitter` uses it.
        """
        ...


def _ceiling(base: float, cap: float, failures: int) -> float:
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    if base == 0:
        return 0.0
    # base * 2**(n-1) > cap  <=>  n - 1 > log2(cap / base): avoid huge powers.
    exponent = failures - 1
    if exponent >= 1024 or exponent > math.log2(cap / base) + 1:
        return cap
    return min(cap, base * 2.0**exponent)


@dataclass(frozen=True, slots=True)
class _BaseCap:
    base: float = 0.5
    cap: float = 30.0

    def __post_init__(self) -> None:
        base = seconds(self.base, "base")
        cap = seconds(self.cap, "cap")
        if cap < base:
            raise ConfigError("cap", f"must be >= base ({base}), got {cap}")
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "cap", cap)

    def ceiling(self, failures: int) -> float:
        """``min(cap, base * 2**(failures - 1))``: the largest wait after that failure."""
        return _ceiling(self.base, self.cap, failures)


@dataclass(frozen=True, slots=True)
class NoBackoff:
    """Retry at once. Only for tests and for failures that prove nothing was sent."""

    base: float = 0.0
    cap: float = 0.0

    def delay(self, failures: int, rng: random.Random, previous: float | None = None) -> float:
        """Always ``0.0``."""
        return 0.0


@dataclass(frozen=True, slots=True)
class Constant(_BaseCap):
    """The same wait, ``base`` seconds, after every failure (``cap`` bounds nothing)."""

    def delay(self, failures: int, rng: random.Random, previous: float | None = None) -> float:
        """Always ``base``."""
        return self.base


@dataclass(frozen=True, slots=True)
class Exponential(_BaseCap):
    """``min(cap, base * 2**(n-1))`` without jitter: clients that fail together retry together."""

    def delay(self, failures: int, rng: random.Random, previous: float | None = None) -> float:
        """The ceiling itself."""
        return self.ceiling(failures)


@dataclass(frozen=True, slots=True)
class FullJitter(_BaseCap):
    """``uniform(0, min(cap, base * 2**(n-1)))`` — the default: the least contention."""

    def delay(self, failures: int, rng: random.Random, previous: float | None = None) -> float:
        """A uniform draw under the ceiling."""
        return rng.uniform(0.0, self.ceiling(failures))


@dataclass(frozen=True, slots=True)
class EqualJitter(_BaseCap):
    """``c/2 + uniform(0, c/2)`` with ``c = min(cap, base * 2**(n-1))``: never less than half."""

    def delay(self, failures: int, rng: random.Random, previous: float | None = None) -> float:
        """A uniform draw in the upper half of the ceiling."""
        half = self.ceiling(failures) / 2.0
        return half + rng.uniform(0.0, half)


@dataclass(frozen=True, slots=True)
class DecorrelatedJitter(_BaseCap):
    """``min(cap, uniform(base, 3 * previous))`` with ``previous`` starting at ``base``."""

    def delay(self, failures: int, rng: random.Random, previous: float | None = None) -> float:
        """A draw between base and three times the previous wait, capped."""
        if failures < 1:
            raise ValueError(f"failures must be >= 1, got {failures}")
        last = self.base if previous is None else max(previous, self.base)
        return min(self.cap, rng.uniform(self.base, 3.0 * last))
