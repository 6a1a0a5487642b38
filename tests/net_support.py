"""Loopback helpers shared by the tests that start real servers."""

from __future__ import annotations

import asyncio
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


# The ports free_port() handed out in this process: the kernel may give the same
# port to two bind(0) calls in a row once the first socket is closed, and two
# listeners of one test (a gateway's http and admin) must not be given one port.
_GIVEN: set[int] = set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (nothing listens on it now), never one this
    process was given before."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise RuntimeError("no fresh free port in 100 tries")


# The sockets refused_port() holds open for the rest of the run.
_REFUSING: list[socket.socket] = []


def refused_port() -> int:
    """A port on 127.0.0.1 that refuses connections for the rest of the test run.

    Its socket is bound, never listens and stays open, so a connect is refused and
    no other server of the run (another test, another xdist worker) can bind it.
    A port probed free and closed can be taken between the probe and the connect,
    and a test of the connect-error path then reaches somebody else's server.
    """
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _REFUSING.append(s)
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
            _not_started(proc, what, log)
        time.sleep(POLL_INTERVAL)


async def await_started(
    probe: Callable[[], bool],
    proc: subprocess.Popen[bytes],
    what: str,
    within: float = 20,
    *,
    log: Path | None = None,
) -> None:
    """:func:`wait_started` for a test whose event loop must keep running (it
    polls with ``asyncio.sleep``)."""
    deadline = time.monotonic() + within
    while not probe():
        if proc.poll() is not None or time.monotonic() > deadline:
            _not_started(proc, what, log)
        await asyncio.sleep(POLL_INTERVAL)


def _not_started(proc: subprocess.Popen[bytes], what: str, log: Path | None) -> None:
    # Raise PortTaken for an exit on a taken port; fail the test otherwise.
    output = log.read_text(errors="replace")[-2000:] if log is not None else ""
    if proc.poll() is not None and "address already in use" in output.lower():
        raise PortTaken(what)
    pytest.fail(f"{what} did not start (exit {proc.poll()})\n{output}")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process the test started: SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
