"""The pure algorithms: validation, refill, windows, exact retry_after, clock steps."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest

from stormguard import (
    GCRA,
    Concurrency,
    ConfigError,
    FixedWindow,
    SlidingWindowCounter,
    SlidingWindowLog,
    TokenBucket,
)
from stormguard.core._limiters import Algorithm, LimitRequest, decide_group, default_name


class Run:
    """Feeds hits to one algorithm at explicit times, keeping the state."""

    def __init__(self, algorithm: Algorithm, now: float = 1000.0) -> None:
        self.algorithm, self.now, self.state = algorithm, now, None

    def hit(self, cost: float = 1, *, at: float | None = None, lease: str = "") -> Any:
        if at is not None:
            self.now = at
        self.state, decision = self.algorithm.step(self.state, self.now, cost, lease)
        return decision


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: TokenBucket(0, 1), "rate"),
        (lambda: TokenBucket(1, -1), "burst"),
        (lambda: GCRA(math.inf, 1), "rate"),
        (lambda: GCRA(1, math.nan), "burst"),
        (lambda: SlidingWindowLog(0, 1), "limit"),
        (lambda: SlidingWindowLog(1, 0), "window"),
        (lambda: SlidingWindowCounter(1, "60"), "window"),
        (lambda: FixedWindow(True, 1), "limit"),
        (lambda: Concurrency(1, -5), "lease"),
    ],
)
def test_invalid_configuration_names_the_field(make: Any, field: str) -> None:
    """Construction rejects bad values with a ConfigError naming the field and range."""
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.field == field
    assert "must be" in str(info.value)


def test_durations_accept_timedelta() -> None:
    """Windows and leases may be given as timedelta."""
    assert SlidingWindowLog(5, timedelta(minutes=1)).window == 60.0  # type: ignore[arg-type]
    assert Concurrency(5, timedelta(seconds=2)).lease == 2.0  # type: ignore[arg-type]


def test_algorithms_are_frozen_values() -> None:
    """Algorithms are immutable, hashable and compare by value."""
    bucket = TokenBucket(10, 20)
    with pytest.raises(AttributeError):
        bucket.rate = 5  # type: ignore[misc]
    assert bucket == TokenBucket(10.0, 20.0)
    assert len({bucket, TokenBucket(10, 20)}) == 1
    assert default_name(bucket) == "token_bucket:10:20"
    assert bucket.scaled(0.5) == TokenBucket(5, 10)


def test_token_bucket_refills_at_rate_up_to_burst() -> None:
    """Tokens return at `rate` per second and never exceed `burst`."""
    run = Run(TokenBucket(rate=2, burst=4))
    assert [run.hit().allowed for _ in range(5)] == [True] * 4 + [False]
    denied = run.hit()
    assert denied.retry_after == pytest.approx(0.5)
    assert denied.reset_after == pytest.approx(2.0)
    assert run.hit(at=1000.5).allowed
    assert run.hit(at=1100.0).remaining == pytest.approx(3)


def test_gcra_admits_what_the_token_bucket_admits() -> None:
    """GCRA and TokenBucket with the same rate and burst agree hit for hit."""
    bucket, gcra = Run(TokenBucket(3, 5)), Run(GCRA(3, 5))
    times = [1000 + i * 0.1 for i in range(40)]
    for t in times:
        b, g = bucket.hit(at=t), gcra.hit(at=t)
        assert b.allowed == g.allowed
        assert b.remaining == pytest.approx(g.remaining, abs=1e-6)
        assert b.retry_after == pytest.approx(g.retry_after, abs=1e-6)


def test_sliding_log_counts_every_hit_in_the_window() -> None:
    """An entry counts for exactly `window` seconds after it was made."""
    run = Run(SlidingWindowLog(limit=3, window=10))
    run.hit(at=1000)
    run.hit(at=1004)
    run.hit(at=1008)
    denied = run.hit(at=1009)
    assert not denied.allowed
    assert denied.retry_after == pytest.approx(1.0)
    assert denied.reset_after == pytest.approx(9.0)
    assert run.hit(at=1010).allowed
    assert not run.hit(at=1013.9).allowed
    assert run.hit(at=1014).allowed


def test_fixed_window_resets_on_the_boundary() -> None:
    """Counts restart at each multiple of `window`; retry_after is the boundary."""
    run = Run(FixedWindow(limit=2, window=10))
    assert run.hit(at=1003).allowed
    assert run.hit(at=1004).allowed
    denied = run.hit(at=1006)
    assert denied.retry_after == pytest.approx(4.0)
    assert run.hit(at=1010).allowed


def test_sliding_counter_weights_the_previous_window() -> None:
    """used = previous * (1 - elapsed/window) + current."""
    run = Run(SlidingWindowCounter(limit=10, window=10))
    for _ in range(10):
        assert run.hit(at=1005).allowed
    # At 1012.5: previous 10 * 0.75 = 7.5 used, so 2 more fit, not 3.
    assert run.hit(at=1012.5).allowed
    assert run.hit().allowed
    denied = run.hit()
    assert not denied.allowed
    # 10 * (1 - e/10) + 2 + 1 <= 10  <=>  e >= 3: wait 0.5 s.
    assert denied.retry_after == pytest.approx(0.5)
    assert run.hit(at=1013.0).allowed


def test_concurrency_leases_expire_and_release() -> None:
    """A slot is held until released, or until `lease` seconds pass."""
    algorithm = Concurrency(limit=2, lease=30)
    run = Run(algorithm)
    a = run.hit(lease="a")
    assert a.lease == "a"
    run.hit(lease="b", at=1010)
    denied = run.hit(lease="c", at=1020)
    assert denied.retry_after == pytest.approx(10.0)
    assert run.hit(lease="c", at=1030).allowed  # "a" expired
    run.state, ttl = algorithm.release(run.state, "b", 1031)
    assert ttl == pytest.approx(29.0)
    run.state, _, found = algorithm.renew(run.state, "c", 1040)
    assert found
    assert run.hit(lease="d", at=1041).allowed
    assert not run.hit(lease="e", at=1065).allowed  # "c" renewed until 1070
    run.state, _, found = algorithm.renew(run.state, "a", 1065)
    assert not found


@pytest.mark.parametrize(
    "algorithm",
    [
        TokenBucket(3, 5),
        GCRA(3, 5),
        SlidingWindowLog(5, 7),
        SlidingWindowCounter(5, 7),
        FixedWindow(5, 7),
        Concurrency(5, 7),
    ],
    ids=lambda a: a.kind,
)
def test_waiting_retry_after_is_enough(algorithm: Algorithm, rng: Any) -> None:
    """After a denial, the same hit at now + retry_after is admitted (exactness)."""
    run = Run(algorithm, now=1000.0 + rng.random())
    denials = 0
    for _ in range(300):
        cost = rng.choice([1, 1, 2, 3])
        decision = run.hit(cost, at=run.now + rng.random() * 0.4, lease=str(rng.random()))
        if not decision.allowed:
            denials += 1
            assert 0 < decision.retry_after < math.inf
            assert run.hit(cost, at=run.now + decision.retry_after, lease="x").allowed
    assert denials > 20


@pytest.mark.parametrize(
    "algorithm",
    [TokenBucket(1, 2), GCRA(1, 2), SlidingWindowLog(2, 5), FixedWindow(2, 5)],
    ids=lambda a: a.kind,
)
def test_clock_stepping_back_refunds_nothing(algorithm: Algorithm) -> None:
    """A clock that jumps backwards neither refunds nor revokes quota."""
    run = Run(algorithm)
    run.hit(2, at=1000.0)
    assert not run.hit(at=990.0).allowed
    assert not run.hit(at=1000.0).allowed


def test_group_is_all_or_nothing() -> None:
    """decide_group returns no states when one request denies, and peeks the others."""
    tight, loose = FixedWindow(1, 10), FixedWindow(5, 10)
    requests = [LimitRequest(tight, "a", "tight"), LimitRequest(loose, "a", "loose")]
    states, decisions = decide_group(requests, [(100, 1.0), None], 1001.0)
    assert states is None
    assert [d.allowed for d in decisions] == [False, True]
    assert decisions[1].remaining == 5
    assert [d.name for d in decisions] == ["tight", "loose"]
    states, decisions = decide_group(requests, [None, None], 1001.0)
    assert states == [(100, 1.0), (100, 1.0)]
