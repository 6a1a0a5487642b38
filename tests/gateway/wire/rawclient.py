"""Exact bytes to a server, its answers back as bytes: the wire tests' client.

``Connection.send(raw)`` writes ``raw`` as it is; ``answer()`` reads one HTTP/1.1
answer (framed by Content-Length, chunked, or the close), ``closed()`` whether the
server closed the connection. ``Processes`` starts the upstream and gateway
processes of a test module (module-scoped, so that eighty cases share two gateways).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from net_support import free_port, listening, stop_process, wait_started

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent.parent / "src"
UPSTREAM = HERE.parent / "upstream.py"


@dataclass
class Answer:
    """One answer: status, reason, headers (lower-case names), body, raw bytes."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    raw: bytes

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """A client socket to 127.0.0.1:port that sends exact bytes."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, raw: bytes) -> None:
        self.sock.sendall(raw)

    def _fill(self) -> bool:
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return False
        self.buffer += chunk
        return True

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if not self._fill():
                raise EOFError(f"closed inside a line: {self.buffer!r}")
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self._fill():
                raise EOFError(f"closed with {len(self.buffer)} of {n} bytes")
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def answer(self, *, head: bool = False) -> Answer:
        """Read one answer (``head``: the request was HEAD, so no body)."""
        start = len(self.buffer)
        status_line = self._line()
        _, status, *reason = status_line.split(b" ", 2)
        headers: list[tuple[bytes, bytes]] = []
        while line := self._line():
            name, _, value = line.partition(b":")
            headers.append((name.strip().lower(), value.strip()))
        names = dict(headers)
        code = int(status)
        body = b""
        if head or code in (204, 304) or code < 200:
            pass
        elif names.get(b"transfer-encoding", b"").lower() == b"chunked":
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    while self._line():
                        pass
                    break
                body += self._exactly(size)
                self._line()
        elif b"content-length" in names:
            body = self._exactly(int(names[b"content-length"]))
        else:
            while self._fill():
                pass
            body, self.buffer = self.buffer, b""
        del start
        return Answer(code, reason[0] if reason else b"", headers, body, status_line)

    def closed(self, within: float = 5.0) -> bool:
        """Whether the server closes the connection within ``within`` seconds
        (bytes it still sends are read and kept)."""
        self.sock.settimeout(within)
        try:
            while self._fill():
                pass
            return True
        except TimeoutError:
            return False
        except OSError:
            return True


def exchange(port: int, raw: bytes, *, head: bool = False) -> Answer:
    """Send ``raw`` on a new connection and read one answer."""
    with Connection(port) as conn:
        conn.send(raw)
        return conn.answer(head=head)


def rss_kib(pid: int) -> int:
    """The resident set size of process ``pid`` (KiB), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@dataclass
class Processes:
    """Upstream and gateway processes started for a test module."""

    tmp: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def upstream(self, name: str = "upstream") -> int:
        port = free_port()
        cmd = [sys.executable, str(UPSTREAM), str(port), name]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        wait_started(lambda: listening(port), proc, f"upstream {name}")
        return port

    def gateway(self, config: dict[str, Any], name: str) -> tuple[int, subprocess.Popen[bytes]]:
        http, admin = free_port(), free_port()
        config = {**config, "listen": {"http": f"127.0.0.1:{http}", "admin": f"127.0.0.1:{admin}"}}
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        log = self.tmp / f"{name}.log"
        cmd = [sys.executable, "-c", "from stormguard.cli import main; main()", "gateway"]
        cmd += ["--config", str(path)]
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        with log.open("ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env)
        self.procs.append(proc)
        wait_started(lambda: listening(http) and listening(admin), proc, "gateway", log=log)
        return http, proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())
