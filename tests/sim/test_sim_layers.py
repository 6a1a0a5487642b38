"""The layers scenario: nested retries multiply, budgets and top-only retries do not."""

from __future__ import annotations

import pytest

from stormguard._errors import ConfigError
from stormguard.sim import _layers

CONFIG = _layers.LayersConfig(requests=300, rps=100.0)


@pytest.mark.parametrize(("depth", "attempts"), [(1, 4), (2, 3), (3, 4), (4, 2), (5, 3)])
def test_every_layer_multiplies(depth: int, attempts: int) -> None:
    """Retrying at every layer over a failing bottom gives attempts**depth."""
    assert _layers.run_policy("every-layer", depth, attempts, CONFIG) == attempts**depth


@pytest.mark.parametrize("depth", [1, 3, 5])
def test_top_only_is_linear(depth: int) -> None:
    """Retrying only at the top gives attempts, whatever the depth."""
    assert _layers.run_policy("top-only", depth, 4, CONFIG) == 4


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_budget_every_layer_stays_within_ratio_per_layer(depth: int) -> None:
    """Each layer's budget adds at most ratio of its calls plus its reserve per window."""
    seconds = CONFIG.requests / CONFIG.rps
    reserve = CONFIG.min_per_second * CONFIG.window * (seconds / CONFIG.window + 1)
    bound = float(CONFIG.requests)
    for _ in range(depth):
        bound = bound * (1 + CONFIG.ratio) + reserve
    load = _layers.run_policy("budget-every-layer", depth, 4, CONFIG)
    assert (1 + CONFIG.ratio) ** depth <= load <= bound / CONFIG.requests


def test_rows_cover_every_policy_and_depth() -> None:
    """run() gives one row per policy and depth from 1 to depth."""
    rows = _layers.run(CONFIG, 3, 2)
    assert [(r.policy, r.depth) for r in rows] == [
        (p, d) for p in _layers.POLICIES for d in (1, 2, 3)
    ]


def test_deep_every_layer_simulates_fewer_requests() -> None:
    """Deep nesting simulates fewer top-level requests and still gives attempts**depth."""
    assert _layers.run_policy("every-layer", 5, 10, CONFIG) == 10**5


def test_every_layer_beyond_the_work_limit_is_refused() -> None:
    """Past WORK_LIMIT calls per request is a ConfigError, not a minutes-long run."""
    with pytest.raises(ConfigError, match="calls per request"):
        _layers.run_policy("every-layer", 6, 10, CONFIG)
