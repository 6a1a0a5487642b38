"""The stormguard logger is quiet unless the application configures logging."""

from __future__ import annotations

import logging
import subprocess
import sys

import stormguard

BREAKER_OPENS = """
import stormguard
breaker = stormguard.CircuitBreaker(min_calls=1, failure_rate=0.5)
breaker.acquire().record(failure=True)
assert breaker.state == "open"
"""


def test_a_breaker_opening_prints_nothing_when_logging_is_not_configured() -> None:
    """With logging unconfigured, a breaker transition writes nothing to stderr."""
    done = subprocess.run(
        [sys.executable, "-c", BREAKER_OPENS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_the_stormguard_logger_has_a_null_handler() -> None:
    """The library's logger carries a NullHandler (and records still propagate)."""
    logger = logging.getLogger("stormguard")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert logger.propagate and stormguard.__name__ == "stormguard"
