"""`stormguard mock --scenario FILE --host --port` as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from net_support import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "payments.yaml"


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
    except httpx.TransportError:
        return False
    return True


def test_cli_serves_the_example_and_writes_the_journal(
    tmp_path: Path, eventually: Callable[..., Any]
) -> None:
    """The CLI serves a scenario file, answers the admin API and stops on SIGTERM."""
    port = free_port()
    journal_out = tmp_path / "journal.json"
    command = [
        sys.executable, "-c", "from stormguard.cli import main; main()",
        "mock", "--scenario", str(EXAMPLE), "--host", "127.0.0.1", "--port", str(port),
        "--journal-out", str(journal_out),
    ]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=os.environ)
    try:
        base = f"http://127.0.0.1:{port}"
        eventually(lambda: _answers(base + "/__mock/ledger"))
        headers = {"Idempotency-Key": "k1"}
        try:
            httpx.post(base + "/v1/payments", json={"amount": 5}, headers=headers)
        except httpx.TransportError:
            pass  # commit-then-reset: the first answer is lost by design
        assert httpx.get(base + "/__mock/ledger").json() == {"payments": {"k1": 1}}
        assert httpx.get(base + "/__mock/check").json()["ok"] is True
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr
    assert "serving flaky payments API on http://127.0.0.1:" in stderr
    assert "POST /v1/payments client=127.0.0.1 key=k1 -> no answer (commit-then-reset)" in stderr
    (entry,) = json.loads(journal_out.read_text())
    assert entry["outcome"] == "commit-then-reset"
