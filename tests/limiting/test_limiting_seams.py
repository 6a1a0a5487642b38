"""The limiter's seams: its own package, a hot path the store picks, one error type."""

from __future__ import annotations

import ast
import inspect

import pytest

import stormguard
from stormguard import GCRA, AsyncRateLimiter, ConfigError, FixedWindow, RateLimiter, TokenBucket
from stormguard.core._decision import combine
from stormguard.stores import MemoryStore, _memory_fast


def test_limiters_live_in_the_limiting_package() -> None:
    """stormguard.RateLimiter and AsyncRateLimiter are stormguard.limiting's classes."""
    from stormguard import limiting

    assert stormguard.RateLimiter is limiting.RateLimiter
    assert stormguard.AsyncRateLimiter is limiting.AsyncRateLimiter
    assert RateLimiter.__module__.startswith("stormguard.limiting")


@pytest.mark.parametrize("algorithm", [GCRA(5, 5), TokenBucket(5, 5), FixedWindow(5, 60)])
@pytest.mark.parametrize("cls", [RateLimiter, AsyncRateLimiter])
def test_a_limiter_keeps_no_per_instance_hit(algorithm: object, cls: type) -> None:
    """The hot path is chosen by the store at construction, not patched into the limiter."""
    limiter = cls(algorithm, MemoryStore())
    assert not hasattr(limiter, "__dict__")
    assert type(limiter).hit is cls.hit


def test_memory_store_has_no_dead_decide_one() -> None:
    """MemoryStore's unused single-limit path is gone (hitter is the one hot path)."""
    assert not hasattr(MemoryStore, "decide_one")


def test_inlined_paths_read_no_private_attribute() -> None:
    """stores/_memory_fast.py works on what the store hands it, never on `obj._private`."""
    tree = ast.parse(inspect.getsource(_memory_fast))
    private = [
        f"{ast.unparse(node.value)}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]
    assert private == []


def test_combining_no_decision_is_a_config_error() -> None:
    """combine() of nothing raises ConfigError (core's one error convention)."""
    with pytest.raises(ConfigError, match="parts"):
        combine([])
