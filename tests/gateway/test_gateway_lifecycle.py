"""Start, reload and stop: bad configs never run, reloads swap atomically, SIGTERM drains."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

Factory = Callable[..., Any]


def test_bad_config_never_starts(tmp_path: Path) -> None:
    """A config with errors exits 1 with every error, and never listens."""
    path = tmp_path / "gw.yaml"
    path.write_text("routes:\n  - path: /\n    upstream: nowhere\n")
    cmd = [sys.executable, "-c", "from stormguard.cli import main; main()", "gateway"]
    proc = subprocess.run([*cmd, "--config", str(path)], capture_output=True, timeout=60)
    assert proc.returncode == 1
    assert f"{path}:3:5: routes.0.upstream: unknown upstream 'nowhere'" in proc.stderr.decode()


def _two_routes(a: Any, b: Any, *, with_b: bool) -> dict[str, Any]:
    routes = [{"path": "/echo", "upstream": "a"}]
    if with_b:
        routes.append({"path": "/echo/b", "upstream": "b"})
    return {"upstreams": {"a": {"url": a.url}, "b": {"url": b.url}}, "routes": routes}


def test_reload_on_change_and_sighup(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """A changed file is applied; a broken one is refused and the running config stays."""
    a, b = upstream_factory("a"), upstream_factory("b")
    gw = gateway_factory(_two_routes(a, b, with_b=False))
    assert httpx.get(f"{gw.url}/echo/b").json()["name"] == "a"
    gw.write({**_two_routes(a, b, with_b=True), "listen": gw.config["listen"]})
    eventually(lambda: httpx.get(f"{gw.url}/echo/b").json()["name"] == "b")
    gw.write("routes: [oops\n")
    gw.signal(signal.SIGHUP)
    eventually(lambda: gw.output().count("reload of") >= 1)
    assert "keeping the running configuration" in gw.output()
    assert httpx.get(f"{gw.url}/echo/b").json()["name"] == "b"
    assert gw.proc.poll() is None


def test_sigterm_drains_requests_and_closes_websockets_1001(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """SIGTERM: a request in flight completes, WebSockets get 1001, the process exits 0."""
    up = upstream_factory()
    gw = gateway_factory(
        {
            "upstreams": {"a": {"url": up.url}},
            "routes": [
                {"path": "/ws", "upstream": "a", "websocket": {}},
                {"path": "/", "upstream": "a"},
            ],
            "drain": 10,
        }
    )
    answers: list[int] = []
    slow = threading.Thread(
        target=lambda: answers.append(httpx.get(f"{gw.url}/hold?key=t", timeout=20).status_code)
    )

    async def websocket_close_code() -> int | None:
        async with websockets.connect(f"{gw.ws_url}/ws") as ws:
            await ws.send("ping")
            await ws.recv()
            slow.start()
            eventually(lambda: up.seen()["in_flight"] == 1)
            gw.signal(signal.SIGTERM)
            with pytest.raises(websockets.ConnectionClosed) as info:
                await ws.recv()
            return info.value.rcvd.code if info.value.rcvd else None

    assert asyncio.run(websocket_close_code()) == 1001
    assert gw.proc.poll() is None and not answers  # draining: the request is still held
    up.release("t")
    slow.join()
    assert answers == [200]
    assert gw.proc.wait(timeout=30) == 0
