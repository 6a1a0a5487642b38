"""Redis processes the tests start themselves: with options (a slow one, one with a
password), and a Sentinel set (a master, a replica, three sentinels)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from net_support import POLL_INTERVAL, free_port

QUORUM = 2
SENTINELS = 3


def _ping(port: int, password: str | None = None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            if password:
                s.sendall(f"AUTH {password}\r\n".encode())
                s.recv(64)
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def command(port: int, *args: str, password: str | None = None, timeout: float = 5) -> bytes:
    """One command to 127.0.0.1:port (inline form); its raw reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        if password:
            s.sendall(f"AUTH {password}\r\n".encode())
            s.recv(64)
        s.sendall((" ".join(args) + "\r\n").encode())
        return s.recv(65536)


def _wait(probe: object, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout}s")
        time.sleep(POLL_INTERVAL)


@dataclass
class RedisProcess:
    """A redis-server on a free loopback port; ``extra`` options on its command line."""

    extra: tuple[str, ...] = ()
    password: str | None = None
    port: int = field(default_factory=free_port)
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="stormguard-redis-"))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        """Start (or restart on the same port) and wait for PING."""
        exe = shutil.which("redis-server")
        if exe is None:
            raise FileNotFoundError("redis-server")
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", self.workdir, "--loglevel", "warning"]
        args += ["--repl-diskless-sync-delay", "0"]  # a replica syncs at once (default 5 s)
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(
            [*args, *self.extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait(lambda: _ping(self.port, self.password), f"redis-server on {self.port} up")
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def discard(self) -> None:
        """Stop it and remove its directory."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class SentinelSet:
    """A master, one replica and three sentinels (quorum 2) watching master ``name``."""

    name: str = "stormguard"
    master: RedisProcess = field(default_factory=RedisProcess)
    replica: RedisProcess | None = None
    sentinels: list[tuple[int, subprocess.Popen[bytes]]] = field(default_factory=list)
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="stormguard-sentinel-"))

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port, _ in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.name}/0"

    def start(self) -> SentinelSet:
        """Start the master, the replica (and wait for its sync), then the sentinels."""
        exe = shutil.which("redis-sentinel")
        if exe is None:
            raise FileNotFoundError("redis-sentinel")
        self.master.start()
        self.replica = RedisProcess(extra=("--replicaof", "127.0.0.1", str(self.master.port)))
        self.replica.start()
        _wait(
            lambda: b"master_link_status:up" in command(self.replica.port, "INFO", "replication"),  # type: ignore[union-attr]
            "the replica in sync",
        )
        for i in range(SENTINELS):
            port = free_port()
            conf = Path(self.workdir) / f"sentinel-{i}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {self.name} 127.0.0.1 {self.master.port} {QUORUM}\n"
                f"sentinel down-after-milliseconds {self.name} 1000\n"
                f"sentinel failover-timeout {self.name} 5000\n"
                f"sentinel parallel-syncs {self.name} 1\n"
            )
            proc = subprocess.Popen(
                [exe, str(conf), "--loglevel", "warning"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.sentinels.append((port, proc))
        for port, _ in self.sentinels:
            _wait(lambda port=port: _ping(port), f"sentinel on {port} up")  # type: ignore[misc]
        _wait(self._watching, "the sentinels agreeing on the master")
        return self

    def _watching(self) -> bool:
        for port, _ in self.sentinels:
            reply = command(port, "SENTINEL", "get-master-addr-by-name", self.name)
            if str(self.master.port).encode() not in reply:
                return False
            info = command(port, "SENTINEL", "master", self.name)
            if b"num-other-sentinels\r\n$1\r\n2" not in info:
                return False
        return True

    def master_port(self) -> int:
        """The port the sentinels name as the master now."""
        reply = command(self.sentinels[0][0], "SENTINEL", "get-master-addr-by-name", self.name)
        return int(reply.split(b"\r\n")[4])

    def fail_over(self, timeout: float = 30) -> int:
        """Kill the master and wait until the sentinels name the replica; its port."""
        self.master.stop()
        return self.promoted(timeout)

    def promoted(self, timeout: float = 30) -> int:
        """Wait (after the master died) until the sentinels name another; its port."""
        old = self.master.port
        _wait(lambda: self.master_port() != old, "a failover", timeout)
        new = self.master_port()
        _wait(
            lambda: b"role:master" in command(new, "INFO", "replication"),
            "the promoted replica to be a master",
        )
        return new

    def discard(self) -> None:
        """Stop every process and remove the directories."""
        for _, proc in self.sentinels:
            if proc.poll() is None:
                proc.terminate()
        for _, proc in self.sentinels:
            proc.wait(timeout=10)
        for server in (self.master, self.replica):
            if server is not None:
                server.discard()
        shutil.rmtree(self.workdir, ignore_errors=True)
