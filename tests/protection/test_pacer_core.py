"""PacerCore: spread the last 10% of a quota evenly over the time to its reset."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stormguard.core._pacer import PacerCore


@dataclass(frozen=True)
class Q:
    name: str | None
    limit: float | None
    remaining: float | None
    reset_after: float | None
    window: float | None = None


def test_plenty_remaining_is_not_paced() -> None:
    """Above 10% of the limit nothing waits."""
    pacer = PacerCore()
    pacer.observe([Q("core", 5000, 600, 3000)], now=0.0)
    assert [pacer.reserve(0.0) for _ in range(5)] == [0.0] * 5


def test_under_threshold_spreads_remaining_over_reset() -> None:
    """With 10 left and 100 s to reset, requests go out every 10 s."""
    pacer = PacerCore()
    pacer.observe([Q("core", 5000, 10, 100.0)], now=0.0)
    waits = [pacer.reserve(0.0) for _ in range(4)]
    assert waits == pytest.approx([0.0, 10.0, 20.0, 30.0])


def test_empty_quota_waits_for_reset() -> None:
    """remaining == 0 waits until the reset; afterwards pacing ends."""
    pacer = PacerCore()
    pacer.observe([Q("core", 60, 0, 42.0)], now=0.0)
    assert pacer.reserve(0.0) == pytest.approx(42.0)
    assert pacer.reserve(43.0) == 0.0
    assert pacer.reserve(43.0) == 0.0


def test_pools_are_separate_per_name() -> None:
    """GitHub core and search are paced independently; the waits take the max."""
    pacer = PacerCore()
    pacer.observe([Q("core", 5000, 4000, 3000), Q("search", 30, 2, 60.0)], now=0.0)
    assert pacer.reserve(0.0) == 0.0
    assert pacer.reserve(0.0) == pytest.approx(30.0)
    pacer.observe([Q("search", 30, 30, 60.0)], now=1.0)  # refilled: pacing over
    assert pacer.reserve(1.0) == 0.0


def test_pacing_ends_at_reset() -> None:
    """After its reset time a pool no longer paces."""
    pacer = PacerCore()
    pacer.observe([Q("core", 100, 2, 10.0)], now=0.0)
    assert pacer.reserve(0.0) == 0.0
    assert pacer.reserve(0.0) == pytest.approx(5.0)
    assert pacer.reserve(20.0) == 0.0
    assert pacer.delay(20.0) == 0.0


def test_unknown_fields_are_ignored() -> None:
    """Quotas without remaining or reset never pace."""
    pacer = PacerCore()
    pacer.observe([Q(None, None, None, 5.0), Q("x", 10, 0, None)], now=0.0)
    assert pacer.reserve(0.0) == 0.0


def test_delay_does_not_reserve() -> None:
    """delay() reports the wait without taking the slot."""
    pacer = PacerCore()
    pacer.observe([Q("core", 100, 5, 50.0)], now=0.0)
    pacer.reserve(0.0)
    assert pacer.delay(0.0) == pytest.approx(10.0)
    assert pacer.delay(0.0) == pytest.approx(10.0)
