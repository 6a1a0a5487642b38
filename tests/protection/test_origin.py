"""OriginGuards: per-origin breaker, budget, bulkhead, cooldown and pacing for HTTP clients."""

from __future__ import annotations

import pytest

from stormguard import BulkheadFull, ConfigError, RateLimited, RetryPolicy
from stormguard.protection import Bulkhead, CircuitBreaker, Cooldown
from stormguard.protection._origin import OriginGuards, origin_of
from stormguard.testing import FakeClock


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://API.example.com/v1/x?q=1", "https://api.example.com"),
        ("https://api.example.com:443/", "https://api.example.com"),
        ("http://localhost:8080/a", "http://localhost:8080"),
        ("https://user:pw@h.example/", "https://h.example"),
    ],
)
def test_origin_of(url: str, origin: str) -> None:
    """The origin is scheme://host[:port], lower-cased, default ports dropped."""
    assert origin_of(url) == origin


def test_defaults_give_each_origin_its_own_objects(clock: FakeClock) -> None:
    """On by default: a breaker, budget and bulkhead per origin, named after it."""
    guards = OriginGuards(clock=clock)
    a, b = guards.get("https://a"), guards.get("https://b")
    assert guards.get("https://a") is a
    assert a.breaker is not None and a.breaker.name == "https://a"
    assert a.breaker is not b.breaker
    assert a.budget is not None and a.budget is not b.budget
    assert a.bulkhead is not None and a.bulkhead.limit == 100


def test_each_part_off_with_one_keyword(clock: FakeClock) -> None:
    """False turns a part off; all off means nothing to do."""
    guards = OriginGuards(
        breaker=False, budget=False, bulkhead=False, cooldown=False, pacing=False, clock=clock
    )
    guard = guards.get("https://a")
    assert (guard.breaker, guard.budget, guard.bulkhead) == (None, None, None)
    assert not guards.enabled
    assert guard.wait_before(1.0) == 0.0
    with guard.slot():
        pass


def test_settings_and_shared_objects(clock: FakeClock) -> None:
    """A mapping configures the per-origin object; an instance is shared by all origins."""
    shared = Bulkhead(3)
    guards = OriginGuards(breaker={"failure_rate": 0.25}, bulkhead=shared, clock=clock)
    a, b = guards.get("https://a"), guards.get("https://b")
    assert a.breaker is not None and a.breaker.config.failure_rate == 0.25
    assert a.bulkhead is shared and b.bulkhead is shared
    with pytest.raises(ConfigError):
        OriginGuards(breaker="yes")


def test_policy_gets_the_origin_breaker_and_budget(clock: FakeClock) -> None:
    """The policy is completed with the origin's breaker/budget, unless it has its own."""
    guards = OriginGuards(clock=clock)
    guard = guards.get("https://a")
    base = RetryPolicy(attempts=3)
    policy = guard.policy(base)
    assert policy.breaker is guard.breaker
    assert policy.budget is guard.budget
    assert guard.policy(base) is policy  # cached
    own = CircuitBreaker()
    assert guard.policy(base.replace(breaker=own)).breaker is own


def test_cooldown_from_429_hint_pauses_the_origin(clock: FakeClock) -> None:
    """A 429 with a hint pauses the origin; a deadline shorter than the pause fails fast."""
    guards = OriginGuards(clock=clock)
    guard = guards.get("https://a")
    guard.observe(429, {"retry-after": "30"}, 30.0)
    assert guards.get("https://b").wait_before(60.0) == 0.0
    assert 30.0 <= guard.wait_before(60.0) <= 37.5  # resumptions spread over 25 %
    assert guard.wait_before(31.0) <= 31.0  # never past the limit
    with pytest.raises(RateLimited) as info:
        guard.wait_before(10.0)
    assert info.value.retry_after == 30.0
    clock.advance(31.0)
    assert guard.wait_before(10.0) == 0.0


def test_500_hint_does_not_pause(clock: FakeClock) -> None:
    """Only 429 and 503 hints pause the whole origin."""
    guard = OriginGuards(clock=clock).get("https://a")
    guard.observe(500, {}, 30.0)
    assert guard.wait_before(60.0) == 0.0


def test_pacing_from_headers(clock: FakeClock) -> None:
    """Quota headers under 10 % pace the origin; too long a slot fails fast."""
    guard = OriginGuards(clock=clock).get("https://api.github.com")
    headers = {
        "x-ratelimit-limit": "100",
        "x-ratelimit-remaining": "2",
        "x-ratelimit-reset": str(int(clock.time()) + 60),
    }
    guard.observe(200, headers, None)
    assert guard.wait_before(60.0) == 0.0
    with pytest.raises(RateLimited):
        guard.wait_before(5.0)  # next slot in 30 s: no slot taken
    assert guard.wait_before(60.0) == pytest.approx(30.0, abs=0.5)


def test_bulkhead_slot_is_bounded_by_the_wait(clock: FakeClock) -> None:
    """The slot waits at most the given max_wait, then raises BulkheadFull."""
    guard = OriginGuards(bulkhead={"limit": 1}, clock=clock).get("https://a")
    with guard.slot(), pytest.raises(BulkheadFull), guard.slot(0.0):
        pass


async def test_async_twins(clock: FakeClock) -> None:
    """aobserve/await_before/aslot mirror the sync forms."""
    guard = OriginGuards(bulkhead={"limit": 1}, clock=clock).get("https://a")
    await guard.aobserve(503, {}, 5.0)
    assert 5.0 <= await guard.await_before(60.0) <= 6.25
    async with guard.aslot():
        with pytest.raises(BulkheadFull):
            async with guard.aslot(0.0):
                pass


