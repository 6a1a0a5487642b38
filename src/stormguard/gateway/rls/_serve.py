# Running the rate-limit service: the grpc.aio server and the admin listener on one
# event loop, signals, reload, workers.
#
# One process (--workers 1): the gRPC server and the admin listener (uvicorn, through
# its public Config/Server) share a loop; /status and /metrics read the process's own
# registry. N processes: the supervisor starts N workers (spawned: no gRPC state is
# ever forked), each serving `--listen` with SO_REUSEPORT so the kernel spreads
# connections; the supervisor serves the admin listener from prometheus-client's
# multiprocess files, forwards SIGHUP/SIGTERM and restarts a worker that dies. The
# state is in the store, which must then be Redis (ServiceOptions insists).
#
# Reload (SIGHUP, or a config file's mtime changing): every file is validated, then
# the Decider swaps in one assignment; an invalid file keeps the running one and logs
# every error line. Drain (SIGTERM/SIGINT): /readyz turns 503 at once, the gRPC
# server stops accepting and lets calls in flight finish for `--drain` seconds.
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..._errors import ConfigError
from .._config import split_hostport
from ._service import RateLimitService, ServiceOptions

__all__ = ["run", "serve"]

log = logging.getLogger("stormguard.ratelimit")
_FLUSH_EVERY = 0.5
_POLL_EVERY = 1.0


def _admin_server(app: Any, listen: str, drain: float) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # signals are ours
            yield

    host, port = split_hostport(listen)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        log_level="warning",
        http="h11",
        ws="none",
        timeout_graceful_shutdown=max(int(drain), 1),
    )
    return Server(config)


def _mtimes(paths: Sequence[str | Path]) -> tuple[float, ...]:
    out = []
    for path in paths:
        try:
            out.append(os.stat(path).st_mtime)
        except OSError:
            out.append(0.0)
    return tuple(out)


async def _every(seconds: float, action: Callable[[], Any]) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            action()
        except Exception:  # a hiccup must not stop the loop
            log.debug("periodic task failed", exc_info=True)


async def serve(
    paths: Sequence[str | Path],
    options: ServiceOptions,
    *,
    with_admin: bool = True,
    started: Callable[[int], None] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT; ``started(port)`` is called once listening."""
    import grpc.aio

    from ._admin import RlsAdmin
    from ._stats import RlsStatus

    service = RateLimitService(paths, options)
    reuse = 1 if options.workers > 1 else 0  # one process: a taken port is an error
    server = grpc.aio.server(options=[("grpc.so_reuseport", reuse)])
    server.add_generic_rpc_handlers((service.handler(),))
    try:
        port = server.add_insecure_port(options.listen)
    except RuntimeError as exc:
        raise ConfigError(
            "listen", f"cannot listen on {options.listen!r} (address already in use?): {exc}"
        ) from None
    await server.start()
    service.ready = True
    admin = None
    status = RlsStatus(service.metrics, service.descriptors)
    if with_admin and options.admin is not None:
        admin = _admin_server(RlsAdmin(status, lambda: service.ready), options.admin, options.drain)
    mtimes = _mtimes(paths)

    def reload() -> None:
        nonlocal mtimes
        mtimes = _mtimes(paths)
        if service.reload():
            status.descriptors = service.descriptors

    def poll() -> None:
        if _mtimes(paths) != mtimes:
            reload()

    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def stop() -> None:
        service.ready = False
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    loop.add_signal_handler(signal.SIGHUP, reload)
    tasks = [
        asyncio.ensure_future(_every(_FLUSH_EVERY, service.flush)),
        asyncio.ensure_future(_every(_POLL_EVERY, poll)),
    ]
    admin_task = asyncio.ensure_future(admin.serve()) if admin is not None else None
    if started is not None:
        started(port)
    try:
        await stopping.wait()
        await server.stop(options.drain)
    finally:
        for task in tasks:
            task.cancel()
        if admin is not None and admin_task is not None:
            admin.should_exit = True
            await admin_task
        service.flush()
        await service.aclose()


def _announce(options: ServiceOptions, port: int) -> None:
    host, _ = split_hostport(options.listen)
    admin = f"http://{options.admin}" if options.admin else "off"
    workers = options.workers
    print(
        f"stormguard ratelimit-service: grpc://{host}:{port} (admin: {admin}), "
        f"{workers} worker{'s' if workers != 1 else ''}",
        flush=True,
    )


def run(paths: Sequence[str | Path], options: ServiceOptions) -> None:
    """Serve the domains in ``paths`` until SIGTERM/SIGINT (supervising workers if N > 1)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if options.workers <= 1:
        asyncio.run(serve(paths, options, started=lambda port: _announce(options, port)))
        return
    from ._workers import supervise

    port = split_hostport(options.listen)[1]
    supervise(paths, options, announce=lambda: _announce(options, port))
