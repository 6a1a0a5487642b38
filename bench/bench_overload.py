"""Goodput past capacity: an upstream of fixed capacity under 0.5x..3x its capacity,
with stormguard's overload control in front of it and without.

The upstream is an ASGI app with a known capacity: ``SLOTS`` requests at once, each
taking ``SERVICE`` seconds (an asyncio semaphore and a sleep), so it serves
SLOTS / SERVICE requests per second; more queue inside it, and it finishes every
request it took, even one whose caller has given up (the wasted work of an
overloaded server). It runs under uvicorn in its own process, started afresh for
every run:

* ``off``: the upstream alone;
* ``on``: OverloadMiddleware in front of it in the same process -- an
  AdaptiveLimit watching the p99 (the limit follows latency, no one tells it the
  capacity), a line of waiters at most ``MAX_WAIT`` (half a service time) long in
  shedding order, 503 + Retry-After past it.

Load: an open-loop Poisson stream of calls at 0.5, 1, 1.5, 2 and 3 times the
capacity, half from retrying stormguard clients (httpx + RetryTransport, 3
attempts within the deadline, default per-origin protection) and half from naive
clients (a bare HTTP/1.1 client, up to 3 attempts, retrying a 5xx or a timeout at
once: cheap per request, so the load generator leaves the CPU to the server). Every
call has a ``DEADLINE``. Figures per run, after a warm-up at the same load:

* goodput: calls answered 2xx within their deadline, per second, as % of capacity;
* admitted p99: the 99th percentile latency of the attempts answered 2xx, as the
  server measured it (from the request reaching its app stack, overload control
  included, to the answer; the target is judged on it) and as the clients saw it
  (``client p99``: the load generator's own delays on a shared machine on top);
* refused: attempts answered 503.

The unloaded p99 (the upstream alone at 0.2x) is the yardstick of the issue's
target (admitted p99 at most twice it). A plot of goodput and admitted p99 against
offered load, both modes, goes to ``bench-out/overload.png`` (``STORMGUARD_BENCH_OUT``
names another directory). The last lines are the pinned ones:
``goodput at 3x capacity: N % (overload control on)`` and the same for ``off``.

The clients and the server share the machine: absolute latencies move with the
machine's load, goodput much less (it counts answers, not time). ``gateway_contender``
runs the same load through ``stormguard gateway`` (a config file with ``{listen}``
and ``{upstream}`` placeholders), for the gateway's overload stage.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.bench_gateway import _free_port, _process

SLOTS = 10
SERVICE = 0.2
CAPACITY = SLOTS / SERVICE  # requests per second
DEADLINE = 1.0
MAX_WAIT = SERVICE / 2  # a waiter waits at most half a service time (see docs/overload.md)
LEVELS = (0.5, 1.0, 1.5, 2.0, 3.0)
ATTEMPTS = 3

# A contender starts its server(s) and yields (the URL the load goes to, the URL of
# the measured upstream app: the same, or the one behind a gateway).
Contender = Callable[[], AbstractContextManager[tuple[str, str]]]


# -- the upstream (runs in the server process) ------------------------------------


def upstream_app(slots: int = SLOTS, service: float = SERVICE) -> Any:
    """An ASGI app serving `slots` requests at once, `service` seconds each."""
    semaphore: asyncio.Semaphore | None = None
    body = b'{"ok":true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"11")]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal semaphore
        if scope["type"] != "http":
            return
        if semaphore is None:
            semaphore = asyncio.Semaphore(slots)
        async with semaphore:
            await asyncio.sleep(service)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def protected_app(slots: int = SLOTS, service: float = SERVICE, max_wait: float = MAX_WAIT) -> Any:
    """The upstream behind OverloadMiddleware with an adaptive limit."""
    from stormguard import AdaptiveLimit
    from stormguard.asgi import OverloadMiddleware

    # The controller watches the tail the target bounds (the p99, not the median):
    # a limit a few requests above the knee makes those few wait a whole service
    # time inside the upstream, which the median never sees.
    limit = AdaptiveLimit(max_limit=500, percentile=0.99)
    return OverloadMiddleware(
        upstream_app(slots, service),
        limit=limit,
        max_wait=max_wait,
        max_queue=4 * slots,
        status_path="/_overload",
    )


def measured(app: Any) -> Any:
    """``app`` timing its 2xx answers: ``POST /_bench/start`` starts (and clears) the
    record, ``GET /_bench/latencies`` answers it as a JSON list of seconds."""
    import json

    latencies: list[float] | None = None

    async def timed(scope: Any, receive: Any, send: Any) -> None:
        nonlocal latencies
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith("/_bench/"):
            if path == "/_bench/start":
                latencies = []
            body = json.dumps(latencies or []).encode()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        started = time.perf_counter()
        status = 0

        async def sent(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await app(scope, receive, sent)
        if latencies is not None and 200 <= status < 300:
            latencies.append(time.perf_counter() - started)

    return timed


def serve(mode: str, port: int, slots: int, service: float, max_wait: float) -> None:
    """Run the upstream (``off``) or the protected upstream (``on``) under uvicorn."""
    import uvicorn

    on = mode == "on"
    app = measured(protected_app(slots, service, max_wait) if on else upstream_app(slots, service))
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
        backlog=4096,
    )
    uvicorn.Server(config).run()


# -- contenders -------------------------------------------------------------------


def asgi_contender(
    mode: str, slots: int = SLOTS, service: float = SERVICE, max_wait: float = MAX_WAIT
) -> Contender:
    """The upstream under uvicorn, with (``on``) or without (``off``) overload control."""

    @contextmanager
    def start() -> Iterator[tuple[str, str]]:
        port = _free_port()
        cmd = [sys.executable, "-m", "bench.bench_overload", "serve", "--mode", mode]
        cmd += ["--port", str(port), "--slots", str(slots), "--service", str(service)]
        cmd += ["--max-wait", str(max_wait)]
        with _process(cmd, port):
            url = f"http://127.0.0.1:{port}"
            yield url, url

    return start


def gateway_contender(config: str, slots: int = SLOTS, service: float = SERVICE) -> Contender:
    """``stormguard gateway`` in front of the bare upstream.

    ``config`` is the gateway's YAML with ``{listen}`` (host:port of its HTTP
    listener) and ``{upstream}`` (the upstream's URL) in it, e.g. ``GATEWAY_OFF``.
    """

    @contextmanager
    def start() -> Iterator[tuple[str, str]]:
        with asgi_contender("off", slots, service)() as (upstream, _):
            port = _free_port()
            text = config.replace("{listen}", f"127.0.0.1:{port}").replace("{upstream}", upstream)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "gateway.yaml"
                path.write_text(text)
                command = Path(sys.executable).with_name("stormguard")
                cmd = [str(command), "gateway", "--config", str(path)]
                with _process(cmd, port):
                    yield f"http://127.0.0.1:{port}", upstream

    return start


GATEWAY_OFF = """\
listen:
  http: {listen}
  admin: null
access_log: false
upstreams:
  app:
    url: {upstream}
    timeout: {connect: 1.0, read: 5.0}
routes:
  - path: /
    upstream: app
"""
# The gateway's priority and overload stage on the upstream, set as the ASGI
# contender's middleware is: the limit watches the p99, waiters wait half a
# service time.
GATEWAY_ON = GATEWAY_OFF.replace(
    "    timeout: {connect: 1.0, read: 5.0}\n",
    "    timeout: {connect: 1.0, read: 5.0}\n"
    "    adaptive: {max_limit: 500, percentile: 0.99}\n"
    f"    overload: {{max_wait: {MAX_WAIT}, max_queue: {4 * SLOTS}}}\n",
)

# The same, but a request whose client hung up gives its slot back at once
# (hold_abandoned: false) instead of when the upstream answers.
GATEWAY_CUT = GATEWAY_ON.replace("max_queue: ", "hold_abandoned: false, max_queue: ")


# -- the load -----------------------------------------------------------------------


@dataclass
class Tally:
    """What one run saw."""

    calls: int = 0
    good: int = 0  # 2xx within the deadline
    attempts: int = 0
    refused: int = 0  # attempts answered 503
    latencies: list[float] = field(default_factory=list)  # of attempts answered 2xx
    served: list[float] = field(default_factory=list)  # the same, as the server timed them
    lag: list[float] = field(default_factory=list)  # how late the generator sent each call

    def attempt(self, status: int, latency: float) -> None:
        self.attempts += 1
        if status == 503:
            self.refused += 1
        elif 200 <= status < 300:
            self.latencies.append(latency)


def _p99(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


class RawClient:
    """A naive HTTP/1.1 GET client on raw asyncio streams, with keep-alive connections.

    Far cheaper per request than httpx (the load generator shares the machine with
    the server): it writes the request line, reads the status line, the headers and
    a Content-Length body. A request that times out closes its connection, as a
    client that gives up does.
    """

    def __init__(self, url: str) -> None:
        rest = url.split("://", 1)[1]
        self.host, _, port = rest.partition(":")
        self.port = int(port)
        self.request = f"GET / HTTP/1.1\r\nHost: {rest}\r\n\r\n".encode()
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, within: float) -> int:
        """One GET within ``within`` seconds: the status (TimeoutError, OSError)."""
        async with asyncio.timeout(within):
            if self.idle:
                reader, writer = self.idle.pop()
            else:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            try:
                writer.write(self.request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
            except BaseException:
                writer.close()
                raise
        self.idle.append((reader, writer))
        return status

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


class _Timed(httpx.AsyncBaseTransport):
    """An httpx transport that times every attempt (wraps the real one)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, tally: Callable[[], Tally]) -> None:
        self.inner = inner
        self.tally = tally

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        response = await self.inner.handle_async_request(request)
        await response.aread()
        self.tally().attempt(response.status_code, time.perf_counter() - started)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _offer(
    url: str, rate: float, seconds: float, warmup: float, seed: int, measured_at: str = ""
) -> Tally:
    from stormguard import RetryPolicy
    from stormguard.httpx import RetryTransport
    from stormguard.protection import OriginGuards

    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=4000)
    counted = Tally()
    warming = Tally()
    current = [warming]

    def tally() -> Tally:
        return current[0]

    inner = httpx.AsyncHTTPTransport(limits=limits)
    transport = RetryTransport(
        _Timed(inner, tally),
        policy=RetryPolicy(attempts=ATTEMPTS, deadline=DEADLINE),
        guards=OriginGuards(),
    )
    timeout = httpx.Timeout(DEADLINE)
    guarded = httpx.AsyncClient(transport=transport, timeout=timeout)
    naive = RawClient(url)
    rng = random.Random(seed)
    marker = httpx.AsyncClient(timeout=5.0)  # the server's own timing (measured())
    measured_at = measured_at or url
    marking: list[asyncio.Task[httpx.Response]] = []

    async def stormguard_call() -> int:
        response = await guarded.get(url)
        return response.status_code

    async def naive_call() -> int:
        status = 0
        begun = time.perf_counter()
        for _ in range(ATTEMPTS):
            started = time.perf_counter()
            try:
                status = await naive.get(DEADLINE - (started - begun))
            except (OSError, ValueError, asyncio.IncompleteReadError):
                continue
            tally().attempt(status, time.perf_counter() - started)
            if status < 500:
                break
        return status

    async def call(kind: Callable[[], Any], sink: Tally) -> None:
        started = time.perf_counter()
        sink.calls += 1
        try:
            async with asyncio.timeout(DEADLINE):
                status = await kind()
        except (Exception, TimeoutError):
            return
        if 200 <= status < 300 and time.perf_counter() - started <= DEADLINE:
            sink.good += 1

    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    start = loop.time()
    arrival = start
    while arrival < start + warmup + seconds:
        arrival += rng.expovariate(rate)
        delay = arrival - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if arrival >= start + warmup:
            if current[0] is warming:
                marking.append(asyncio.create_task(marker.post(f"{measured_at}/_bench/start")))
            current[0] = counted
            counted.lag.append(max(0.0, loop.time() - arrival))
        kind = stormguard_call if rng.random() < 0.5 else naive_call
        task = asyncio.create_task(call(kind, current[0]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=DEADLINE + 1)
    await asyncio.gather(*marking)
    counted.served = (await marker.get(f"{measured_at}/_bench/latencies")).json()
    await marker.aclose()
    await guarded.aclose()
    naive.close()
    return counted


@dataclass(frozen=True)
class Row:
    """One run's figures."""

    mode: str
    offered: float
    goodput: float  # % of capacity
    p99_ms: float  # admitted p99, as the server timed it
    client_p99_ms: float  # the same attempts, as the clients timed them
    refused: float  # % of attempts
    attempts_per_s: float


def run_level(
    contender: Contender, mode: str, level: float, *, seconds: float, warmup: float, seed: int = 1
) -> Row:
    """Start the contender afresh, offer `level` x capacity, measure."""
    with contender() as (url, measured_at):
        tally = asyncio.run(_offer(url, level * CAPACITY, seconds, warmup, seed, measured_at))
    return Row(
        mode,
        level,
        100.0 * tally.good / seconds / CAPACITY,
        1000.0 * _p99(tally.served),
        1000.0 * _p99(tally.latencies),
        100.0 * tally.refused / tally.attempts if tally.attempts else 0.0,
        tally.attempts / seconds,
    )


def _plot(rows: list[Row], unloaded_ms: float, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, (good, latency) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, style in (("on", "o-"), ("off", "s--")):
        mine = [r for r in rows if r.mode == mode]
        label = f"overload control {mode}"
        good.plot([r.offered for r in mine], [r.goodput for r in mine], style, label=label)
        latency.plot([r.offered for r in mine], [r.p99_ms for r in mine], style, label=label)
    good.axhline(90, color="grey", linewidth=0.8, linestyle=":")
    good.set(xlabel="offered load (x capacity)", ylabel="goodput (% of capacity)", ylim=(0, 110))
    latency.axhline(2 * unloaded_ms, color="grey", linewidth=0.8, linestyle=":")
    latency.set(xlabel="offered load (x capacity)", ylabel="admitted p99, server-timed (ms)")
    latency.set_yscale("log")
    for ax in (good, latency):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    figure.suptitle(
        f"Upstream of {SLOTS} slots x {SERVICE * 1000:.0f} ms ({CAPACITY:.0f} req/s), "
        f"deadline {DEADLINE:g} s",
        fontsize=9,
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(figure)
    return path


def run(
    contenders: dict[str, Contender] | None = None,
    *,
    quick: bool = False,
    picture: str = "overload.png",
    quick_levels: dict[str, tuple[float, ...]] | None = None,
) -> list[Row]:
    """The whole table: every contender at every level; prints it and the pinned lines.

    ``contenders`` maps ``"on"`` and ``"off"`` (and others) to contenders (default:
    the ASGI ones); pass gateway contenders to measure the gateway's overload stage
    instead. ``quick_levels``: with ``quick``, the levels a contender runs at
    (default: every level), so that the quick run stays under two minutes.
    """
    contenders = contenders or {"on": asgi_contender("on"), "off": asgi_contender("off")}
    seconds, warmup = (4.0, 2.0) if quick else (15.0, 4.0)
    calm = 8.0 if quick else 30.0  # the unloaded run: enough answers for a p99
    unloaded = run_level(asgi_contender("off"), "unloaded", 0.2, seconds=calm, warmup=1.0)
    print(
        f"upstream: {SLOTS} slots x {SERVICE * 1000:.0f} ms = {CAPACITY:.0f} req/s; "
        f"deadline {DEADLINE:g} s; {seconds:g} s per run after {warmup:g} s of warm-up"
    )
    print(
        f"unloaded p99 (0.2x for {calm:g} s, upstream alone): {unloaded.p99_ms:.1f} ms "
        f"(clients saw {unloaded.client_p99_ms:.1f} ms)"
    )
    print(
        f"{'offered':>8} {'control':>8} {'goodput':>9} {'adm p99':>9} {'client p99':>11} "
        f"{'refused':>8} {'att/s':>7}"
    )
    rows = []
    for level in LEVELS:
        for mode in contenders:
            if quick and level not in (quick_levels or {}).get(mode, LEVELS):
                continue
            row = run_level(contenders[mode], mode, level, seconds=seconds, warmup=warmup)
            rows.append(row)
            print(
                f"{level:>7.1f}x {mode:>8} {row.goodput:>8.1f}% {row.p99_ms:>7.0f}ms "
                f"{row.client_p99_ms:>9.0f}ms {row.refused:>7.1f}% {row.attempts_per_s:>7.0f}",
                flush=True,
            )
    target = 2 * unloaded.p99_ms
    on3 = next(r for r in rows if r.mode == "on" and r.offered == 3.0)
    print(
        f"targets at 3x (on): goodput >= 90 %: {'met' if on3.goodput >= 90 else 'NOT met'}; "
        f"admitted p99 <= 2 x unloaded ({target:.0f} ms): "
        f"{'met' if on3.p99_ms <= target else 'NOT met'}"
    )
    out = Path(os.environ.get("STORMGUARD_BENCH_OUT", "bench-out")) / picture
    drawn = _plot(rows, unloaded.p99_ms, out)
    if drawn is not None:
        print(f"wrote {drawn}")
    for mode in contenders:
        row = next(r for r in rows if r.mode == mode and r.offered == 3.0)
        print(f"goodput at 3x capacity: {row.goodput:.0f} % (overload control {mode})")
    return rows


def main(quick: bool = False) -> None:
    """``python -m bench overload [--quick]``."""
    run(quick=quick)


def main_gateway(quick: bool = False) -> None:
    """``python -m bench overload-gateway [--quick]``: the same load through
    ``stormguard gateway``, its overload stage on the upstream (on) or not (off);
    ``cut``: on, but a hung-up request's slot is given back at the hang-up (from
    3x only in a quick run, which has `off` at 0.5x, 1x and 3x).
    The server-timed p99 is the upstream's (the gateway's line wait is in the
    clients' column only)."""
    contenders = {
        "on": gateway_contender(GATEWAY_ON),
        "off": gateway_contender(GATEWAY_OFF),
        "cut": gateway_contender(GATEWAY_CUT),
    }
    # A quick run has `off` before the knee and collapsed at 3x, `cut` at 3x only.
    quick_levels = {"off": (0.5, 1.0, 3.0), "cut": (3.0,)}
    run(contenders, quick=quick, picture="overload-gateway.png", quick_levels=quick_levels)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.bench_overload")
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser("serve", help="run one upstream (used by the bench)")
    serving.add_argument("--mode", choices=("on", "off"), required=True)
    serving.add_argument("--port", type=int, required=True)
    serving.add_argument("--slots", type=int, default=SLOTS)
    serving.add_argument("--service", type=float, default=SERVICE)
    serving.add_argument("--max-wait", type=float, default=MAX_WAIT)
    running = commands.add_parser("run", help="the benchmark")
    running.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.mode, args.port, args.slots, args.service, args.max_wait)
    else:
        main(quick=args.quick)
