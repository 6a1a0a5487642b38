"""The hedging rules of core/_hedge.py: the delay (fixed or a latency percentile)
and the latency window it is taken over."""

from __future__ import annotations

import pytest

from stormguard import ConfigError, HedgePolicy
from stormguard.core._hedge import LatencyWindow


def test_a_fixed_delay_is_the_delay() -> None:
    """No percentile: the configured delay, whatever latencies were seen."""
    window = LatencyWindow(10)
    for latency in (5.0, 6.0, 7.0):
        window.record(latency)
    assert HedgePolicy(delay=0.2).delay_for(window) == 0.2


def test_a_percentile_waits_for_enough_samples() -> None:
    """percentile=95 uses `delay` until min_samples latencies are known, then the p95."""
    policy = HedgePolicy(delay=0.5, percentile=95, min_samples=20)
    window = LatencyWindow(100, refresh=1)
    for index in range(19):
        window.record(0.01 * (index + 1))
    assert policy.delay_for(window) == 0.5
    window.record(0.20)
    assert policy.delay_for(window) == pytest.approx(0.19)  # the 19th of 20 (nearest rank)


def test_a_percentile_never_goes_under_min_delay() -> None:
    """Very fast latencies: the delay is floored at min_delay."""
    policy = HedgePolicy(percentile=50, min_samples=1, min_delay=0.05)
    window = LatencyWindow(10, refresh=1)
    window.record(0.001)
    assert policy.delay_for(window) == 0.05


def test_the_window_keeps_only_the_last_latencies() -> None:
    """Past `size` samples the oldest are replaced: the tail follows the service."""
    window = LatencyWindow(4, refresh=1)
    for latency in (9.0, 9.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0):
        window.record(latency)
    assert len(window) == 4 and window.percentile(100) == 1.0


def test_the_window_ignores_nonsense() -> None:
    """Negative and non-finite latencies are not recorded."""
    window = LatencyWindow(4)
    for latency in (-1.0, float("nan"), float("inf")):
        window.record(latency)
    assert len(window) == 0 and window.percentile(99) == 0.0


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"attempts": 1}, "attempts"),
        ({"attempts": 11}, "attempts"),
        ({"delay": -1}, "delay"),
        ({"percentile": 100}, "percentile"),
        ({"percentile": 0}, "percentile"),
        ({"min_samples": 0}, "min_samples"),
        ({"ratio": -0.1}, "ratio"),
        ({"min_per_second": -1}, "min_per_second"),
    ],
)
def test_invalid_policies_fail_naming_the_field(changes: dict[str, object], field: str) -> None:
    """Out-of-range settings raise ConfigError naming the field, at construction."""
    with pytest.raises(ConfigError) as info:
        HedgePolicy(**changes)  # type: ignore[arg-type]
    assert info.value.field == field
