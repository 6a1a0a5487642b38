"""Property tests: each algorithm against a slow, obviously-correct model in exact fractions.

Arrival times lie on a 1/8 s grid and rates/windows are dyadic, so the float
implementation and the Fraction model see exactly the same instants.
"""

from __future__ import annotations

import math
from fractions import Fraction as F

from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import (
    GCRA,
    Concurrency,
    FixedWindow,
    SlidingWindowCounter,
    SlidingWindowLog,
    TokenBucket,
)
from stormguard.core._limiters import Algorithm

START = F(1000)
steps = st.lists(
    st.tuples(st.integers(0, 24), st.integers(0, 4)),  # (gap in 1/8 s, cost)
    min_size=1,
    max_size=60,
)
rates = st.sampled_from([F(1, 2), F(1), F(2), F(4)])
windows = st.sampled_from([F(1, 2), F(1), F(2), F(4)])
quotas = st.integers(1, 8)


class BucketModel:
    """Tokens accrue at `rate` per second up to `burst`; a hit takes `cost` if present."""

    def __init__(self, rate: F, burst: int) -> None:
        self.rate, self.burst = rate, F(burst)
        self.tokens, self.last = self.burst, START

    def hit(self, now: F, cost: int) -> tuple[bool, F, F]:
        tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        if cost > self.burst:
            return False, tokens, F(-1)
        if cost > tokens:
            return False, tokens, (cost - tokens) / self.rate
        self.tokens, self.last = tokens - cost, now
        return True, tokens - cost, F(0)


class LogModel:
    """Every admitted hit is remembered; those younger than `window` count."""

    def __init__(self, limit: int, window: F) -> None:
        self.limit, self.window = limit, window
        self.admitted: list[tuple[F, int]] = []

    def used(self, now: F) -> int:
        return sum(c for t, c in self.admitted if now < t + self.window)

    def hit(self, now: F, cost: int) -> tuple[bool, F, F]:
        used = self.used(now)
        if cost > self.limit:
            return False, F(self.limit - used), F(-1)
        if used + cost > self.limit:
            # The first expiry instant at which the hit would fit.
            wait = min(
                t + self.window - now
                for t, _ in self.admitted
                if now < t + self.window and self.used(t + self.window) + cost <= self.limit
            )
            return False, F(self.limit - used), wait
        self.admitted.append((now, cost))
        return True, F(self.limit - used - cost), F(0)


class FixedModel:
    """Hits counted per window [k*window, (k+1)*window)."""

    def __init__(self, limit: int, window: F) -> None:
        self.limit, self.window = limit, window
        self.admitted: list[tuple[F, int]] = []

    def in_window(self, k: int) -> int:
        return sum(c for t, c in self.admitted if math.floor(t / self.window) == k)

    def hit(self, now: F, cost: int) -> tuple[bool, F, F]:
        k = math.floor(now / self.window)
        used = self.in_window(k)
        if cost > self.limit:
            return False, F(self.limit - used), F(-1)
        if used + cost > self.limit:
            return False, F(self.limit - used), (k + 1) * self.window - now
        self.admitted.append((now, cost))
        return True, F(self.limit - used - cost), F(0)


class CounterModel(FixedModel):
    """previous * (1 - elapsed/window) + current, from the full admission record."""

    def used(self, now: F) -> F:
        k = math.floor(now / self.window)
        elapsed = now - k * self.window
        return self.in_window(k - 1) * (1 - elapsed / self.window) + self.in_window(k)

    def hit(self, now: F, cost: int) -> tuple[bool, F, F]:
        used = self.used(now)
        if cost > self.limit:
            return False, self.limit - used, F(-1)
        if used + cost > self.limit:
            return False, self.limit - used, F(-2)  # retry_after checked by simulation
        self.admitted.append((now, cost))
        return True, self.limit - used - cost, F(0)


