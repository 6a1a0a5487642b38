"""Gateway fixtures: upstream and gateway processes on free loopback ports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from local_gateway import LocalGateway, StepClock, start_local_gateway

from net_support import PortTaken, free_port, listening, stop_process, wait_started

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"

# The request chain's drivers (gateway/chain): every test that starts a gateway
# process runs once per driver, the process started with STORMGUARD_GATEWAY_DRIVER.
# The wire conformance suite runs on both in `make test`; the other gateway tests'
# second run (resume) is marked `driver2`, run by `make stress` (`make test-all`, CI).
DRIVERS = ("callback", "resume")
_STARTERS = frozenset({"gateway_factory", "start_gateway", "processes", "gateway_driver"})
_STARTING_MODULES = frozenset({"test_gateway_lifecycle"})  # they start processes themselves


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the tests that start a gateway over the chain's drivers."""
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if _STARTERS.isdisjoint(metafunc.fixturenames) and module not in _STARTING_MODULES:
        return
    if "gateway_driver" not in metafunc.fixturenames:
        metafunc.fixturenames.append("gateway_driver")
    wire = Path(metafunc.module.__file__ or "").parent.name == "wire"
    drivers = [
        pytest.param(d, marks=() if wire or d == DRIVERS[0] else pytest.mark.driver2, id=d)
        for d in DRIVERS
    ]
    metafunc.parametrize("gateway_driver", drivers, indirect=True, scope="module")


@pytest.fixture(scope="module")
def gateway_driver(request: pytest.FixtureRequest) -> Iterator[str]:
    """The chain driver the module's gateway processes run (their environment's
    STORMGUARD_GATEWAY_DRIVER)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STORMGUARD_GATEWAY_DRIVER", request.param)
        yield request.param


@dataclass
class Upstream:
    """A test upstream process (tests/gateway/upstream.py)."""

    port: int
    name: str
    proc: subprocess.Popen[bytes] | None = None
    tls: tuple[str, str] | None = None  # (cert file, key file): serve https

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start (or restart) on the same port."""
        cmd = [sys.executable, str(HERE / "upstream.py"), str(self.port), self.name]
        cmd += list(self.tls or ())
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_started(lambda: listening(self.port), self.proc, f"upstream {self.name}")

    def stop(self) -> None:
        """Kill the upstream (abruptly, as a crash would)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def release(self, key: str) -> None:
        """Let the requests held on ``/hold?key=KEY`` (and later ones) answer."""
        with urllib.request.urlopen(f"{self.url}/release?key={key}", timeout=5) as r:
            r.read()

    def seen(self) -> dict[str, int]:
        """Requests the upstream has seen, and those in flight."""
        with urllib.request.urlopen(f"{self.url}/count", timeout=5) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]


@dataclass
class Gateway:
    """A `stormguard gateway` process and its config file."""

    path: Path
    config: dict[str, Any]
    http_port: int
    admin_port: int
    workers: int = 1
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=Path)
    tls: bool = False  # the listener serves https / wss

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.http_port}"

    @property
    def ws_url(self) -> str:
        return f"{'wss' if self.tls else 'ws'}://127.0.0.1:{self.http_port}"

    def write(self, config: dict[str, Any] | str) -> None:
        """Rewrite the config file (a dict as YAML, or raw text)."""
        text = config if isinstance(config, str) else yaml.safe_dump(config)
        self.path.write_text(text)

    def start(self) -> None:
        """Start the gateway and wait for /healthz."""
        cmd = [sys.executable, "-c", "from stormguard.cli import main; main()", "gateway"]
        cmd += ["--config", str(self.path), "--workers", str(self.workers)]
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        wait_started(self.serving, self.proc, "gateway", log=self.log)

    def serving(self) -> bool:
        """The admin endpoint answers and the HTTP listener accepts."""
        return self.admin_ok() and listening(self.http_port)

    def admin_ok(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/healthz", timeout=1):
                return True
        except OSError:
            return False

    def status(self) -> dict[str, Any]:
        """The /status document."""
        url = f"http://127.0.0.1:{self.admin_port}/status"
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def admin(self, path: str) -> tuple[int, bytes]:
        """GET an admin path: (status, body)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.admin_port}{path}", timeout=5
            ) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def signal(self, sig: int) -> None:
        """Send a signal to the gateway process."""
        assert self.proc is not None
        self.proc.send_signal(sig)

    def output(self) -> str:
        """Everything the gateway wrote to stdout/stderr so far."""
        return self.log.read_text(errors="replace")

    def logged(self, *texts: str, within: float = 10.0) -> str:
        """The output once every one of ``texts`` is in it (the access log is written in
        batches by a thread, so a line may follow its answer by a moment); fails the
        test naming what is missing after ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            out = self.output()
            missing = [t for t in texts if t not in out]
            if not missing:
                return out
            if time.monotonic() > deadline:
                pytest.fail(f"not in the gateway's output within {within}s: {missing!r}")
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM and wait."""
        if self.proc is not None:
            stop_process(self.proc)


def base_config(
    upstreams: dict[str, Any], routes: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """A config dict with listen ports filled in later by the fixture."""
    return {"upstreams": upstreams, "routes": routes, **extra}


@pytest.fixture
def upstream_factory() -> Iterator[Callable[[str], Upstream]]:
    """Start upstream processes; all are stopped after the test."""
    started: list[Upstream] = []

    def make(name: str = "upstream", *, tls: tuple[str, str] | None = None) -> Upstream:
        up = Upstream(free_port(), name, tls=tls)
        up.start()
        started.append(up)
        return up

    yield make
    for up in started:
        up.stop()


@pytest.fixture
def gateway_factory(tmp_path: Path, gateway_driver: str) -> Iterator[Callable[..., Gateway]]:
    """Start gateway processes from config dicts; all are stopped after the test."""
    started: list[Gateway] = []

    def make(
        config: dict[str, Any],
        *,
        workers: int = 1,
        start: bool = True,
        tls: dict[str, Any] | None = None,
    ) -> Gateway:
        """``tls``: the listener's ``listen.http.tls`` settings (it serves https)."""
        given = dict(config)
        for tries_left in reversed(range(3)):
            n = len(started)
            http_port, admin_port = free_port(), free_port()
            config = dict(given)
            address = f"127.0.0.1:{http_port}"
            config.setdefault(
                "listen",
                {
                    "http": {"address": address, "tls": tls} if tls else address,
                    "admin": f"127.0.0.1:{admin_port}",
                },
            )
            config.setdefault("access_log", True)
            gw = Gateway(
                tmp_path / f"gateway{n}.yaml",
                config,
                http_port,
                admin_port,
                workers,
                log=tmp_path / f"gateway{n}.log",
                tls=tls is not None,
            )
            gw.write(config)
            started.append(gw)
            if not start:
                return gw
            try:
                gw.start()
                return gw
            except PortTaken:
                # another process took a "free" port between the probe and the bind;
                # only ports we chose can be chosen again
                if "listen" in given or not tries_left:
                    raise
        raise AssertionError("unreachable")

    yield make
    for gw in started:
        gw.stop()


@pytest.fixture
async def local_gateway() -> AsyncIterator[Callable[..., Awaitable[LocalGateway]]]:
    """Open gateways in the test's event loop, each on its own StepClock (or the
    ``clock`` given); all are closed after the test."""
    opened: list[LocalGateway] = []

    async def make(config: dict[str, Any], *, clock: StepClock | None = None) -> LocalGateway:
        gw = await start_local_gateway(config, clock if clock is not None else StepClock())
        opened.append(gw)
        return gw

    yield make
    for gw in opened:
        await gw.aclose()
