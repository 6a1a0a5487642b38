"""A sample of bench/fuzz_scenarios.py in the suite: mutated scenario files load or
raise ScenarioError, nothing else (the bench script runs 10,000)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "fuzz_scenarios.py"


def fuzz_module() -> ModuleType:
    """bench/fuzz_scenarios.py, imported from its path."""
    spec = importlib.util.spec_from_file_location("fuzz_scenarios", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_scenarios", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [11, 12])
def test_mutated_scenarios_never_escape(tmp_path: Path, seed: int) -> None:
    """300 mutated YAML/TOML files: 0 exceptions other than ScenarioError."""
    counts = fuzz_module().run(300, seed, directory=tmp_path)
    assert counts.escaped == 0, "\n".join(counts.samples)
    assert counts.files == 300
    assert counts.refused > 0