class ConcurrencyModel:
    """Slots held for `lease` seconds (no releases in this model)."""

    def __init__(self, limit: int, lease: F) -> None:
        self.limit, self.lease = limit, lease
        self.held: list[tuple[F, int]] = []

    def hit(self, now: F, cost: int) -> tuple[bool, F, F]:
        alive = [(e, c) for e, c in self.held if e > now]
        used = sum(c for _, c in alive)
        if cost > self.limit:
            return False, F(self.limit - used), F(-1)
        if used + cost > self.limit:
            freed, wait = 0, F(0)
            for expiry, c in sorted(alive):
                freed += c
                if used - freed + cost <= self.limit:
                    wait = expiry - now
                    break
            return False, F(self.limit - used), wait
        self.held.append((now + self.lease, cost))
        return True, F(self.limit - used - cost), F(0)


def check(algorithm: Algorithm, model: object, schedule: list[tuple[int, int]]) -> None:
    state, now = None, START
    for i, (gap, cost) in enumerate(schedule):
        now += F(gap, 8)
        state, decision = algorithm.step(state, float(now), float(cost), f"lease{i}")
        allowed, remaining, retry = model.hit(now, cost)  # type: ignore[attr-defined]
        assert decision.allowed == allowed, (i, now, cost)
        assert math.isclose(decision.remaining, max(0, remaining), abs_tol=1e-6)
        if retry == -1:
            assert decision.retry_after == math.inf
        elif retry >= 0:
            assert math.isclose(decision.retry_after, retry, abs_tol=1e-6)


@given(rates, quotas, steps)
def test_token_bucket_matches_model(rate: F, burst: int, schedule: list[tuple[int, int]]) -> None:
    """TokenBucket admits, counts and waits exactly like the token model."""
    check(TokenBucket(float(rate), burst), BucketModel(rate, burst), schedule)


@given(rates, quotas, steps)
def test_gcra_matches_token_model(rate: F, burst: int, schedule: list[tuple[int, int]]) -> None:
    """GCRA is the token bucket in disguise: same admissions, remaining and waits."""
    check(GCRA(float(rate), burst), BucketModel(rate, burst), schedule)


@given(quotas, windows, steps)
def test_sliding_log_matches_model(limit: int, window: F, schedule: list[tuple[int, int]]) -> None:
    """SlidingWindowLog matches the remember-everything model."""
    check(SlidingWindowLog(limit, float(window)), LogModel(limit, window), schedule)


@given(quotas, windows, steps)
def test_fixed_window_matches_model(limit: int, window: F, schedule: list[tuple[int, int]]) -> None:
    """FixedWindow matches per-window counting."""
    check(FixedWindow(limit, float(window)), FixedModel(limit, window), schedule)


@given(quotas, windows, steps)
def test_sliding_counter_matches_model(
    limit: int, window: F, schedule: list[tuple[int, int]]
) -> None:
    """SlidingWindowCounter matches the weighted two-window formula."""
    check(SlidingWindowCounter(limit, float(window)), CounterModel(limit, window), schedule)


@given(quotas, windows, steps)
def test_concurrency_matches_model(limit: int, lease: F, schedule: list[tuple[int, int]]) -> None:
    """Concurrency matches the held-slots model."""
    check(Concurrency(limit, float(lease)), ConcurrencyModel(limit, lease), schedule)


@settings(max_examples=60)
@given(quotas, windows, steps)
def test_sliding_counter_never_exceeds_limit_per_fixed_window(
    limit: int, window: F, schedule: list[tuple[int, int]]
) -> None:
    """The counter approximation never admits more than `limit` in one fixed window."""
    algorithm, state, now = SlidingWindowCounter(limit, float(window)), None, START
    per_window: dict[int, int] = {}
    for gap, cost in schedule:
        now += F(gap, 8)
        state, decision = algorithm.step(state, float(now), float(cost))
        if decision.allowed:
            k = math.floor(now / window)
            per_window[k] = per_window.get(k, 0) + cost
    assert all(v <= limit for v in per_window.values())
