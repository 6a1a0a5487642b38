"""Shared fixtures: a fake clock, a seeded RNG, and a real Redis server.

Redis: ``REDIS_URL`` when set; otherwise the session starts ``redis-server`` on a
free port in a temporary directory; otherwise Redis tests skip — unless
``STORMGUARD_REQUIRE_REDIS=1``, which makes a missing Redis fail the run.

Redis Cluster (``redis_cluster`` / ``redis_cluster_url``): ``REDIS_CLUSTER_URL``
(``redis+cluster://host:port``) when set; otherwise the session starts three
``redis-server --cluster-enabled yes`` on free loopback ports whose bus ports
(+10000) are free too, joins them with ``redis-cli --cluster create`` (no
replicas) and waits for ``cluster_state:ok``; same skip/fail rule as above.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import pytest

from net_support import free_port
from stormguard.testing import FakeClock

T = TypeVar("T")


@pytest.fixture(autouse=True)
def _fresh_process_guards() -> Iterator[None]:
    """Each test starts with no process-wide per-origin breakers, budgets or cooldowns."""
    from stormguard.protection import reset_process_guards

    reset_process_guards()
    yield
    reset_process_guards()


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock starting at t=1000 (monotonic)."""
    return FakeClock(1000.0)


@pytest.fixture
def rng() -> random.Random:
    """A seeded random generator."""
    return random.Random(1234)


# How often tests poll a real server for a state change (never a backoff wait).
POLL_INTERVAL = 0.02


class Eventually:
    """Poll ``probe`` until it returns something truthy; fail the test after ``timeout``."""

    def __call__(self, probe: Callable[[], T], *, timeout: float = 10.0) -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"condition not reached within {timeout}s (last value: {value!r})")
            time.sleep(POLL_INTERVAL)


@pytest.fixture
def eventually() -> Eventually:
    """Wait for a real server (mock, Redis, subprocess) to reach a state, by polling."""
    return Eventually()


