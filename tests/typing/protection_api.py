"""Typing checks of the protection API: checked by mypy --strict (make types), never run."""

from __future__ import annotations

import asyncio

import stormguard
from stormguard.protection import BreakerEvent, OriginGuards, Permit

breaker = stormguard.CircuitBreaker(failure_rate=0.5, min_calls=10, name="api")
budget = stormguard.RetryBudget(ratio=0.1, min_per_second=10, window=10.0)
bulkhead = stormguard.Bulkhead(8, max_wait=1.0)
cooldown = stormguard.Cooldown()
pacer = stormguard.Pacer()


@breaker
def fetch(x: int) -> str:
    return str(x)


@breaker
async def afetch(x: int) -> bytes:
    await asyncio.sleep(0)
    return b""


@bulkhead
def limited(x: int) -> float:
    return float(x)


def on_change(event: BreakerEvent) -> None:
    print(event.old_state, event.new_state)


async def use() -> None:
    text: str = fetch(1)
    data: bytes = await afetch(2)
    number: float = limited(3)
    value: int = breaker.call(len, "abc")
    awaited: bytes = await breaker.acall(afetch, 4)
    permit: Permit = breaker.acquire()
    permit.record(failure=False)
    apermit: Permit = await breaker.aacquire()
    await apermit.arecord(failure=True)
    with breaker:
        pass
    async with breaker, bulkhead:
        pass
    state: str = breaker.state
    budget.record_request()
    allowed: bool = budget.try_retry()
    await budget.arecord_request()
    allowed = await budget.atry_retry()
    cooldown.pause("https://api.example.com", 5.0)
    left: float = cooldown.remaining("https://api.example.com")
    wait: float = pacer.reserve("https://api.example.com")
    policy = stormguard.RetryPolicy(budget=budget, breaker=breaker)
    guard = OriginGuards(breaker={"failure_rate": 0.3}, bulkhead=False).get("https://a")
    print(text, data, number, value, awaited, state, allowed, left, wait, policy, guard)
    stormguard.CircuitBreaker(listeners=[on_change])
