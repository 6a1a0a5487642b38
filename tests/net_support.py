"""Loopback helpers shared by the tests that start real servers."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pytest

# A fixture that starts a server (an app factory, plus environment) and returns its base URL.
Serve = Callable[..., str]


class RedisLike(Protocol):
    """The interface of a Redis the test owns (``owned_redis``) that outage tests use."""

    url: str

    def stop(self) -> None: ...
    def start(self) -> None: ...


# How often a test polls a server it started (never a backoff wait).
POLL_INTERVAL = 0.02


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (nothing listens on it now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class PortTaken(Exception):
    """The process could not bind: another process took the free port first."""


def wait_started(
    probe: Callable[[], bool],
    proc: subprocess.Popen[bytes],
    what: str,
    timeout: float = 20,
    *,
    log: Path | None = None,
) -> None:
    """Poll ``probe`` until it is true; fail the test if ``proc`` exits or time runs out.

    With ``log`` (the process's output file) the failure quotes its tail, and a
    process that exited because its port was taken raises :class:`PortTaken`, so
    the caller can start it again on fresh ports.
    """
    deadline = time.monotonic() + timeout
    while not probe():
        if proc.poll() is not None or time.monotonic() > deadline:
            output = log.read_text(errors="replace")[-2000:] if log is not None else ""
            if proc.poll() is not None and "address already in use" in output.lower():
                raise PortTaken(what)
            pytest.fail(f"{what} did not start (exit {proc.poll()})\n{output}")
        time.sleep(POLL_INTERVAL)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process the test started: SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
