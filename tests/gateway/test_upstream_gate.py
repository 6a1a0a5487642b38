"""The upstream pool's lock-free gate (UpstreamPool.enter/settle/done): the same
admissions and breaker counts as the pool's own methods, or no say at all."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from stormguard import CircuitOpen
from stormguard.gateway._config import Upstream as UpstreamSettings
from stormguard.gateway._upstream import _REPORTS, Held, UpstreamPool
from stormguard.protection._breaker_store import CachedAdmission
from stormguard.protection._tally import BATCH
from stormguard.server._refusal import Refusal
from stormguard.stores import AsyncRedisStore, MemoryStore
from stormguard.testing import FakeClock

BREAKER = {"failure_rate": 0.5, "min_calls": 4, "window": 30, "open_for": 5}


def pool(store: Any = None, **settings: object) -> UpstreamPool:
    """An upstream pool with ``settings`` (a breaker and a bulkhead of 2 by default)."""
    settings = {"breaker": BREAKER, "bulkhead": {"limit": 2}, **settings}
    config = UpstreamSettings.model_validate({"url": "http://127.0.0.1:9", **settings})
    return UpstreamPool("up", config, store=store)


def gated(p: UpstreamPool) -> Held:
    """A request admitted through the gate (held as the callback path holds it)."""
    ticket = p.enter()
    assert ticket is not None
    return Held(None, "c", True, ticket)


def test_the_gate_takes_a_slot_and_gives_it_back() -> None:
    """Admitted while slots are free; a full bulkhead is no say, with nothing taken."""
    p = pool()
    first, second = gated(p), gated(p)
    assert p.in_flight == 2 and p.enter() is None
    assert isinstance(p.admit_now("c"), Refusal)  # what the pool's own methods say then
    p.done(first)
    p.done(first)  # once only
    assert p.in_flight == 1 and p.bulkhead.bulkhead.in_flight == 1  # type: ignore[union-attr]
    p.done(second)
    assert p.bulkhead.bulkhead.in_flight == 0  # type: ignore[union-attr]


def test_failures_reported_through_the_gate_open_the_breaker() -> None:
    """Failures settled through the gate count like a permit's: the breaker opens,
    and the gate then has no say (the pool's own methods refuse)."""
    p = pool()
    for _ in range(4):
        held = gated(p)
        p.settle(held, True)
        p.settle(held, True)  # once only
        p.done(held)
    assert p.breaker is not None and p.breaker.state == "open"
    assert p.enter() is None and p.in_flight == 0


def test_successes_through_the_gate_are_counted() -> None:
    """Successes settled through the gate reach the breaker's window, past a spent
    batch of lock-free credits too."""
    p = pool()
    for _ in range(BATCH + 44):
        held = gated(p)
        p.settle(held, False)
        p.done(held)
    breaker: Any = p.breaker
    with breaker._lock:
        breaker._drain()
    assert breaker._core._totals() == (BATCH + 44, 0)


def test_a_request_that_never_reached_the_upstream_counts_nothing() -> None:
    """settle(None): the closed admission is given back without an outcome."""
    p = pool()
    held = gated(p)
    p.settle(held, None)
    p.done(held)
    breaker: Any = p.breaker
    with breaker._lock:
        breaker._drain()
    assert breaker._core._totals() == (0, 0) and held.ticket is None


def test_without_breaker_or_bulkhead_the_gate_admits() -> None:
    """No breaker, no bulkhead: every request is admitted at once."""
    p = pool(breaker=None, bulkhead=None)
    held = gated(p)
    p.settle(held, True)
    p.done(held)
    assert p.in_flight == 0


def test_a_client_share_has_no_gate() -> None:
    """A bulkhead with a per-client share: the pool's own methods count it."""
    assert pool(bulkhead={"limit": 2, "per_client": 1}).enter() is None


def test_breakers_sharing_a_memory_store_decide_on_the_gate_as_one() -> None:
    """A breaker shared through a MemoryStore is one core in this process: failures
    settled on one pool's gate open the other pool's breaker, whose gate then has
    no say."""
    store = MemoryStore()
    first, second = pool(store=store), pool(store=store)
    for _ in range(4):
        held = gated(first)
        first.settle(held, True)
        first.done(held)
    assert second.breaker is not None and second.breaker.state == "open"
    assert second.enter() is None


def shared_pool(url: str, name: str, clock: FakeClock) -> UpstreamPool:
    """A pool whose breaker is shared through Redis (the gateway's fleet mode)."""
    config = UpstreamSettings.model_validate({"url": "http://127.0.0.1:9", "breaker": BREAKER})
    return UpstreamPool(name, config, store=AsyncRedisStore(url), clock=clock)


async def reported() -> None:
    """Wait for the failure reports the gates sent in tasks."""
    while _REPORTS:
        await asyncio.gather(*_REPORTS)


@pytest.mark.redis
async def test_a_redis_shared_breaker_admits_on_the_gate_while_its_near_cache_is_fresh(
    redis_url: str,
) -> None:
    """No say before the store was read or once the reading is stale; in between the
    gate admits with nothing asked."""
    clock = FakeClock()
    p = shared_pool(redis_url, uuid.uuid4().hex, clock)
    assert p.enter() is None  # never read: admit() asks the store
    held = await p.admit("c")
    p.done(held)
    assert isinstance(p.enter(), CachedAdmission)
    p.in_flight -= 1  # (no bulkhead: the ticket holds nothing else)
    clock.advance(0.1)  # the default staleness
    assert p.enter() is None


@pytest.mark.redis
async def test_gate_successes_reach_the_fleet_breaker_and_its_failures_trip_it(
    redis_url: str,
) -> None:
    """Six successes on the gate go with the batch of the first failure: four
    failures (4 of 10) leave the shared breaker closed, six (6 of 12) open it, for
    another process too. Without the successes, four failures would have opened it."""
    name = uuid.uuid4().hex
    clock, later = FakeClock(), FakeClock()
    p, other = shared_pool(redis_url, name, clock), shared_pool(redis_url, name, later)
    p.done(await p.admit("c"))  # reads the store: the near cache is fresh
    for failures, outcome in enumerate([False] * 6 + [True] * 6):
        held = gated(p)
        p.settle(held, outcome)
        p.done(held)
        await reported()
        if failures == 9:  # 6 successes, 4 failures
            assert await other.breaker_state() == "closed"
    later.advance(0.1)  # the other process's reading is stale: it reads the store
    assert await other.breaker_state() == "open"
    assert p.enter() is None
    with pytest.raises(CircuitOpen):
        await other.admit("c")
