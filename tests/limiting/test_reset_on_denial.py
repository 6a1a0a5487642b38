"""On a denial, RateLimit's `t` is when more quota is available for this hit (draft
-10), i.e. Retry-After, for every algorithm; a client that waits exactly `t` is then
admitted. (Before: `t` was the time to a whole quota, up to 2.5x longer.)"""

from __future__ import annotations

import re
from typing import Any

import pytest
from limiting_support import ALGORITHMS, Factory

from stormguard import (
    GCRA,
    Concurrency,
    Decision,
    FixedWindow,
    RateLimiter,
    SlidingWindowCounter,
    SlidingWindowLog,
    TokenBucket,
)
from stormguard.server._refusal import limit_headers
from stormguard.stores import MemoryStore
from stormguard.testing import FakeClock

# Each algorithm with a quota that refills over time, so that the time to a
# whole quota and the time to the next admitted hit differ.
REFILLING = {
    "token_bucket": lambda: TokenBucket(rate=0.1, burst=5),
    "gcra": lambda: GCRA(rate=0.1, burst=5),
    "sliding_window_log": lambda: SlidingWindowLog(5, 60),
    "sliding_window_counter": lambda: SlidingWindowCounter(5, 60),
    "fixed_window": lambda: FixedWindow(5, 60),
    "concurrency": lambda: Concurrency(2, 30),
}


def _t(headers: dict[str, str]) -> int:
    match = re.search(r";t=(\d+)", headers["RateLimit"])
    assert match is not None
    return int(match[1])


def _denied(limiter: RateLimiter, clock: FakeClock) -> Decision:
    # A few hits spread over time (the window slides, the bucket refills), then
    # hits until one is denied.
    for _ in range(3):
        clock.advance(7.0)
        limiter.hit("client")
    for _ in range(50):
        decision = limiter.hit("client")
        if not decision.allowed:
            return decision
    raise AssertionError("never denied")


@pytest.mark.parametrize("kind", sorted(REFILLING))
def test_t_equals_retry_after_and_waiting_t_is_admitted(kind: str) -> None:
    """A denial says t = Retry-After = X-RateLimit-Reset; after exactly t seconds the
    same hit passes."""
    clock = FakeClock(1000.0)
    limiter = RateLimiter(REFILLING[kind](), MemoryStore(clock=clock), clock=clock)
    denied = _denied(limiter, clock)
    headers = denied.headers()
    t = _t(headers)
    assert t == int(headers["Retry-After"]) == int(headers["X-RateLimit-Reset"])
    clock.advance(t)
    assert limiter.hit("client").allowed


def test_the_sliding_window_counter_example_of_the_issue() -> None:
    """ "5/minute" as a sliding-window counter: the denial's t is the wait for the next
    admitted hit, not the 80-odd seconds until the counter is whole."""
    clock = FakeClock(1000.0)
    limiter = RateLimiter(SlidingWindowCounter(5, 60), MemoryStore(clock=clock), clock=clock)
    denied = _denied(limiter, clock)
    assert denied.reset_after > denied.retry_after + 30  # the two numbers differ a lot
    assert _t(denied.headers()) == int(denied.headers()["Retry-After"])


def test_an_allowed_hit_keeps_the_time_to_a_whole_quota() -> None:
    """Allowed: t is still when the quota is whole again (no Retry-After)."""
    decision = Decision(True, 5, 3, 41.2, 0.0, name="api", window=60)
    assert _t(decision.headers()) == 42 and "Retry-After" not in decision.headers()


def test_a_combined_denial_says_t_per_part() -> None:
    """Two limits, one denying: the denying part's t is its wait, the other's its reset."""
    clock = FakeClock(1000.0)
    store = MemoryStore(clock=clock)
    per_client = RateLimiter(SlidingWindowCounter(2, 60), store, name="client", clock=clock)
    everyone = RateLimiter(FixedWindow(100, 60), store, name="global", clock=clock)
    for _ in range(2):
        RateLimiter.hit_many([(per_client, "a"), (everyone, "all")])
    clock.advance(10)
    denied = RateLimiter.hit_many([(per_client, "a"), (everyone, "all")])
    assert not denied.allowed
    parts = dict(re.findall(r'"([^"]+)";r=\d+;t=(\d+)', denied.headers()["RateLimit"]))
    client_part = next(p for p in denied.parts if p.name == "client")
    global_part = next(p for p in denied.parts if p.name == "global")
    assert int(parts["client"]) == int(denied.headers()["Retry-After"])
    assert int(parts["client"]) == max(1, int(-(-client_part.retry_after // 1)))
    assert int(parts["global"]) == int(-(-global_part.reset_after // 1))


def test_the_github_style_reset_on_a_denial_is_when_to_come_back() -> None:
    """X-RateLimit-Reset (epoch seconds) on a denial is now + Retry-After."""
    decision = Decision(False, 5, 0, 80.0, 31.2, name="api", window=60)
    headers = dict(limit_headers(decision, "github", now=1_700_000_000.0))
    assert (
        int(headers["X-RateLimit-Reset"])
        == 1_700_000_000 + int(headers["Retry-After"])
        == (1_700_000_032)
    )


@pytest.mark.parametrize("kind", sorted(ALGORITHMS))
async def test_every_store_says_t_equals_retry_after(make_limiter: Factory, kind: str) -> None:
    """Memory and Redis, sync and async: the denial's t is its Retry-After."""
    limiter: Any = make_limiter(ALGORITHMS[kind](3))
    for _ in range(3):
        await limiter.hit("client")
    denied = await limiter.hit("client")
    headers = denied.headers()
    assert not denied.allowed
    assert _t(headers) == int(headers["Retry-After"]) == int(headers["X-RateLimit-Reset"])
