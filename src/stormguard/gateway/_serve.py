# Running the gateway: its own listeners (http/) on one event loop, signals, reload,
# workers.
#
# One process (--workers 1): the proxy server and the admin server share a loop;
# /status and /metrics read the process's own registry.
# N processes: the supervisor binds `listen.http` once, forks N workers that serve
# that socket (the kernel spreads connections), and serves the admin listener
# itself from prometheus-client's multiprocess files; it forwards SIGHUP/SIGTERM
# to the workers and restarts a worker that dies. Shared state (limits, breakers,
# budgets) is in the store, which `gateway check` insists is Redis for N > 1.
#
# Reload (SIGHUP, or the file's mtime changing): validate the whole file, then swap
# the runtime in one assignment; an invalid file keeps the running configuration
# and logs every error line. Shutdown (SIGTERM/SIGINT): stop accepting, close
# WebSockets with 1001, let requests in flight finish for `drain` seconds.
#
# `open_gateway` is the one place the proxy and admin listeners are assembled; the
# process serves what it opens, and the tests open the same gateway inside their own
# event loop with a FakeClock (`clock=`: the runtime's one clock, see _runtime.py),
# so scenarios that span seconds run in virtual time without a hook in the process.
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import ssl as ssl_module
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._clock import Clock
from ._accesslog import mark_default_handlers
from ._config import GatewayConfig, GatewayConfigError, load_config, split_hostport
from .http._server import HTTPServer, start_server

if TYPE_CHECKING:
    from ._app import AdminApp, Gateway

__all__ = ["OpenGateway", "open_gateway", "run"]

log = logging.getLogger("stormguard.gateway")


def _facts(config: GatewayConfig) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, up in config.upstreams.items():
        h = up.bulkhead
        out[name] = {
            "targets": up.all_targets,
            "bulkhead_limit": h.limit if h else None,
            "bulkhead_per_client": h.per_client if h else None,
            **({"overload": _overload_facts(up)} if up.overloaded else {}),
            # route name -> protocol, for the dashboard's per-upstream panels
            "routes": {
                r.name: "grpc" if r.grpc else "websocket" if r.websocket else "http"
                for r in config.routes
                if r.upstream == name
            },
        }
    return out


def _overload_facts(up: Any) -> dict[str, Any]:
    # /status "overload" of an upstream: what is configured; "limit" and "waiting"
    # are filled in from the gauges (summed over workers).
    line = up.overload
    return {
        "adaptive": up.adaptive is not None,
        "admission": up.admission is not None,
        "max_wait": line.max_wait if line is not None else 0.05,
        "limit": None,
        "waiting": 0,
    }


def _listener(config: GatewayConfig) -> dict[str, Any]:
    # /status "listener": the proxy listener as clients reach it.
    tls = config.listen.http_tls
    return {
        "url": f"{config.listen.http_scheme}://{config.listen.http}",
        "tls": tls is not None,
        "client_certificates": "required" if tls is not None and tls.client_ca else "none",
    }


async def _server(
    app: Any,
    config: GatewayConfig,
    *,
    admin: bool,
    sock: socket.socket | None = None,
) -> HTTPServer:
    """The listener serving ``app`` on ``listen.http`` (or ``sock``) or ``listen.admin``;
    the proxy listener with TLS when ``listen.http`` has ``tls``."""
    listen = config.listen.admin if admin else config.listen.http
    assert listen is not None
    host, port = split_hostport(listen)
    max_ws = max((r.websocket.max_message for r in config.routes if r.websocket), default=1 << 20)
    return await start_server(
        app,
        host=host,
        port=port,
        sock=sock,
        ssl=None if admin else _ssl_context(config),
        header_timeout=config.header_timeout,
        keep_alive_timeout=5.0,
        max_header_bytes=config.max_header_bytes,
        max_headers=config.max_headers,
        max_target_bytes=config.max_target_bytes,
        websocket_max_size=None if admin else max_ws + 1024,
    )


def _ssl_context(config: GatewayConfig) -> ssl_module.SSLContext | None:
    # listen.http's tls (client_ca makes a client certificate required: _tls.py).
    tls = config.listen.http_tls
    if tls is None:
        return None
    from ._tls import server_context

    return server_context(tls)


