"""BreakerCore: the pure closed/open/half-open machine, driven in virtual time."""

from __future__ import annotations

import random

import pytest

from stormguard.core._breaker import (
    TRANSITIONS,
    Admission,
    BreakerConfig,
    BreakerCore,
    IllegalTransition,
)


def fail_n(core: BreakerCore, now: float, n: int, rng: random.Random) -> None:
    for _ in range(n):
        adm = core.try_acquire(now, rng)
        core.record(now, adm, failure=True)


def succeed_n(core: BreakerCore, now: float, n: int, rng: random.Random) -> None:
    for _ in range(n):
        adm = core.try_acquire(now, rng)
        core.record(now, adm, failure=False)


def test_closed_admits_and_stays_closed_below_min_calls(rng: random.Random) -> None:
    """Fewer than min_calls failures never trip, whatever the rate."""
    core = BreakerCore(min_calls=10)
    fail_n(core, 0.0, 9, rng)
    assert core.state(0.0) == "closed"
    assert core.try_acquire(0.0, rng).allowed


def test_trips_at_failure_rate_with_min_calls(rng: random.Random) -> None:
    """min_calls outcomes with failures >= failure_rate open the circuit."""
    core = BreakerCore(min_calls=10, failure_rate=0.5, jitter=0.0)
    succeed_n(core, 0.0, 5, rng)
    fail_n(core, 0.0, 4, rng)
    assert core.state(0.0) == "closed"
    fail_n(core, 0.0, 1, rng)
    assert core.state(0.0) == "open"
    adm = core.try_acquire(1.0, rng)
    assert not adm.allowed
    assert adm.remaining == pytest.approx(4.0)


def test_below_failure_rate_stays_closed(rng: random.Random) -> None:
    """A failure share under failure_rate keeps the circuit closed."""
    core = BreakerCore(min_calls=10, failure_rate=0.5)
    for _ in range(100):
        succeed_n(core, 0.0, 2, rng)
        fail_n(core, 0.0, 1, rng)
    assert core.state(0.0) == "closed"


def test_time_window_forgets_old_failures(rng: random.Random) -> None:
    """Failures older than the window no longer count."""
    core = BreakerCore(min_calls=10, window=10.0, buckets=10)
    fail_n(core, 0.0, 9, rng)
    assert core.window_counts(0.5) == (9, 9)
    assert core.window_counts(10.5) == (0, 0)
    fail_n(core, 11.0, 9, rng)
    assert core.state(11.0) == "closed"


def test_time_window_is_bucketed_and_slides(rng: random.Random) -> None:
    """The window drops whole buckets as time moves on."""
    core = BreakerCore(min_calls=1000, window=10.0, buckets=10)
    for t in range(10):
        fail_n(core, float(t), 1, rng)
    assert core.window_counts(9.0) == (10, 10)
    assert core.window_counts(12.0) == (7, 7)
    assert core.window_counts(100.0) == (0, 0)


def test_count_window_keeps_last_n_outcomes(rng: random.Random) -> None:
    """A count window judges the last `window` outcomes only."""
    core = BreakerCore(window_kind="count", window=10, min_calls=10, failure_rate=0.5)
    fail_n(core, 0.0, 4, rng)
    succeed_n(core, 0.0, 10, rng)
    assert core.window_counts(0.0) == (10, 0)
    fail_n(core, 999.0, 4, rng)
    assert core.state(999.0) == "closed"
    fail_n(core, 999.0, 1, rng)
    assert core.state(999.0) == "open"


def test_slow_calls_count_as_failures(rng: random.Random) -> None:
    """With slow_call set, a success slower than it is a failure."""
    core = BreakerCore(min_calls=5, slow_call=1.0)
    for _ in range(5):
        adm = core.try_acquire(0.0, rng)
        core.record(0.0, adm, failure=False, duration=1.5)
    assert core.state(0.0) == "open"


