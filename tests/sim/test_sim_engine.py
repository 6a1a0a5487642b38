"""Seeding and progress helpers of the simulator."""

from __future__ import annotations

import pytest

from stormguard.sim import _engine


def test_py_rng_is_stable_per_seed_and_keys() -> None:
    """The same seed and keys give the same stream; other keys give another one."""
    a = [_engine.py_rng(1, "storm", "full").random() for _ in range(2)]
    b = _engine.py_rng(1, "storm", "immediate").random()
    assert a[0] == a[1]
    assert a[0] != b
    assert _engine.seed_words(1, "x") == _engine.seed_words(1, "x")


def test_progress_bar_ticks_to_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    """An enabled progress bar draws with rich on stderr and accepts fractional ticks."""
    with _engine.progress("occ", 1.0, enabled=True) as tick:
        tick(0.25)
        tick(0.75)
    assert "occ" in capsys.readouterr().err


def test_progress_is_silent_when_disabled(capsys: pytest.CaptureFixture[str]) -> None:
    """A disabled progress bar prints nothing."""
    with _engine.progress("occ", 3, enabled=False) as tick:
        tick()
    assert capsys.readouterr() == ("", "")
