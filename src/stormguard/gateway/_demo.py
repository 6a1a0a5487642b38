# `stormguard demo gateway`: one upstream, two kinds of clients, one outage -- run
# twice, once with the clients calling the upstream directly and once through a
# `stormguard gateway` in front of it -- and a table of what the upstream saw.
#
#   upstream   aiohttp on 127.0.0.1 (in this process); answers 200 after a few ms;
#              during the outage it answers 500 at once, as a crashed backend does
#   clients    a naive loop (retry at once on any error, forever) and stormguard's
#              client (RetryTransport: backoff with jitter, Retry-After, breaker,
#              budget), each with its own API key, running side by side
#   gateway    a `stormguard gateway` process: per-client and global limits, a
#              breaker and a bulkhead on the upstream; its dashboard is live while
#              the second run goes on
#
# Every figure about the upstream is counted by the upstream itself (arrival time,
# client, answer), never by the clients; refusals with Retry-After are what the
# clients received from the gateway. Time to recover: from the upstream's return
# until it served, in one half-second, at least half its healthy success rate.
from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import MissingExtra

try:
    import click
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
    from rich.table import Table

    from ..mock._demo import _peak_rate
    from ._demo_parts import DemoUpstream, GatewayProcess, _clients, _guarded, _naive, _Tally
except ImportError as exc:  # pragma: no cover - needs the extra missing
    raise MissingExtra(exc.name or "aiohttp", "gateway") from exc

__all__ = ["GatewayDemoResult", "Phases", "gateway_demo_command", "run_gateway_demo"]

_BUCKET = 0.5  # seconds per bucket when judging recovery


@dataclass(frozen=True, slots=True)
class Phases:
    """How long each part of a run lasts, in seconds."""

    warmup: float = 3.0
    outage: float = 5.0
    after: float = 6.0

    @property
    def total(self) -> float:
        """The length of one run."""
        return self.warmup + self.outage + self.after


@dataclass(slots=True)
class GatewayDemoResult:
    """What the upstream saw of one run (and what the clients were told)."""

    label: str
    arrivals: list[tuple[float, str, bool]]  # (seconds into the run, client kind, answered 2xx)
    outage: tuple[float, float]
    refusals_with_retry_after: int = 0
    client_successes: int = 0
    breaker: list[tuple[float, str]] = field(default_factory=list)  # (seconds, state)

    def count(self, kind: str | None = None) -> int:
        """Requests that reached the upstream (from one kind of client, or all)."""
        return sum(1 for _, k, _ in self.arrivals if kind is None or k == kind)

    def during_outage(self) -> int:
        """Requests that reached the upstream while it was failing."""
        start, end = self.outage
        return sum(1 for t, _, _ in self.arrivals if start <= t < end)

    def peak_rate(self) -> int:
        """Most arrivals within any one second."""
        return _peak_rate([t for t, _, _ in self.arrivals])

    def time_to_recover(self) -> float | None:
        """Seconds from the upstream's return to half its healthy success rate (None: never)."""
        start, end = self.outage
        healthy = sum(1 for t, _, ok in self.arrivals if ok and t < start)
        per_bucket = healthy / max(start / _BUCKET, 1.0)
        last = max((t for t, _, _ in self.arrivals), default=end)
        b = end
        while b < last:
            served = sum(1 for t, _, ok in self.arrivals if ok and b <= t < b + _BUCKET)
            if served >= per_bucket / 2:
                return b - end
            b += _BUCKET
        return None


async def _watch_breaker(admin: str, result: GatewayDemoResult, t0: float) -> None:
    async with httpx.AsyncClient(timeout=1.0) as client:
        while True:
            try:
                status = (await client.get(admin + "/status")).json()
                state = status["upstreams"]["api"]["breaker"]
                result.breaker.append((time.monotonic() - t0, state))
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            await asyncio.sleep(0.2)


# --- one run ------------------------------------------------------------------------