def test_open_elapses_to_half_open_then_probe_success_closes(rng: random.Random) -> None:
    """After open_for the breaker half-opens; a successful probe closes it."""
    core = BreakerCore(min_calls=2, open_for=5.0, jitter=0.0)
    fail_n(core, 0.0, 2, rng)
    assert core.state(4.9) == "open"
    assert core.state(5.0) == "half_open"
    probe = core.try_acquire(5.0, rng)
    assert probe.allowed
    assert probe.probe
    assert not core.try_acquire(5.0, rng).allowed
    core.record(5.1, probe, failure=False)
    assert core.state(5.1) == "closed"
    assert core.reopens == 0


@pytest.mark.parametrize("probes", [1, 3])
def test_half_open_admits_at_most_half_open_probes(probes: int, rng: random.Random) -> None:
    """Of 50 callers arriving in half-open, only half_open_probes are admitted."""
    core = BreakerCore(min_calls=1, half_open_probes=probes, jitter=0.0)
    fail_n(core, 0.0, 1, rng)
    admitted = [core.try_acquire(10.0, rng) for _ in range(50)]
    assert sum(a.allowed for a in admitted) == probes
    assert all(a.probe for a in admitted if a.allowed)


def test_needs_all_probes_to_succeed(rng: random.Random) -> None:
    """With 3 probes the circuit closes only after 3 successes."""
    core = BreakerCore(min_calls=1, half_open_probes=3, jitter=0.0)
    fail_n(core, 0.0, 1, rng)
    probes = [core.try_acquire(10.0, rng) for _ in range(3)]
    core.record(10.0, probes[0], failure=False)
    core.record(10.0, probes[1], failure=False)
    assert core.state(10.0) == "half_open"
    core.record(10.0, probes[2], failure=False)
    assert core.state(10.0) == "closed"


def test_probe_failure_reopens_with_doubling_up_to_max(rng: random.Random) -> None:
    """Each consecutive re-open doubles the open time, capped at open_for_max."""
    core = BreakerCore(min_calls=1, open_for=5.0, open_for_max=30.0, jitter=0.0)
    fail_n(core, 0.0, 1, rng)
    now, seen = 0.0, []
    for _ in range(5):
        remaining = core.try_acquire(now, rng).remaining
        seen.append(remaining)
        now += remaining
        probe = core.try_acquire(now, rng)
        assert probe.probe
        core.record(now, probe, failure=True)
    assert seen == [5.0, 10.0, 20.0, 30.0, 30.0]


def test_jitter_only_shortens_open_time(rng: random.Random) -> None:
    """Jitter draws the open time from [(1-jitter)*d, d]."""
    draws = []
    for seed in range(50):
        core = BreakerCore(min_calls=1, open_for=10.0, jitter=0.2)
        fail_n(core, 0.0, 1, rng)
        draws.append(core.try_acquire(0.0, random.Random(seed)).remaining)
    assert all(8.0 <= d <= 10.0 for d in draws)
    assert len(set(draws)) > 40


def test_hung_probe_lease_expires_and_reopens(rng: random.Random) -> None:
    """A probe that never reports frees half-open after its lease: it counts as failed."""
    core = BreakerCore(min_calls=1, open_for=5.0, probe_lease=2.0, jitter=0.0)
    fail_n(core, 0.0, 1, rng)
    hung = core.try_acquire(5.0, rng)
    assert hung.probe
    assert not core.try_acquire(6.0, rng).allowed
    assert core.state(7.0) == "open"
    assert core.reopens == 1
    probe = core.try_acquire(17.0, rng)
    assert probe.probe
    core.record(17.0, hung, failure=False)  # the hung one answers late: ignored
    assert core.state(17.0) == "half_open"
    core.record(17.5, probe, failure=False)
    assert core.state(17.5) == "closed"