def _ping(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class RedisServer:
    """A Redis server the tests may use; ``process`` is set when the session owns it."""

    url: str
    host: str
    port: int
    process: subprocess.Popen[bytes] | None = None
    workdir: str | None = None

    def stop(self) -> None:
        """Stop the server (only one this session started)."""
        if self.process is None:
            raise RuntimeError("this Redis was not started by the tests")
        self.process.terminate()
        self.process.wait(timeout=10)

    def discard(self) -> None:
        """Stop the server if this session owns it and remove its directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def start(self) -> None:
        """(Re)start the server this session owns, on the same port."""
        assert self.workdir is not None
        self.process = _spawn_redis(self.port, self.workdir)


def _redis_process(exe: str, port: int, workdir: str, *extra: str) -> subprocess.Popen[bytes]:
    """A loopback redis-server without persistence, in the foreground."""
    return subprocess.Popen(
        [
            *(exe, "--port", str(port), "--bind", "127.0.0.1", *extra, "--save", ""),
            *("--appendonly", "no", "--dir", workdir, "--daemonize", "no", "--loglevel", "warning"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _spawn_redis(port: int, workdir: str) -> subprocess.Popen[bytes]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise FileNotFoundError("redis-server")
    proc = _redis_process(exe, port, workdir)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _ping("127.0.0.1", port):
            return proc
        time.sleep(POLL_INTERVAL)
    proc.kill()
    raise RuntimeError(f"redis-server did not start on port {port}")


def _unavailable(reason: str) -> None:
    if os.environ.get("STORMGUARD_REQUIRE_REDIS") == "1":
        pytest.fail(f"Redis is required (STORMGUARD_REQUIRE_REDIS=1) but {reason}")
    pytest.skip(f"no Redis: {reason}")


def _from_env(variable: str) -> tuple[str, str, int] | None:
    """``(url, host, port)`` of the server named by an environment variable, if set."""
    url = os.environ.get(variable)
    if not url:
        return None
    from urllib.parse import urlparse

    parsed = urlparse(url)
    return url, parsed.hostname or "127.0.0.1", parsed.port or 6379


Owned = TypeVar("Owned", "RedisServer", "RedisCluster")


@contextmanager
def _owned(start: Callable[[], Owned], what: str) -> Iterator[Owned]:
    """A server this session starts (skip, or fail, when it cannot) and discards after."""
    try:
        server = start()
    except (FileNotFoundError, RuntimeError, subprocess.SubprocessError) as exc:
        _unavailable(f"could not start {what} ({exc})")
        raise  # unreachable: _unavailable raises
    try:
        yield server
    finally:
        server.discard()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """The shared Redis server: REDIS_URL, else one started for the session."""
    env = _from_env("REDIS_URL")
    if env:
        url, host, port = env
        if not _ping(host, port, timeout=2):
            _unavailable(f"REDIS_URL={url} does not answer PING")
        yield RedisServer(url=url, host=host, port=port)
        return
    with _owned(_start_redis, "redis-server") as server:
        yield server


def _start_redis() -> RedisServer:
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="stormguard-redis-")
    try:
        proc = _spawn_redis(port, workdir)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return RedisServer(
        url=f"redis://127.0.0.1:{port}/0",
        host="127.0.0.1",
        port=port,
        process=proc,
        workdir=workdir,
    )


@pytest.fixture
def owned_redis() -> Iterator[RedisServer]:
    """A private redis-server that the test may stop and restart (outage tests)."""
    with _owned(_start_redis, "redis-server") as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the shared Redis server."""
    return redis_server.url


@pytest.fixture
def key_prefix() -> str:
    """A unique key prefix so tests sharing one Redis never collide."""
    return f"sgtest:{uuid.uuid4().hex[:12]}:"


# -- Redis Cluster -------------------------------------------------------------

CLUSTER_NODES = 3
_BUS_OFFSET = 10_000  # Redis Cluster's bus port is the client port + 10000


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_ports(count: int) -> list[int]:
    """``count`` free ports whose cluster bus ports are free too."""
    rng = random.Random()
    ports: list[int] = []
    for _ in range(2000):
        port = rng.randrange(20_000, 55_000 - _BUS_OFFSET)
        if port in ports or port + _BUS_OFFSET in ports:
            continue
        if _port_is_free(port) and _port_is_free(port + _BUS_OFFSET):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError("no free port pairs for a Redis Cluster")


def _cluster_info(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"CLUSTER INFO\r\n")
            data = b""
            while b"cluster_state" not in data or not data.endswith(b"\r\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data.decode("utf-8", "replace")
    except OSError:
        return ""


def _wait_until(probe: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Redis Cluster nodes did not {what} within {timeout}s")
        time.sleep(POLL_INTERVAL)


@dataclass
class RedisCluster:
    """A Redis Cluster the tests may use; ``processes`` is set when the session owns it."""

    url: str
    nodes: list[tuple[str, int]]
    processes: list[subprocess.Popen[bytes]] | None = None
    workdir: str | None = None

    def discard(self) -> None:
        """Stop the nodes this session started and remove their directory."""
        for proc in self.processes or ():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes or ():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _start_cluster() -> RedisCluster:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise FileNotFoundError("redis-server" if server is None else "redis-cli")
    workdir = tempfile.mkdtemp(prefix="stormguard-cluster-")
    cluster = RedisCluster(url="", nodes=[], processes=[], workdir=workdir)
    try:
        ports = _cluster_ports(CLUSTER_NODES)
        for port in ports:
            node_dir = os.path.join(workdir, str(port))
            os.mkdir(node_dir)
            assert cluster.processes is not None
            cluster.processes.append(
                _redis_process(
                    server,
                    port,
                    node_dir,
                    *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                    *("--cluster-node-timeout", "5000"),
                )
            )
        cluster.nodes = [("127.0.0.1", port) for port in ports]
        _wait_until(lambda: all(_ping("127.0.0.1", port) for port in ports), 10, "start")
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )
        _wait_until(
            lambda: all("cluster_state:ok" in _cluster_info(port) for port in ports), 30, "join"
        )
    except BaseException:
        cluster.discard()
        raise
    cluster.url = f"redis+cluster://127.0.0.1:{ports[0]}"
    return cluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A three-node Redis Cluster: REDIS_CLUSTER_URL, else one started for the session."""
    env = _from_env("REDIS_CLUSTER_URL")
    if env:
        url, host, port = env
        if "cluster_state:ok" not in _cluster_info(port):
            _unavailable(f"REDIS_CLUSTER_URL={url} is not a healthy cluster")
        yield RedisCluster(url=url, nodes=[(host, port)])
        return
    with _owned(_start_cluster, "a Redis Cluster") as cluster:
        yield cluster


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisCluster) -> str:
    """URL of the shared Redis Cluster (``redis+cluster://127.0.0.1:PORT``)."""
    return redis_cluster.url


# -- Redis Sentinel ------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[object]:
    """A Sentinel set for the session (tests/redis_support.py): a master, a replica
    and three sentinels; ``.url`` is its ``redis+sentinel://`` URL. Skips (or fails,
    with STORMGUARD_REQUIRE_REDIS=1) when redis-sentinel is missing."""
    from redis_support import SentinelSet

    with _owned(lambda: SentinelSet().start(), "a Redis Sentinel set") as sentinel:  # type: ignore[type-var]
        yield sentinel


@pytest.fixture
def owned_sentinel() -> Iterator[object]:
    """A Sentinel set of this test's own, which it may fail over (outage tests)."""
    from redis_support import SentinelSet

    with _owned(lambda: SentinelSet().start(), "a Redis Sentinel set") as sentinel:  # type: ignore[type-var]
        yield sentinel
