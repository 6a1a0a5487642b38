# `stormguard demo overload`: the short version of `python -m bench overload`.
# An upstream of known capacity is offered three times what it can serve, through
# `stormguard gateway` twice -- without and with the gateway's priority and
# overload stage on it -- and a table says what the callers got.
#
#   upstream   aiohttp on 127.0.0.1 (in this process): SLOTS requests at once, SERVICE
#              seconds each; more wait in its queue, and it finishes every request
#              it took, even one whose caller has given up (an overloaded server's
#              wasted work)
#   callers    an open-loop Poisson stream at LEVEL x capacity, each call with a
#              DEADLINE (one attempt: the demo shows the server side)
#   gateway    a `stormguard gateway` process; "with" adds, on the upstream, an
#              adaptive concurrency limit watching the p99 and a line of waiters
#              at most half a service time long (503 + Retry-After past it)
#
# Goodput: calls answered 2xx within their deadline, per second, as % of capacity.
# Without the stage the queue grows, every answer comes too late and goodput falls
# towards zero; with it, the excess is refused in milliseconds and what is admitted
# is served in time.
from __future__ import annotations

import asyncio
import logging
import math
import random
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._errors import MissingExtra

try:
    import click
    import httpx
    from aiohttp import web
    from rich.console import Console
    from rich.table import Table

    from ._demo_parts import GatewayProcess, serve_loopback
except ImportError as exc:  # pragma: no cover - needs the extra missing
    raise MissingExtra(exc.name or "aiohttp", "gateway") from exc

__all__ = ["OverloadRow", "overload_demo_command", "run_overload_demo"]

SLOTS = 4
SERVICE = 0.1
CAPACITY = SLOTS / SERVICE  # requests per second
DEADLINE = 1.0
LEVEL = 3.0


class CapacityUpstream:
    """An aiohttp upstream serving SLOTS requests at once, SERVICE seconds each."""

    def __init__(self) -> None:
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._slots = asyncio.Semaphore(SLOTS)
        self._work: set[asyncio.Task[None]] = set()

    async def _serve_one(self) -> None:
        async with self._slots:
            await asyncio.sleep(SERVICE)

    async def _handle(self, request: web.Request) -> web.Response:
        work = asyncio.ensure_future(self._serve_one())
        self._work.add(work)
        work.add_done_callback(self._work.discard)
        await asyncio.shield(work)  # a caller that left does not take its work back
        return web.json_response({"ok": True})

    async def start(self) -> None:
        """Listen on a free loopback port."""
        self._runner, self.port = await serve_loopback(self._handle)

    async def drain(self) -> None:
        """Wait for the work still queued (between runs)."""
        while self._work:
            await asyncio.gather(*list(self._work), return_exceptions=True)

    async def stop(self) -> None:
        """Stop listening."""
        for work in list(self._work):
            work.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def demo_config(with_stage: bool) -> Any:
    """The gateway's configuration for one run (a function of the three ports)."""

    def config(upstream_port: int, http_port: int, admin_port: int) -> dict[str, Any]:
        upstream: dict[str, Any] = {
            "url": f"http://127.0.0.1:{upstream_port}",
            "timeout": {"connect": 0.5, "read": 10.0},
        }
        if with_stage:
            # starts at twice the capacity (the default, 20, is five times it here)
            upstream["adaptive"] = {"max_limit": 100, "initial_limit": 8, "percentile": 0.99}
            upstream["overload"] = {"max_wait": SERVICE / 2}
        return {
            "listen": {"http": f"127.0.0.1:{http_port}", "admin": f"127.0.0.1:{admin_port}"},
            "access_log": False,
            "upstreams": {"api": upstream},
            "routes": [{"path": "/", "upstream": "api"}],
        }

    return config


@dataclass(frozen=True, slots=True)
class OverloadRow:
    """What the callers got in one run."""

    stage: bool  # the gateway's overload stage was on
    calls: int
    goodput: float  # % of capacity
    p99_ms: float  # of the calls answered 2xx (nan: none)
    refused: float  # % of calls answered 503 with Retry-After


