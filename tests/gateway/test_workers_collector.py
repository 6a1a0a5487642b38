"""The workers' metrics merged for /status and /metrics (gateway and rate-limit
service with --workers N): a file a starting worker has not sized yet is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from stormguard.gateway._metrics import WorkersCollector

WORKER = """
from prometheus_client import Counter
Counter("sg_test_answers", "answers", ["code"]).labels("ok").inc(7)
"""


def _values(registry: CollectorRegistry, name: str) -> list[float]:
    return [s.value for m in registry.collect() for s in m.samples if s.name == name]


def test_an_empty_file_of_a_starting_worker_is_skipped(tmp_path: Path) -> None:
    """A worker wrote 7; another has created its file but not sized it (0 bytes): the
    merge reads the 7 and does not fail on the empty file."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", WORKER], env=env, check=True)
    assert any(p.stat().st_size > 0 for p in tmp_path.glob("*.db"))
    (tmp_path / "counter_999999.db").touch()  # created, not yet sized
    registry = CollectorRegistry()
    registry.register(WorkersCollector(str(tmp_path)))
    assert _values(registry, "sg_test_answers_total") == [7.0]


def test_no_files_is_no_metrics(tmp_path: Path) -> None:
    """Before any worker recorded anything: nothing, and no error."""
    registry = CollectorRegistry()
    registry.register(WorkersCollector(str(tmp_path)))
    assert list(registry.collect()) == []
