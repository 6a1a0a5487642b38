# --workers N: a supervisor process and N spawned workers (see _serve.py's notes).
#
# The supervisor never touches gRPC: it spawns the workers, serves the admin listener
# from the workers' multiprocess metric files (PROMETHEUS_MULTIPROC_DIR, set by the
# command before prometheus_client is imported), forwards SIGHUP and SIGTERM, and
# restarts a worker that exits on its own. Its /readyz is 503 once it is stopping.
from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._config import GatewayConfigError
from ._config import load_domains
from ._service import ServiceOptions

__all__ = ["supervise"]

log = logging.getLogger("stormguard.ratelimit")


def _worker(paths: Sequence[str], options: ServiceOptions) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor sends SIGTERM
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from ._serve import serve

    asyncio.run(serve(paths, options, with_admin=False))


def _descriptors(paths: Sequence[str]) -> dict[str, list[str]]:
    domains = load_domains(paths)
    return {name: [spec.label for spec in d.limits()] for name, d in domains.items()}


def supervise(
    paths: Sequence[str | Path], options: ServiceOptions, *, announce: Callable[[], None]
) -> None:
    """Run ``options.workers`` worker processes until SIGTERM/SIGINT."""
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR"), "the command sets it for --workers > 1"
    from prometheus_client import multiprocess

    from ._admin import RlsAdmin
    from ._serve import _admin_server, _mtimes
    from ._stats import RlsStatus

    files = [str(p) for p in paths]
    context = multiprocessing.get_context("spawn")
    procs: list[Any] = []

    def spawn() -> Any:
        proc = context.Process(target=_worker, args=(files, options), daemon=False)
        proc.start()
        return proc

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        status = RlsStatus(None, _descriptors(files))
        admin = None
        if options.admin is not None:
            ready = RlsAdmin(status, lambda: not stopping.is_set())
            admin = _admin_server(ready, options.admin, options.drain)

        def forward(sig: int) -> None:
            if sig == signal.SIGHUP:
                try:
                    status.descriptors = _descriptors(files)
                except GatewayConfigError:
                    pass  # the workers log why
            else:
                stopping.set()
            for proc in procs:
                if proc.is_alive() and proc.pid is not None:
                    os.kill(proc.pid, sig)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, forward, sig)
        procs.extend(spawn() for _ in range(options.workers))
        announce()
        admin_task = asyncio.ensure_future(admin.serve()) if admin is not None else None
        mtimes = _mtimes(files)
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), 0.5)
            except TimeoutError:
                pass
            if _mtimes(files) != mtimes:  # the workers reload themselves; /status follows
                mtimes = _mtimes(files)
                with contextlib.suppress(GatewayConfigError):
                    status.descriptors = _descriptors(files)
            for i, proc in enumerate(procs):
                if not proc.is_alive() and not stopping.is_set():
                    multiprocess.mark_process_dead(proc.pid)  # type: ignore[no-untyped-call]
                    log.error("worker %s exited (%s); restarting", proc.pid, proc.exitcode)
                    procs[i] = spawn()
        # Workers drain (SIGTERM was forwarded); the admin answers 503 meanwhile.
        await loop.run_in_executor(None, _join, procs, options.drain + 5)
        if admin is not None and admin_task is not None:
            admin.should_exit = True
            await admin_task

    try:
        asyncio.run(main())
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
            if proc.pid is not None:
                multiprocess.mark_process_dead(proc.pid)  # type: ignore[no-untyped-call]


def _join(procs: Sequence[Any], timeout: float) -> None:
    for proc in procs:
        proc.join(timeout=timeout)