async def _offer(url: str, seconds: float, warmup: float, seed: int) -> OverloadRow:
    rng = random.Random(seed)
    rate = LEVEL * CAPACITY
    good = refused = calls = 0
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=DEADLINE, limits=limits) as client:

        async def call(counted: bool) -> None:
            nonlocal good, refused, calls
            started = time.perf_counter()
            try:
                async with asyncio.timeout(DEADLINE):
                    response = await client.get(url)
            except (httpx.HTTPError, TimeoutError):
                response = None
            if not counted:
                return
            calls += 1
            if response is None:
                return
            took = time.perf_counter() - started
            if response.status_code == 503 and "retry-after" in response.headers:
                refused += 1
            elif 200 <= response.status_code < 300 and took <= DEADLINE:
                good += 1
                latencies.append(took)

        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        start = arrival = loop.time()
        while arrival < start + warmup + seconds:
            arrival += rng.expovariate(rate)
            delay = arrival - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(call(arrival >= start + warmup))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=DEADLINE + 1)
    ordered = sorted(latencies)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] if ordered else math.nan
    return OverloadRow(
        stage=False,
        calls=calls,
        goodput=100.0 * good / seconds / CAPACITY,
        p99_ms=1000.0 * p99,
        refused=100.0 * refused / calls if calls else 0.0,
    )


async def _run(seconds: float, warmup: float) -> list[OverloadRow]:
    upstream = CapacityUpstream()
    await upstream.start()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="stormguard-demo-") as tmp:
            # with the stage first: the run without leaves a backlog in the upstream
            # (work its callers gave up on), dropped when the demo stops it
            for n, with_stage in enumerate((True, False)):
                directory = Path(tmp) / str(n)
                directory.mkdir()
                gateway = GatewayProcess(upstream.port, directory, demo_config(with_stage))
                await gateway.start()
                try:
                    row = await _offer(gateway.url + "/api", seconds, warmup, seed=n + 1)
                finally:
                    gateway.stop()
                if with_stage:
                    await upstream.drain()
                rows.append(replace(row, stage=with_stage))
    finally:
        await upstream.stop()
    return rows[::-1]  # without, then with


def run_overload_demo(seconds: float = 5.0, warmup: float = 3.0) -> list[OverloadRow]:
    """Both runs: what the callers got without the stage, then with it."""
    return asyncio.run(_run(seconds, warmup))


def render(rows: list[OverloadRow], console: Console) -> None:
    """The table."""
    table = Table(title=f"{LEVEL:g}x capacity ({CAPACITY:g} req/s), deadline {DEADLINE:g} s")
    table.add_column("overload stage")
    for name in ("calls", "goodput", "p99 in time", "refused (503)"):
        table.add_column(name, justify="right")
    for row in rows:
        p99 = "-" if math.isnan(row.p99_ms) else f"{row.p99_ms:.0f} ms"
        table.add_row(
            "on" if row.stage else "off",
            str(row.calls),
            f"{row.goodput:.0f} %",
            p99,
            f"{row.refused:.0f} %",
        )
    console.print(table)


@click.command(name="overload")
@click.option("--seconds", type=click.FloatRange(min=1.0), default=5.0, show_default=True)
def overload_demo_command(seconds: float) -> None:
    """An upstream at 3x its capacity through the gateway, with and without its
    overload stage (~20 s)."""
    logging.getLogger("stormguard").addHandler(logging.NullHandler())
    console = Console()
    console.print(
        f"[bold]stormguard demo overload[/]: an upstream serving {SLOTS} requests at once, "
        f"{SERVICE * 1000:.0f} ms each ({CAPACITY:g} req/s), offered {LEVEL:g}x that through "
        "`stormguard gateway`, without and with its overload stage (an adaptive limit and "
        "a short line). All on 127.0.0.1.\n"
    )
    rows = run_overload_demo(seconds=seconds)
    render(rows, console)
    off, on = rows
    console.print(
        f"\nGoodput at {LEVEL:g}x capacity: {on.goodput:.0f} % with the overload stage, "
        f"{off.goodput:.0f} % without (python -m bench overload-gateway has the whole curve).",
        soft_wrap=True,
    )
