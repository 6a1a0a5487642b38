"""The upstream pool's lock-free gate (UpstreamPool.enter/settle/done): the same
admissions and breaker counts as the pool's own methods, or no say at all."""

from __future__ import annotations

from typing import Any

from stormguard.gateway._config import Upstream as UpstreamSettings
from stormguard.gateway._upstream import Held, UpstreamPool
from stormguard.protection._tally import BATCH
from stormguard.server._refusal import Refusal
from stormguard.stores import MemoryStore

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


async def test_a_shared_breaker_has_no_gate() -> None:
    """A breaker in the store: the gate has no say."""
    assert pool(store=MemoryStore()).enter() is None
