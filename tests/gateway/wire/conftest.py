"""The wire suite's fixtures: one gateway process per module (starting one per case
would cost more than the cases), configured by the module's ``gateway_config``."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from net_support import free_port, listening, wait_started

SRC = Path(__file__).resolve().parents[3] / "src"


@dataclass
class WireGateway:
    """A gateway process: its ports and its output file."""

    http_port: int
    admin_port: int
    log: Path
    proc: subprocess.Popen[bytes]

    def admin(self, path: str) -> bytes:
        """GET an admin path's body."""
        url = f"http://127.0.0.1:{self.admin_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as r:
            return bytes(r.read())

    def output(self) -> str:
        """Everything the gateway wrote so far."""
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _admin_ok(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def start_gateway(
    tmp_path_factory: pytest.TempPathFactory, gateway_driver: str
) -> Iterator[Callable[[dict[str, Any]], WireGateway]]:
    """Start gateway processes from config dicts, on the chain driver
    ``gateway_driver`` (tests/gateway/conftest.py); all stop with the module."""
    started: list[WireGateway] = []

    def start(config: dict[str, Any]) -> WireGateway:
        directory = tmp_path_factory.mktemp("wire")
        http_port, admin_port = free_port(), free_port()
        config = {
            "listen": {"http": f"127.0.0.1:{http_port}", "admin": f"127.0.0.1:{admin_port}"},
            "access_log": True,
            **config,
        }
        path = directory / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        log = directory / "gateway.log"
        cmd = [sys.executable, "-c", "from stormguard.cli import main; main()", "gateway"]
        cmd += ["--config", str(path), "--workers", "1"]
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        with log.open("ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env)
        gw = WireGateway(http_port, admin_port, log, proc)
        started.append(gw)
        wait_started(
            lambda: _admin_ok(admin_port) and listening(http_port), proc, "gateway", log=log
        )
        return gw

    yield start
    for gw in started:
        gw.stop()
