"""`stormguard ratelimit-service` processes on free ports, called with a real grpcio client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from net_support import PortTaken, free_port, listening, wait_started
from rls_support import METHOD, Request, Response

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"


@dataclass
class Service:
    """A `stormguard ratelimit-service` process, its config files and a gRPC client."""

    configs: list[Path]
    grpc_port: int
    admin_port: int
    flags: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    channel: grpc.Channel | None = None
    _call: Any = field(default=None, repr=False)

    def start(self) -> None:
        """Start the service; wait until gRPC and the admin listener answer."""
        cmd = [sys.executable, "-c", "from stormguard.cli import main; main()"]
        cmd += ["ratelimit-service", *(f"--config={p}" for p in self.configs)]
        cmd += [f"--listen=127.0.0.1:{self.grpc_port}", f"--admin=127.0.0.1:{self.admin_port}"]
        cmd += self.flags
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        wait_started(self.serving, self.proc, "ratelimit-service", log=self.log)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self._call = self.channel.unary_unary(
            METHOD,
            request_serializer=Request.SerializeToString,
            response_deserializer=Response.FromString,
        )

    def serving(self) -> bool:
        """The admin listener answers /readyz and the gRPC port accepts."""
        return self.admin("/readyz")[0] == 200 and listening(self.grpc_port)

    def call(self, request: Any, timeout: float = 10.0) -> Any:
        """ShouldRateLimit(request) -> RateLimitResponse (grpc.RpcError on an error)."""
        return self._call(request, timeout=timeout)

    def future(self, request: Any, timeout: float = 30.0) -> Any:
        """The call started, not awaited: a grpc.Future."""
        return self._call.future(request, timeout=timeout)

    def status(self) -> dict[str, Any]:
        """The /status document."""
        code, body = self.admin("/status")
        assert code == 200, body
        return json.loads(body)  # type: ignore[no-any-return]

    def admin(self, path: str) -> tuple[int, bytes]:
        """GET an admin path: (status, body); (0, b"") when nothing answers."""
        try:
            url = f"http://127.0.0.1:{self.admin_port}{path}"
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 0, b""

    def signal(self, sig: int) -> None:
        """Send a signal to the service process."""
        assert self.proc is not None
        self.proc.send_signal(sig)

    def output(self) -> str:
        """Everything the process wrote so far."""
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM and wait (kill after 20 s)."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


ServiceFactory = Callable[..., Service]


def factory(directory: Path, started: list[Service]) -> ServiceFactory:
    def make(*configs: str, flags: tuple[str, ...] = (), start: bool = True) -> Service:
        n = len(started)
        paths = []
        for i, text in enumerate(configs):
            path = directory / f"service{n}-{i}.yaml"
            path.write_text(text)
            paths.append(path)
        for tries_left in reversed(range(3)):
            service = Service(
                paths, free_port(), free_port(), list(flags), directory / f"service{n}.log"
            )
            started.append(service)
            if not start:
                return service
            try:
                service.start()
                return service
            except PortTaken:
                if not tries_left:  # another process took a "free" port first
                    raise
        raise AssertionError("unreachable")

    return make
