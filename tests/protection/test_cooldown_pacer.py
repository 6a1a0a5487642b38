"""Cooldown and Pacer runtimes: per-origin pauses and pacing from rate-limit headers."""

from __future__ import annotations

import pytest

from stormguard.protection import Cooldown, Pacer
from stormguard.testing import FakeClock


def test_cooldown_pauses_one_origin(clock: FakeClock) -> None:
    """pause() affects only its origin and runs out on the clock."""
    cooldown = Cooldown(clock=clock)
    cooldown.pause("https://a", 10.0)
    assert cooldown.remaining("https://a") == 10.0
    assert cooldown.remaining("https://b") == 0.0
    clock.advance(4.0)
    assert cooldown.remaining("https://a") == 6.0
    clock.advance(7.0)
    assert cooldown.remaining("https://a") == 0.0


def test_cooldown_never_shortens_and_is_capped(clock: FakeClock) -> None:
    """A shorter pause keeps the longer one; max_pause caps absurd hints."""
    cooldown = Cooldown(clock=clock, max_pause=100.0)
    cooldown.pause("o", 50.0)
    cooldown.pause("o", 5.0)
    assert cooldown.remaining("o") == 50.0
    cooldown.pause("o", 1e9)
    assert cooldown.remaining("o") == 100.0
    cooldown.pause("p", float("nan"))
    cooldown.pause("p", -3.0)
    assert cooldown.remaining("p") == 0.0


async def test_cooldown_async_twins(clock: FakeClock) -> None:
    """apause/aremaining without a store act locally."""
    cooldown = Cooldown(clock=clock)
    await cooldown.apause("o", 3.0)
    assert await cooldown.aremaining("o") == 3.0


def test_pacer_spreads_the_last_requests(clock: FakeClock) -> None:
    """GitHub headers with 10 of 5000 left and 100 s to reset: one request every 10 s."""
    pacer = Pacer(clock=clock)
    reset = int(clock.time()) + 100
    pacer.observe(
        "https://api.github.com",
        {
            "x-ratelimit-limit": "5000",
            "x-ratelimit-remaining": "10",
            "x-ratelimit-reset": str(reset),
            "x-ratelimit-resource": "core",
        },
    )
    waits = [pacer.reserve("https://api.github.com") for _ in range(3)]
    assert waits[0] == 0.0
    assert waits[1] == pytest.approx(10.0, abs=0.1)
    assert waits[2] == pytest.approx(20.0, abs=0.1)
    assert pacer.reserve("https://other") == 0.0


def test_pacer_ignores_plenty_and_garbage(clock: FakeClock) -> None:
    """Plenty remaining, or unparseable headers, never pace."""
    pacer = Pacer(clock=clock)
    pacer.observe("o", {"x-ratelimit-limit": "100", "x-ratelimit-remaining": "90"})
    pacer.observe("o", {"x-ratelimit-remaining": "lots", "retry-after": "\x00"})
    assert pacer.reserve("o") == 0.0
    assert pacer.delay("o") == 0.0