async def _run(
    label: str,
    url: str,
    upstream: DemoUpstream,
    phases: Phases,
    tick: Callable[[str], None],
    *,
    naive: int,
    guarded: int,
    admin: str | None = None,
    alongside: Callable[[], Any] | None = None,
) -> GatewayDemoResult:
    naive_client, guarded_client = _clients(naive, guarded)
    upstream.reset()
    result = GatewayDemoResult(label, [], (phases.warmup, phases.warmup + phases.outage))
    tally = _Tally()
    stop = asyncio.Event()
    tasks = [asyncio.ensure_future(_naive(naive_client, url, tally, stop)) for _ in range(naive)]
    tasks += [
        asyncio.ensure_future(_guarded(guarded_client, url, tally, stop)) for _ in range(guarded)
    ]
    if admin is not None:
        tasks.append(asyncio.ensure_future(_watch_breaker(admin, result, upstream.t0)))
    extra = asyncio.ensure_future(alongside()) if alongside is not None else None
    try:
        while (now := time.monotonic() - upstream.t0) < phases.total:
            failing = phases.warmup <= now < phases.warmup + phases.outage
            upstream.failing = failing
            tick("upstream failing" if failing else "upstream healthy")
            await asyncio.sleep(0.1)
    finally:
        upstream.failing = False
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if extra is not None:
            await asyncio.gather(extra, return_exceptions=True)
        await naive_client.aclose()
        await guarded_client.aclose()
    result.arrivals = list(upstream.arrivals)
    result.refusals_with_retry_after = tally.retry_after
    result.client_successes = tally.successes
    return result


async def run_gateway_demo_async(
    *,
    phases: Phases | None = None,
    naive: int = 8,
    guarded: int = 8,
    console: Console | None = None,
    hold: float = 0.0,
    screenshot: Path | None = None,
) -> list[GatewayDemoResult]:
    """Both runs (direct, then through the gateway); returns what the upstream saw."""
    console = console or Console()
    phases = phases or Phases()
    upstream = DemoUpstream()
    await upstream.start()
    results: list[GatewayDemoResult] = []
    with tempfile.TemporaryDirectory(prefix="stormguard-demo-") as directory:
        gateway = GatewayProcess(upstream.port, Path(directory))
        try:
            await gateway.start()
            console.print(f"Dashboard (live during the second run): [bold]{gateway.admin}/[/]")
            runs = [
                ("without gateway", f"http://127.0.0.1:{upstream.port}/api/item", None),
                ("with gateway", f"{gateway.url}/api/item", gateway.admin),
            ]
            with Progress(
                TextColumn("{task.description:<16}"),
                BarColumn(),
                TextColumn("{task.fields[state]:<17} upstream saw {task.fields[seen]:>6,}"),
                TimeRemainingColumn(),
                console=console,
            ) as progress:
                for label, url, admin in runs:
                    task = progress.add_task(label, total=phases.total, state="", seen=0)

                    def tick(state: str, task: Any = task) -> None:
                        elapsed = min(time.monotonic() - upstream.t0, phases.total)
                        seen = len(upstream.arrivals)
                        progress.update(task, completed=elapsed, state=state, seen=seen)

                    async with contextlib.AsyncExitStack() as stack:
                        shot = None
                        if admin is not None and screenshot is not None:
                            shot = await _camera(stack, admin, screenshot, phases, upstream)
                        result = await _run(
                            label,
                            url,
                            upstream,
                            phases,
                            tick,
                            naive=naive,
                            guarded=guarded,
                            admin=admin,
                            alongside=shot,
                        )
                    progress.update(task, completed=phases.total)
                    results.append(result)
            if hold > 0:
                console.print(f"Serving the dashboard at {gateway.admin}/ for {hold:g} s …")
                await asyncio.sleep(hold)
        finally:
            gateway.stop()
            await upstream.stop()
    return results