def test_observe_reads_the_hint_from_headers(clock: FakeClock) -> None:
    """Without a parsed hint, observe() reads Retry-After itself."""
    guard = OriginGuards(clock=clock).get("https://a")
    guard.observe(503, {"Retry-After": "12"})
    assert guard.cooldown_remaining() == 12.0
    guard.observe(429, {"Retry-After": "not a number"})
    assert guard.cooldown_remaining() == 12.0


def test_guards_for_shares_defaults_process_wide() -> None:
    """Default settings share the process registry; custom ones get their own; guards= wins."""
    from stormguard.protection._origin import guards_for, process_guards

    assert guards_for() is guards_for() is process_guards()
    assert guards_for(pacing=False) is not guards_for(pacing=False)
    mine = OriginGuards()
    assert guards_for(guards=mine, breaker=False) is mine


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1/x?secret=1",
        "http://user:pw@[::1/x?secret=1#frag",
        "https://h.example:99999/x?secret=1",
        "https://h.example:abc/p?secret=1",
        "http://[zz]/?secret=1",
        "http://[::1?secret=1",
        "http://[::1\\x?secret=1",
    ],
)
def test_origin_of_a_malformed_url_never_leaks_its_query(url: str) -> None:
    """A malformed URL gives scheme://authority at most: no query, path or user info."""
    origin = origin_of(url)
    assert "secret" not in origin and "?" not in origin and "pw" not in origin
    assert origin.startswith(("http://", "https://"))


def _fill(guards: OriginGuards, count: int) -> None:
    for i in range(count):
        guards.get(f"https://o{i}.example")


def test_guards_evict_the_least_recently_used(clock: FakeClock) -> None:
    """A new origin past 1,024 forgets the least recently used one, not the oldest."""
    guards = OriginGuards(clock=clock)
    first = guards.get("https://first.example")
    _fill(guards, 1023)
    assert guards.get("https://first.example") is first  # used again: most recent
    guards.get("https://new.example")
    assert "https://first.example" in guards.origins()
    assert "https://o0.example" not in guards.origins()
    assert len(list(guards.origins())) == 1024


def test_an_open_breaker_is_never_forgotten(clock: FakeClock) -> None:
    """An origin whose breaker is open survives 1,100 other origins and stays refused."""
    guards = OriginGuards(clock=clock, breaker={"min_calls": 1})
    sick = guards.get("https://sick.example")
    assert sick.breaker is not None
    with pytest.raises(ZeroDivisionError):
        sick.breaker.call(lambda: 1 / 0)
    _fill(guards, 1100)
    again = guards.get("https://sick.example")
    assert again is sick
    assert again.breaker is not None and again.breaker.state == "open"


def test_a_bulkhead_with_holders_is_never_forgotten(clock: FakeClock) -> None:
    """A bulkhead of 5 that is full stays the same object: a 6th caller is refused."""
    guards = OriginGuards(clock=clock, bulkhead={"limit": 5, "max_wait": 0.0})
    busy = guards.get("https://busy.example")
    assert busy.bulkhead is not None
    for _ in range(5):
        busy.bulkhead.acquire()
    _fill(guards, 1100)
    assert guards.get("https://busy.example") is busy
    with pytest.raises(BulkheadFull), guards.get("https://busy.example").slot(0.0):
        pass


def test_a_running_cooldown_keeps_its_origin(clock: FakeClock) -> None:
    """An origin paused by a 429 hint survives eviction until the pause ends."""
    guards = OriginGuards(clock=clock)
    paused = guards.get("https://paused.example")
    paused.observe(429, {"Retry-After": "60"})
    _fill(guards, 1100)
    assert guards.get("https://paused.example") is paused
    clock.advance(61.0)
    _fill(guards, 1100)  # the pause ended: now it may go
    assert guards.get("https://paused.example") is not paused


def test_cooldown_is_bounded(clock: FakeClock) -> None:
    """At max_origins the least recently paused origin is forgotten; the newest is kept."""
    cooldown = Cooldown(clock=clock, max_origins=100)
    for i in range(10_000):
        cooldown.pause(f"https://o{i}.example", 3600.0)
    assert len(cooldown) <= 100
    assert cooldown.remaining("https://o9999.example") == 3600.0


def test_cooldown_drops_ended_pauses_as_it_goes(clock: FakeClock) -> None:
    """80,000 short pauses over time: the map holds about the running ones, not all seen."""
    cooldown = Cooldown(clock=clock)
    for i in range(80_000):
        cooldown.pause(f"https://o{i}.example", 1.0)
        clock.advance(0.1)
    assert len(cooldown) <= 30  # about 10 running at any time


def test_reset_process_guards_starts_afresh() -> None:
    """The public reset forgets the shared breakers and pauses, for adapters old and new."""
    from stormguard.protection import process_guards, reset_process_guards

    guards = process_guards()
    guard = guards.get("https://sick.example")
    assert guard.breaker is not None
    guard.breaker.force_open()
    guard.observe(429, {"Retry-After": "60"})
    reset_process_guards()
    assert process_guards() is guards  # same registry: adapters holding it see the reset
    fresh = guards.get("https://sick.example")
    assert fresh is not guard
    assert fresh.breaker is not None and fresh.breaker.state == "closed"
    assert fresh.cooldown_remaining() == 0.0


def test_a_shared_open_breaker_does_not_pin_every_origin(clock: FakeClock) -> None:
    """A ready-made breaker shared by all origins being open does not stop eviction."""
    shared = CircuitBreaker(min_calls=1, clock=clock)
    shared.force_open()
    guards = OriginGuards(clock=clock, breaker=shared)
    _fill(guards, 1100)
    assert len(list(guards.origins())) == 1024
