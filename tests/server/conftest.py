"""Server-side fixtures: uvicorn processes on free loopback ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


Serve = Callable[..., str]


class RedisLike(Protocol):
    """The session Redis fixture's interface that outage tests use."""

    url: str

    def stop(self) -> None: ...
    def start(self) -> None: ...


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
        deadline = time.monotonic() + 20
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"uvicorn {factory} did not start (exit {proc.poll()})")
            time.sleep(0.02)
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