async def _camera(
    stack: contextlib.AsyncExitStack, admin: str, path: Path, phases: Phases, up: DemoUpstream
) -> Callable[[], Any] | None:
    # The browser opens before the gateway run starts (it is slow to start and must
    # not eat the run's first seconds), so the page's breaker history starts green;
    # the picture is taken late in the outage, so that its charts (a bucket or so
    # behind) show the 5xx rise and the breaker opening after it.
    from ._dashboard_shot import Camera

    try:
        camera = await stack.enter_async_context(Camera(f"{admin}/dashboard"))
    except Exception as exc:  # no playwright, no chromium: the demo goes on without
        logging.getLogger("stormguard.demo").debug("no camera", exc_info=exc)
        return None

    async def take() -> None:
        into_outage = phases.warmup + min(phases.outage * 0.9, 4.5)
        await asyncio.sleep(max(up.t0 + into_outage - time.monotonic(), 0.0))
        await camera.shoot(path)

    return take


# --- the report ---------------------------------------------------------------------


def _recovery(r: GatewayDemoResult) -> str:
    t = r.time_to_recover()
    return "not within the run" if t is None else f"{t:.1f} s"


_ROWS: list[tuple[str, Callable[[GatewayDemoResult], str]]] = [
    ("requests that reached it", lambda r: f"{r.count():,}"),
    ("  from the naive loop", lambda r: f"{r.count('naive'):,}"),
    ("  from stormguard clients", lambda r: f"{r.count('stormguard'):,}"),
    ("  while it was down", lambda r: f"{r.during_outage():,}"),
    ("peak request rate", lambda r: f"{r.peak_rate():,}/s"),
    ("time to recover", _recovery),
    ("refusals with Retry-After", lambda r: f"{r.refusals_with_retry_after:,}"),
    ("successful answers to clients", lambda r: f"{r.client_successes:,}"),
]


def render(results: list[GatewayDemoResult], console: Console) -> None:
    """The side-by-side table of what the upstream saw."""
    table = Table(title="Same clients, same outage — as the upstream saw it")
    table.add_column("")
    for r in results:
        table.add_column(r.label, justify="right")
    for name, cell in _ROWS:
        table.add_row(name, *(cell(r) for r in results))
    console.print(table)


def run_gateway_demo(**kwargs: Any) -> list[GatewayDemoResult]:
    """:func:`run_gateway_demo_async` on a new event loop."""
    return asyncio.run(run_gateway_demo_async(**kwargs))


@click.command(name="gateway")
@click.option("--outage", default=5.0, show_default=True, help="Seconds the upstream fails.")
@click.option(
    "--hold", default=0.0, show_default=True, help="Keep serving the dashboard this long."
)
@click.option(
    "--png",
    "png",
    default="out/gateway-demo-timeline.png",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Where to write the timeline.",
)
@click.option(
    "--screenshot",
    type=click.Path(dir_okay=False),
    default=None,
    help="Save a screenshot of the dashboard during the outage (needs playwright + chromium).",
)
def gateway_demo_command(outage: float, hold: float, png: str, screenshot: str | None) -> None:
    """The gateway in front of a failing upstream: naive loop vs stormguard client (~40 s)."""
    logging.getLogger("stormguard").addHandler(logging.NullHandler())  # the table says it
    console = Console()
    console.print(
        "[bold]stormguard demo gateway[/]: a naive retry loop and stormguard's client call one "
        f"upstream, which fails for {outage:g} s and recovers — first directly, then through "
        "`stormguard gateway` (limits, breaker, bulkhead). All on 127.0.0.1.\n"
    )
    phases = Phases(outage=outage)
    results = run_gateway_demo(
        phases=phases,
        console=console,
        hold=hold,
        screenshot=Path(screenshot) if screenshot else None,
    )
    console.print()
    render(results, console)
    from ._demo_plot import timeline

    written = timeline(results, Path(png))
    console.print(f"Timeline: [bold]{written}[/]")
    if screenshot and Path(screenshot).exists():
        console.print(f"Dashboard screenshot: [bold]{screenshot}[/]")
    elif screenshot:
        console.print("No screenshot: it needs playwright (the 'test' extra) and chromium.")
