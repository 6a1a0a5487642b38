"""The inlined TokenBucket/GCRA hot paths decide exactly like the generic path."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard import GCRA, ConfigError, RateLimiter, TokenBucket
from stormguard.stores import MemoryStore
from stormguard.testing import FakeClock

steps = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.floats(min_value=0, max_value=3, allow_nan=False),  # time advance
        st.one_of(st.sampled_from([1.0, 0.0, 2.5]), st.floats(min_value=0, max_value=12)),
    ),
    min_size=1,
    max_size=60,
)
algorithms = st.one_of(
    st.builds(TokenBucket, st.sampled_from([0.5, 1, 3.3, 10]), st.sampled_from([1, 2, 5, 9.5])),
    st.builds(GCRA, st.sampled_from([0.5, 1, 3.3, 10]), st.sampled_from([1, 2, 5, 9.5])),
)


@settings(max_examples=300, deadline=None)
@given(algorithms, steps)
def test_fast_path_equals_generic_path(algorithm: TokenBucket | GCRA, trace: list) -> None:
    """Random traffic gives bit-identical decisions and stored state on both paths."""
    fast_clock, slow_clock = FakeClock(), FakeClock()
    fast = MemoryStore(clock=fast_clock).hitter(algorithm, "p")
    slow = MemoryStore(clock=slow_clock).hitter(algorithm, "p", inline=False)
    assert fast.__code__ is not slow.__code__  # the store chose its inlined step
    for key, dt, cost in trace:
        fast_clock.advance(dt)
        slow_clock.advance(dt)
        assert fast(key, cost) == slow(key, cost)
        # The stored state, read back through the generic path (cost 0 takes nothing).
        assert [fast(k, 0.0) for k in "abc"] == [slow(k, 0.0) for k in "abc"]


@pytest.mark.parametrize("algorithm", [TokenBucket(1, 2), GCRA(1, 2)])
@pytest.mark.parametrize("cost", [-1.0, float("inf"), float("nan")])
def test_bad_costs_still_fail_clearly(algorithm: TokenBucket | GCRA, cost: float) -> None:
    """The fast path hands invalid costs to the generic path, which names the field."""
    with pytest.raises(ConfigError, match="cost"):
        RateLimiter(algorithm).hit("k", cost)


def test_oversized_cost_is_denied_forever() -> None:
    """A cost above the burst takes the generic path: denied with an infinite retry_after."""
    decision = RateLimiter(GCRA(1, 2)).hit("k", 5)
    assert not decision.allowed and decision.retry_after == float("inf")


@pytest.mark.stress
@pytest.mark.parametrize("algorithm", [TokenBucket(5, 5), GCRA(5, 5)])
def test_a_million_keys_stay_within_the_cap(algorithm: TokenBucket | GCRA) -> None:
    """A flood of a million distinct keys through the fast path keeps max_keys entries."""
    store = MemoryStore(max_keys=1_000, clock=FakeClock())
    limiter = RateLimiter(algorithm, store)
    for i in range(1_000_000):
        limiter.hit(str(i))
    assert len(store) == 1_000
    assert limiter.hit("999999", 0).remaining == 4  # the newest survive
    assert limiter.hit("0", 0).remaining == 5  # the oldest were evicted (fresh again)
