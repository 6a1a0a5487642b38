"""Server-side fixtures: uvicorn processes on free loopback ports."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from net_support import Serve, free_port, listening, wait_started

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"


@pytest.fixture
def uvicorn_app() -> Iterator[Serve]:
    """Start ``asgi_apps:<factory>`` under uvicorn; returns its base URL; stops it after."""
    procs: list[subprocess.Popen[bytes]] = []

    def serve(factory: str, **env: str) -> str:
        port = free_port()
        environ = {**os.environ, **env, "PYTHONPATH": f"{SRC}{os.pathsep}{HERE}"}
        cmd = [sys.executable, "-m", "uvicorn", f"asgi_apps:{factory}", "--factory"]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--no-proxy-headers"]
        cmd += ["--log-level", "warning", "--no-access-log"]
        proc = subprocess.Popen(cmd, env=environ, cwd=HERE)
        procs.append(proc)
        wait_started(lambda: listening(port), proc, f"uvicorn {factory}")
        return f"http://127.0.0.1:{port}"

    yield serve
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