class _Watcher:
    """Reloads the configuration on SIGHUP and when the file changes."""

    def __init__(self, path: Path, gateway: Any, admin: Any | None) -> None:
        self.path = path
        self.gateway = gateway
        self.admin = admin
        self.mtime = self._mtime()

    def _mtime(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return 0.0

    def reload(self) -> bool:
        """Validate and swap; on error keep the running config and log why."""
        self.mtime = self._mtime()
        try:
            config = load_config(self.path)
        except GatewayConfigError as exc:
            log.error(
                "reload of %s refused; keeping the running configuration:\n%s", self.path, exc
            )
            return False
        self.gateway.swap(config)
        if self.admin is not None:
            self.admin.status.upstreams = _facts(config)
        log.warning("reloaded %s", self.path)
        return True

    async def poll(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            if self._mtime() != self.mtime:
                self.reload()


@dataclass(slots=True)
class OpenGateway:
    """A gateway with its listeners open: the proxy's, and the admin app's (if any)."""

    gateway: Gateway
    servers: list[HTTPServer]
    admin: AdminApp | None = None
    stopped: bool = field(default=False)

    async def drain(self, seconds: float) -> None:
        """Stop accepting; let requests in flight finish for at most ``seconds``."""
        await asyncio.gather(*(s.drain(seconds) for s in self.servers))

    async def close(self) -> None:
        """Stop the history sampler, then the gateway (WebSockets, pools, the store)."""
        if self.stopped:
            return
        self.stopped = True
        if self.admin is not None:
            self.admin.stop()
        await self.gateway.stop()  # (an ASGI server's lifespan shutdown)


async def open_gateway(
    config: GatewayConfig,
    *,
    workers: int = 1,
    sock: socket.socket | None = None,
    with_admin: bool = True,
    clock: Clock | None = None,
) -> OpenGateway:
    """Build the gateway of ``config`` on the running loop and open its listeners
    (``listen.http``, or ``sock``; ``listen.admin`` when ``with_admin``). ``clock``:
    the gateway's one clock (default: the system clock; tests pass a FakeClock)."""
    from ._app import AdminApp, Gateway
    from ._metrics import StatusBuilder

    gateway = Gateway(config, workers=workers, clock=clock)
    await gateway.start()  # (what an ASGI server's lifespan startup would call)
    opened = OpenGateway(gateway, [])
    try:
        opened.servers.append(await _server(gateway, config, admin=False, sock=sock))
        if with_admin and config.listen.admin:
            status = StatusBuilder(gateway.metrics, _facts(config), _listener(config))
            opened.admin = AdminApp(status, lambda: gateway.ready)
            opened.servers.append(await _server(opened.admin, config, admin=True))
            opened.admin.start()  # the history sampler
    except BaseException:
        await opened.drain(0.0)
        await opened.close()
        raise
    return opened


async def _serve(
    path: Path, config: GatewayConfig, *, workers: int, sock: socket.socket | None, with_admin: bool
) -> None:
    opened = await open_gateway(config, workers=workers, sock=sock, with_admin=with_admin)
    gateway, admin_app = opened.gateway, opened.admin
    watcher = _Watcher(path, gateway, admin_app)
    loop = asyncio.get_running_loop()
    grpc_leg = None
    grpc_stops: list[asyncio.Future[None]] = []
    if config.listen.grpc:  # the gRPC leg (grpcio needed only then)
        from ._grpc_server import start_gateway_grpc

        grpc_leg = await start_gateway_grpc(gateway)
    stopping = asyncio.Event()

    def stop() -> None:
        gateway.ready = False
        gateway.hub.shutdown()  # WebSockets close with 1001 before the server drains
        stopping.set()
        if grpc_leg is not None:
            grpc_stops.append(asyncio.ensure_future(grpc_leg.server.stop(config.drain)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    loop.add_signal_handler(signal.SIGHUP, watcher.reload)
    poller = asyncio.ensure_future(watcher.poll())
    try:
        await stopping.wait()
        await opened.drain(config.drain)
    finally:
        poller.cancel()
        if grpc_leg is not None:
            await grpc_leg.stop(config.drain)
        await opened.close()


def _print_ready(config: GatewayConfig, workers: int) -> None:
    print(
        f"stormguard gateway: {config.listen.http_scheme}://{config.listen.http} "
        f"(admin: {config.listen.admin}), "
        f"{workers} worker{'s' if workers != 1 else ''}",
        flush=True,
    )


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - the gateway extra brings it
        return asyncio.new_event_loop()


def run(path: str | Path, *, workers: int = 1) -> None:
    """Serve the gateway described by the file at ``path`` until SIGTERM/SIGINT."""
    path = Path(path)
    config = load_config(path)
    before = list(logging.getLogger().handlers)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    # access lines may go straight to the handler basicConfig added (see _accesslog)
    mark_default_handlers(h for h in logging.getLogger().handlers if h not in before)
    if workers <= 1:
        _print_ready(config, 1)
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            runner.run(_serve(path, config, workers=1, sock=None, with_admin=True))
        return
    _supervise(path, config, workers)


def _bind(listen: str) -> socket.socket:
    host, port = split_hostport(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _worker(path: Path, config: GatewayConfig, workers: int, sock: socket.socket) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor sends SIGTERM
    with asyncio.Runner(loop_factory=_new_loop) as runner:
        runner.run(_serve(path, config, workers=workers, sock=sock, with_admin=False))


def _supervise(path: Path, config: GatewayConfig, workers: int) -> None:
    # PROMETHEUS_MULTIPROC_DIR is set by the CLI before prometheus_client is imported.
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    assert directory, "the CLI sets PROMETHEUS_MULTIPROC_DIR for --workers > 1"
    import multiprocessing

    from prometheus_client import multiprocess

    context = multiprocessing.get_context("fork")
    sock = _bind(config.listen.http)
    procs: list[Any] = []

    def spawn() -> Any:
        proc = context.Process(target=_worker, args=(path, config, workers, sock), daemon=False)
        proc.start()
        return proc

    procs = [spawn() for _ in range(workers)]
    _print_ready(config, workers)

    async def supervise() -> None:
        from ._app import AdminApp
        from ._metrics import StatusBuilder

        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        status = StatusBuilder(None, _facts(config), _listener(config))
        admin = None
        if config.listen.admin:
            admin_app = AdminApp(status, lambda: not stopping.is_set())
            admin = await _server(admin_app, config, admin=True)
            admin_app.start()

        def forward(sig: int) -> None:
            if sig != signal.SIGHUP:
                stopping.set()
            else:
                try:
                    status.upstreams = _facts(load_config(path))
                except GatewayConfigError:
                    pass  # the workers log why
            for proc in procs:
                if proc.is_alive() and proc.pid is not None:
                    os.kill(proc.pid, sig)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, forward, sig)

        async def keep_alive() -> None:
            while not stopping.is_set():
                await asyncio.sleep(0.5)
                for i, proc in enumerate(procs):
                    if not proc.is_alive() and not stopping.is_set():
                        multiprocess.mark_process_dead(proc.pid)  # type: ignore[no-untyped-call]
                        log.error("worker %s exited (%s); restarting", proc.pid, proc.exitcode)
                        procs[i] = spawn()

        watchdog = asyncio.ensure_future(keep_alive())
        await stopping.wait()
        if admin is not None:
            admin_app.stop()
            await admin.drain(1.0)
        watchdog.cancel()

    try:
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            runner.run(supervise())
    finally:
        for proc in procs:
            proc.join(timeout=config.drain + 5)
            if proc.is_alive():
                proc.kill()
                proc.join()
            multiprocess.mark_process_dead(proc.pid)  # type: ignore[no-untyped-call]
        sock.close()


def multiprocess_env(workers: int) -> tempfile.TemporaryDirectory[str] | None:
    """Set PROMETHEUS_MULTIPROC_DIR for ``workers > 1`` (call before importing metrics)."""
    if workers <= 1:
        return None
    directory = tempfile.TemporaryDirectory(prefix="stormguard-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory.name
    return directory