def test_late_result_of_older_generation_is_ignored(rng: random.Random) -> None:
    """An outcome admitted while closed that lands after the trip changes nothing."""
    core = BreakerCore(min_calls=1, open_for=5.0, jitter=0.0)
    slow = core.try_acquire(0.0, rng)
    fail_n(core, 0.0, 1, rng)
    assert core.state(5.0) == "half_open"
    probe = core.try_acquire(5.0, rng)
    core.record(5.0, slow, failure=True)
    assert core.state(5.0) == "half_open"
    core.record(5.0, probe, failure=False)
    assert core.state(5.0) == "closed"


def test_force_open_holds_until_reset(rng: random.Random) -> None:
    """force_open refuses every call until reset, whatever the time."""
    core = BreakerCore()
    core.force_open(0.0)
    adm = core.try_acquire(1e9, rng)
    assert not adm.allowed
    assert adm.remaining == float("inf")
    core.reset(1e9)
    assert core.state(1e9) == "closed"
    assert core.try_acquire(1e9, rng).allowed


def test_reset_empties_window(rng: random.Random) -> None:
    """reset() closes and forgets the window and re-opens."""
    core = BreakerCore(min_calls=3)
    fail_n(core, 0.0, 2, rng)
    core.reset(0.0)
    fail_n(core, 0.0, 2, rng)
    assert core.state(0.0) == "closed"


def test_illegal_transition_raises_and_changes_nothing() -> None:
    """An event missing from the table raises and leaves the state alone."""
    core = BreakerCore()
    generation = core.generation
    with pytest.raises(IllegalTransition):
        core._fire("probe_succeeded", 0.0)
    assert core.state(0.0) == "closed"
    assert core.generation == generation


def test_transition_table_covers_force_and_reset_from_every_state() -> None:
    """force_open and reset are legal in every state."""
    for state in ("closed", "open", "half_open"):
        assert TRANSITIONS[(state, "force_open")] == "open"
        assert TRANSITIONS[(state, "reset")] == "closed"


def test_refused_admission_record_is_ignored(rng: random.Random) -> None:
    """Recording a refused admission does nothing."""
    core = BreakerCore(min_calls=1)
    core.record(0.0, Admission(False, False, core.generation), failure=True)
    assert core.state(0.0) == "closed"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("failure_rate", 0.0),
        ("failure_rate", 1.5),
        ("min_calls", 0),
        ("window", 0.0),
        ("window_kind", "sliding"),
        ("open_for", -1.0),
        ("open_for_max", 1.0),
        ("half_open_probes", 0),
        ("slow_call", 0.0),
        ("jitter", 1.0),
    ],
)
def test_config_validation(field: str, value: object) -> None:
    """Invalid settings are refused at construction, naming the field."""
    with pytest.raises(ValueError, match=field):
        BreakerConfig(**{field: value})  # type: ignore[arg-type]


def test_config_accepts_timedelta() -> None:
    """Durations may be timedeltas; they are normalised to float seconds."""
    from datetime import timedelta

    cfg = BreakerConfig(open_for=timedelta(seconds=2), window=timedelta(minutes=1))  # type: ignore[arg-type]
    assert cfg.open_for == 2.0
    assert cfg.window == 60.0


def test_quiet_until_and_batched_successes(rng: random.Random) -> None:
    """quiet_until ends at the bucket end or at the first failure; add_successes counts."""
    core = BreakerCore(window=10.0, buckets=10, min_calls=4)
    assert core.quiet_until == float("-inf")
    succeed_n(core, 0.5, 1, rng)
    assert core.quiet_until == pytest.approx(1.0)
    core.add_successes(5)
    assert core.window_counts(0.5) == (6, 0)
    fail_n(core, 0.6, 1, rng)
    assert core.quiet_until == float("-inf")
    assert core.window_counts(11.5) == (0, 0)
    assert core.quiet_until == pytest.approx(12.0)


def test_add_successes_ignored_unless_closed(rng: random.Random) -> None:
    """Batched successes that arrive after a trip change nothing."""
    core = BreakerCore(min_calls=1, jitter=0.0)
    fail_n(core, 0.0, 1, rng)
    core.add_successes(100)
    assert core.state(0.0) == "open"
