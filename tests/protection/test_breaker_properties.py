"""Property tests of BreakerCore: invariants hold for any sequence of events."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard.core._breaker import Admission, BreakerCore

# An event: (kind, time step, outcome pick)
events = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "acquire", "record", "record", "release", "tick"]),
        st.floats(min_value=0.0, max_value=3.0, allow_nan=False),
        st.integers(min_value=0, max_value=1000),
    ),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(events=events, probes=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_invariants_hold_for_any_sequence(
    events: list[tuple[str, float, int]], probes: int, seed: int
) -> None:
    """Probes in flight never exceed half_open_probes; refusals carry time; states are legal."""
    rng = random.Random(seed)
    core = BreakerCore(
        min_calls=3,
        open_for=1.0,
        open_for_max=4.0,
        half_open_probes=probes,
        probe_lease=2.0,
        window=5.0,
    )
    now = 0.0
    held: list[Admission] = []
    for kind, step, pick in events:
        now += step
        if kind == "acquire":
            admission = core.try_acquire(now, rng)
            if admission.allowed:
                held.append(admission)
            else:
                assert admission.remaining >= 0.0
        elif kind in ("record", "release") and held:
            admission = held.pop(pick % len(held))
            if kind == "record":
                core.record(now, admission, failure=pick % 3 == 0)
            else:
                core.release(now, admission)
        state = core.state(now)
        assert state in ("closed", "open", "half_open")
        in_flight = [
            a for a in held if a.probe and a.generation == core.generation and a.lease_until > now
        ]
        assert len(in_flight) <= probes
        if state == "open":
            assert core.remaining(now) <= 4.0
        calls, fails = core.window_counts(now)
        assert 0 <= fails <= calls


@settings(max_examples=100, deadline=None)
@given(outcomes=st.lists(st.booleans(), min_size=1, max_size=300))
def test_count_window_matches_last_n(outcomes: list[bool]) -> None:
    """The count window always holds exactly the last `window` outcomes while closed."""
    core = BreakerCore(window_kind="count", window=7, min_calls=10_000)
    rng = random.Random(0)
    for failure in outcomes:
        core.record(0.0, core.try_acquire(0.0, rng), failure=failure)
    last = outcomes[-7:]
    assert core.window_counts(0.0) == (len(last), sum(last))
