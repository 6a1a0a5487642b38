"""The storm scenario: an outage under 1,000 rps, with and without retry discipline."""

from __future__ import annotations

import math

import pytest

from stormguard._errors import ConfigError
from stormguard.sim import _storm

CONFIG = _storm.StormConfig(rps=1000.0, outage=3.0, outage_start=2.0, duration=8.0)


def _result(strategy: str, config: _storm.StormConfig = CONFIG) -> _storm.StormResult:
    (result,) = _storm.run(config, seed=1, strategies=(strategy,))
    return result


def test_immediate_retries_quadruple_the_load() -> None:
    """Three immediate retries turn 1,000 rps into about 4,000 rps during the outage."""
    result = _result("immediate")
    expected = (1 + CONFIG.retries) * CONFIG.rps
    # Poisson arrivals: a second holds rps +- sqrt(rps); the peak of 3 seconds.
    spread = (1 + CONFIG.retries) * math.sqrt(CONFIG.rps)
    assert result.peak_rps == pytest.approx(expected, abs=4 * spread)
    during = result.timeline[int(CONFIG.outage_start) + 1]
    assert during[1] == pytest.approx(expected, rel=0.1)
    assert during[2] == 0


def test_no_outage_no_retries() -> None:
    """Without an outage nothing fails and every request is one attempt."""
    result = _result("immediate", _storm.StormConfig(outage=0.0, duration=3.0))
    assert result.failed == 0
    assert result.amplification == 1.0
    assert result.recovery_s == 0.0


def test_shared_budget_bounds_amplification() -> None:
    """A shared ratio budget keeps attempts within 1 + ratio plus the reserve per window."""
    result = _result("full+budget")
    windows = CONFIG.duration / CONFIG.budget_window + 1
    reserve = CONFIG.budget_min_per_second * CONFIG.budget_window * windows
    assert result.amplification <= 1 + CONFIG.budget_ratio + reserve / result.requests


def test_collapse_keeps_unbudgeted_retries_down_and_budget_recovers() -> None:
    """Goodput collapse: 4x load keeps the server down; the budget's 1.1x lets it recover."""
    config = _storm.StormConfig(
        rps=1000.0, outage=2.0, outage_start=2.0, duration=10.0, server="collapse"
    )
    assert _result("immediate", config).recovery_s == math.inf
    assert _result("full+budget", config).recovery_s < 2.0


def test_unknown_server_is_rejected() -> None:
    """A server model outside outage|capacity|collapse is a ConfigError."""
    with pytest.raises(ConfigError, match="collapse"):
        _storm.StormConfig(server="meltdown")


def test_capacity_server_sheds_what_the_token_bucket_refuses() -> None:
    """Without retries, over capacity C for D seconds about C*D + burst attempts succeed."""
    config = _storm.StormConfig(
        rps=1000.0, outage=0.0, duration=5.0, retries=0, server="capacity", capacity=600.0
    )
    result = _result("immediate", config)
    served = result.requests - result.failed
    # Tokens refill from the first arrival to the last; a partial token and the
    # gaps at both ends (a few ms at 600 tokens/s) go unused.
    assert 600.0 * 5.0 + 60.0 - 10 <= served <= 600.0 * 5.0 + 60.0


def test_capacity_above_load_fails_nothing() -> None:
    """Below its capacity the capacity server behaves like a healthy one."""
    config = _storm.StormConfig(rps=500.0, outage=0.0, duration=3.0, server="capacity")
    assert _result("immediate", config).failed == 0
