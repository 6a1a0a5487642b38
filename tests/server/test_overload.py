"""OverloadMiddleware / OverloadControl: the shedding order, refusals and their reasons,
admission control, priority sources, state pages; in-process and under uvicorn."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from overload_apps import Held

from net_support import free_port, listening, wait_started
from stormguard import AdaptiveLimit, AdmissionControl, Priority
from stormguard._errors import ConfigError
from stormguard.asgi import ConcurrencyMiddleware, OverloadControl, OverloadMiddleware
from stormguard.server._overload import Ticket
from stormguard.server._priority import compile_priority
from stormguard.server._refusal import Refusal
from stormguard.server._rules import ClientAddress
from stormguard.testing import FakeClock

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"


def client(app: Any, peer: str = "10.0.0.1") -> httpx.AsyncClient:
    """An httpx client calling ``app`` in-process from ``peer``."""
    transport = httpx.ASGITransport(app=app, client=(peer, 5555))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def until(predicate: Any) -> None:
    """Yield to the loop until ``predicate()`` holds (the requests got where expected)."""
    for _ in range(10_000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never reached")


async def test_waiters_are_served_in_shedding_order() -> None:
    """Class first, then first attempts before retries, then light clients before heavy."""
    app = Held()
    mw = OverloadMiddleware(
        app,
        limit=1,
        max_queue=10,
        max_wait=30,
        standing_wait=None,  # the line is held on purpose between steps in real time
        key="header:X-Client",
        priority={"header": "x-priority", "trust": "always"},
    )
    control = mw.control
    async with client(mw) as c:
        for _ in range(5):  # the heavy client's recent requests
            assert (await c.get("/fast", headers={"X-Client": "heavy"})).status_code == 200
        holder = asyncio.create_task(c.get("/hold", headers={"X-Name": "holder"}))
        await until(lambda: "holder" in app.entered)
        queued = [
            ("shed", {"X-Priority": "sheddable"}),
            ("retry", {"Retry-Attempt": "2"}),
            ("heavy", {"X-Client": "heavy"}),
            ("light", {"X-Client": "light"}),
            ("critical-retry", {"X-Priority": "critical", "x-envoy-attempt-count": "3"}),
        ]
        tasks = []
        for name, headers in queued:
            tasks.append(asyncio.create_task(c.get("/hold", headers={"X-Name": name, **headers})))
            count = len(tasks)
            await until(lambda count=count: control.waiting == count)
        app.gate.set()
        answers = [await t for t in [holder, *tasks]]
    assert [r.status_code for r in answers] == [200] * 6
    assert app.entered[6:] == ["critical-retry", "light", "heavy", "retry", "shed"]
    assert control.in_flight == 0 and control.status()["refused"] == {}


async def test_a_full_line_sheds_its_lowest_with_503() -> None:
    """A critical newcomer pushes the sheddable waiter out: 503 + Retry-After, shed:sheddable."""
    app = Held()
    mw = OverloadMiddleware(
        app,
        limit=1,
        max_queue=1,
        max_wait=30,
        standing_wait=None,  # the line is held on purpose between steps in real time
        retry_after=4,
        priority=lambda s: _named(s),
    )
    async with client(mw) as c:
        holder = asyncio.create_task(c.get("/hold", headers={"X-Name": "holder"}))
        await until(lambda: app.entered == ["holder"])
        low = asyncio.create_task(c.get("/hold", headers={"X-Name": "sheddable"}))
        await until(lambda: mw.control.waiting == 1)
        high = asyncio.create_task(c.get("/hold", headers={"X-Name": "critical"}))
        refused = await low
        assert refused.status_code == 503 and refused.headers["retry-after"] == "4"
        assert refused.headers["content-type"] == "application/problem+json"
        worse = await c.get("/hold", headers={"X-Name": "default"})  # ranks below the line
        app.gate.set()
        assert (await holder).status_code == (await high).status_code == 200
    assert worse.status_code == 503
    assert app.entered == ["holder", "critical"]
    assert mw.control.status()["refused"] == {"shed:sheddable": 1, "shed:default": 1}


def _named(scope: Any) -> str | None:
    # the class a test request names in X-Name (callable priority source)
    for key, value in scope["headers"]:
        if key == b"x-name":
            return value.decode()
    return None


async def test_a_wait_that_runs_out_is_concurrency_limit(clock: FakeClock) -> None:
    """Nobody leaves within max_wait (virtual time): 503 with reason concurrency_limit."""
    app = Held()
    mw = OverloadMiddleware(app, limit=1, max_wait=1.0, clock=clock)
    async with client(mw) as c:
        holder = asyncio.create_task(c.get("/hold"))
        await until(lambda: len(app.entered) == 1)
        waiting = asyncio.create_task(c.get("/hold"))
        await until(lambda: mw.control.waiting == 1)
        clock.advance(1.5)
        refused = await waiting
        app.gate.set()
        await holder
    assert refused.status_code == 503
    assert mw.control.status()["refused"] == {"concurrency_limit": 1}
    assert mw.control.waiting == 0 and len(app.entered) == 1


async def _standing_line(
    clock: FakeClock, **settings: Any
) -> tuple[OverloadControl, asyncio.Task[Any], asyncio.Task[Any]]:
    # One slot held; a first waiter joins the empty line at t=0; the line stands
    # (never empty) for 0.2 s of virtual time; then a second waiter arrives.
    control = OverloadControl(1, max_queue=5, max_wait=1.0, clock=clock, **settings)
    held = await control.aenter()
    assert not isinstance(held, Refusal)
    first = asyncio.create_task(control.aenter())
    await until(lambda: control.waiting == 1)
    clock.advance(0.2)
    second = asyncio.create_task(control.aenter())
    await until(lambda: control.waiting == 2)
    return control, first, second


async def test_a_standing_line_cuts_a_newcomers_wait(clock: FakeClock) -> None:
    """Controlled delay: once the line has not been empty for standing_after (0.1 s),
    a newcomer waits standing_wait (5 ms), not max_wait; the first waiter keeps its
    max_wait and gets the slot when it frees."""
    control, first, second = await _standing_line(clock)
    clock.advance(0.01)
    refused = await asyncio.wait_for(second, 5)
    assert isinstance(refused, Refusal) and refused.reason == "concurrency_limit"
    assert not first.done() and control.waiting == 1
    control.release(Ticket(0.0, control.rank(Priority.DEFAULT)))
    assert isinstance(await asyncio.wait_for(first, 5), Ticket)


async def test_without_standing_wait_every_waiter_gets_max_wait(clock: FakeClock) -> None:
    """standing_wait=None: the second waiter still waits (virtual 0.01 s is far
    below max_wait), and is served in turn."""
    control, first, second = await _standing_line(clock, standing_wait=None)
    clock.advance(0.01)
    for _ in range(20):
        await asyncio.sleep(0.01)  # the waiters' polls of the virtual clock
    assert not second.done() and control.waiting == 2
    for _ in range(2):  # each freed slot admits one of them (the newest first)
        control.release(Ticket(0.0, control.rank(Priority.DEFAULT)))
        await until(lambda: control.waiting < 2 and (first.done() or second.done()))
        await until(lambda: control.in_flight == 1)
    assert isinstance(await first, Ticket) and isinstance(await second, Ticket)


async def test_a_line_that_drained_gives_max_wait_again(clock: FakeClock) -> None:
    """The standing clock restarts when the line empties: after the line drained, a
    newcomer joining it waits max_wait even though the slot stayed busy."""
    control = OverloadControl(1, max_queue=5, max_wait=1.0, clock=clock)
    held = await control.aenter()
    assert isinstance(held, Ticket)
    first = asyncio.create_task(control.aenter())
    await until(lambda: control.waiting == 1)
    clock.advance(0.5)
    control.release(held)
    held = await asyncio.wait_for(first, 5)  # the line is empty again
    assert isinstance(held, Ticket)
    clock.advance(0.5)
    late = asyncio.create_task(control.aenter())
    await until(lambda: control.waiting == 1)
    clock.advance(0.05)  # beyond standing_wait, within max_wait
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert not late.done()
    control.release(held)
    assert isinstance(await asyncio.wait_for(late, 5), Ticket)


async def test_no_waiting_refuses_at_once() -> None:
    """max_wait 0: a full limit refuses immediately (concurrency_limit)."""
    app = Held()
    mw = OverloadMiddleware(app, limit=1, max_wait=0)
    async with client(mw) as c:
        holder = asyncio.create_task(c.get("/hold"))
        await until(lambda: len(app.entered) == 1)
        refused = await c.get("/hold", headers={"X-Priority": "critical"})
        app.gate.set()
        await holder
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert mw.control.refused["concurrency_limit"] == 1


async def test_admission_control_sheds_a_share_while_the_app_fails(clock: FakeClock) -> None:
    """An app answering 500: the refused share climbs to max_reject (0.8); refused
    requests (admission_control) never reach the app."""
    app = Held()
    admission = AdmissionControl(min_rps=0, window=10, clock=clock, rng=random.Random(11))
    mw = OverloadMiddleware(app, limit=10, admission=admission)
    async with client(mw) as c:
        statuses = [(await c.get("/fail")).status_code for _ in range(400)]
    assert set(statuses) == {500, 503}
    late = statuses[200:]
    assert 0.7 <= late.count(503) / len(late) <= 0.9
    assert len(app.entered) == statuses.count(500)
    assert mw.control.refused["admission_control"] == statuses.count(503)
    assert admission.reject_probability == 0.8


class View:
    """A RequestView for classification tests."""

    def __init__(self, headers: dict[str, str], peer: str, raw: Any = None) -> None:
        self.headers, self._peer, self.raw = headers, peer, raw

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def peer(self) -> str | None:
        return self._peer


def test_priority_sources_in_order() -> None:
    """Callable, then the trusted header, then the longest route prefix, then default."""
    classify = compile_priority(
        {"header": "x-priority"},
        routes={"/batch": "sheddable", "/batch/urgent": "critical"},
        address=ClientAddress.of(["10.0.0.0/8"]),
    )
    proxy, outsider = "10.1.2.3", "192.0.2.7"
    assert classify(View({"x-priority": "critical"}, proxy), "/x") is Priority.CRITICAL
    assert classify(View({"x-priority": "critical"}, outsider), "/x") is Priority.DEFAULT
    assert classify(View({"x-priority": "bogus"}, proxy), "/batch/1") is Priority.SHEDDABLE
    assert classify(View({}, proxy), "/batch/urgent/2") is Priority.CRITICAL
    custom = compile_priority(lambda raw: raw, routes={"/": "sheddable"})
    assert custom(View({}, outsider, raw="critical"), "/") is Priority.CRITICAL
    assert custom(View({}, outsider, raw=None), "/") is Priority.SHEDDABLE


def test_trust_always_believes_anyone() -> None:
    """trust: always reads the header from any peer."""
    classify = compile_priority({"header": "X-Priority", "trust": "always"})
    assert classify(View({"x-priority": "sheddable"}, "192.0.2.7"), "/") is Priority.SHEDDABLE


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"priority": {"header": "x", "trust": "nobody"}}, "priority.trust"),
        ({"priority": {"header": ""}}, "priority.header"),
        ({"priority": {"header": "x", "from": "y"}}, "priority.from"),
        ({"priority": 5}, "priority"),
        ({"routes": {"batch": "sheddable"}}, "routes"),
        ({"routes": {"/batch": "urgent"}}, "routes['/batch']"),
        ({"default": "urgent"}, "default"),
    ],
)
def test_priority_configuration_errors(kwargs: dict[str, Any], field: str) -> None:
    """Invalid priority settings fail at construction naming the field."""
    with pytest.raises(ConfigError) as raised:
        OverloadMiddleware(Held(), **kwargs)
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"max_wait": -1}, "max_wait"),
        ({"max_queue": -1}, "max_queue"),
        ({"admission": "yes"}, "admission"),
        ({"retry_after": 0}, "retry_after"),
        ({"standing_wait": -0.1}, "standing_wait"),
        ({"standing_after": "soon"}, "standing_after"),
    ],
)
def test_control_configuration_errors(kwargs: dict[str, Any], field: str) -> None:
    """Invalid control settings fail at construction naming the field."""
    with pytest.raises(ConfigError) as raised:
        OverloadControl(**kwargs)
    assert raised.value.field == field


async def test_status_and_metrics_pages() -> None:
    """status_path answers the state as JSON, metrics_path as Prometheus text."""
    mw = OverloadMiddleware(
        Held(),
        limit=AdaptiveLimit(initial_limit=8),
        admission=True,
        status_path="/_overload",
        metrics_path="/_metrics",
    )
    async with client(mw) as c:
        assert (await c.get("/fast")).status_code == 200
        status = (await c.get("/_overload")).json()
        metrics = (await c.get("/_metrics")).text
    assert status["limit"] == 2 and status["admitted"] == 1 and status["in_flight"] == 0
    assert status["adaptive"]["probing"] is True and status["admission"]["requests"] == 1
    assert "stormguard_overload_limit 2" in metrics
    assert "stormguard_overload_admitted_total 1" in metrics
    assert "stormguard_overload_reject_probability 0.0000" in metrics


async def test_adaptive_limit_learns_from_admitted_requests(clock: FakeClock) -> None:
    """Each finished request is a latency sample; the start-up probe ends with min_rtt."""
    limit = AdaptiveLimit(initial_limit=8, probe_samples=3, clock=clock)
    mw = OverloadMiddleware(Held(), limit=limit, clock=clock)
    async with client(mw) as c:
        for _ in range(3):
            assert (await c.get("/fast")).status_code == 200
    assert limit.status()["probing"] is False and limit.limit == 8


async def test_a_client_that_leaves_teaches_nothing(clock: FakeClock) -> None:
    """An admitted request whose client disconnects gives its slot back without a
    latency sample or an outcome (a short client deadline is no overload signal)."""
    limit = AdaptiveLimit(initial_limit=8, probe_samples=2, clock=clock)
    admission = AdmissionControl(min_rps=0, clock=clock)
    app = Held()
    mw = OverloadMiddleware(app, limit=limit, admission=admission, clock=clock)
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    for _ in range(3):
        gone = asyncio.Event()

        async def receive(gone: asyncio.Event = gone) -> Any:
            await gone.wait()
            return {"type": "http.disconnect"}

        scope = {"type": "http", "path": "/hold", "headers": [], "client": ("10.0.0.9", 1)}
        task = asyncio.create_task(mw(scope, receive, send))
        await until(lambda: mw.control.in_flight == 1)
        clock.advance(0.3)
        gone.set()
        await task
    assert mw.control.in_flight == 0 and sent == []
    assert limit.status()["probing"] is True  # no sample reached the probe
    assert admission.status()["requests"] == 0


async def test_concurrency_middleware_adaptive() -> None:
    """adaptive=True: the limit starts at the probe's share and refuses past it."""
    app = Held()
    mw = ConcurrencyMiddleware(app, limit=50, adaptive=True)
    assert mw.overload is not None
    async with client(mw) as c:
        held = [asyncio.create_task(c.get("/hold")) for _ in range(5)]
        await until(lambda: len(app.entered) == 5)
        refused = await c.get("/hold")
        app.gate.set()
        answers = [await t for t in held]
    assert mw.overload.limit == 5  # ceil(20 * 0.25) while probing
    assert refused.status_code == 503 and [r.status_code for r in answers] == [200] * 5
    assert mw.overload.refused == {"concurrency_limit": 1}
    with pytest.raises(ConfigError, match="adaptive"):
        ConcurrencyMiddleware(app, adaptive=True, per_client=2)


async def test_passes_other_scopes_through() -> None:
    """Lifespan (and WebSocket) scopes go to the app untouched."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    await OverloadMiddleware(app)({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"]


@pytest.fixture
def overload_server() -> Iterator[str]:
    """overload_apps:overload_app under uvicorn on a free loopback port."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{HERE}"}
    cmd = [sys.executable, "-m", "uvicorn", "overload_apps:overload_app", "--factory"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--no-proxy-headers"]
    cmd += ["--log-level", "warning", "--no-access-log"]
    proc = subprocess.Popen(cmd, env=env, cwd=HERE)
    try:
        wait_started(lambda: listening(port), proc, "uvicorn overload_app")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _waiting(base: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while httpx.get(f"{base}/status").json()["waiting"] != count:
        assert time.monotonic() < deadline, f"never {count} waiting"
        time.sleep(0.02)


def test_on_the_wire_under_uvicorn(overload_server: str) -> None:
    """A real server: the retry is served after the critical request, the sheddable one
    is pushed out of the line with 503 + Retry-After."""
    base = overload_server
    answers: dict[str, httpx.Response] = {}

    def call(name: str, **headers: str) -> threading.Thread:
        def run() -> None:
            answers[name] = httpx.get(f"{base}/hold", headers={"X-Name": name, **headers})

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    threads = [call("holder")]
    _waiting(base, 0)
    while httpx.get(f"{base}/entered").json() != ["holder"]:
        time.sleep(0.02)
    threads.append(call("retry", **{"Retry-Attempt": "2"}))
    _waiting(base, 1)
    threads.append(call("sheddable", **{"X-Priority": "sheddable"}))
    _waiting(base, 2)
    threads.append(call("critical", **{"X-Priority": "critical"}))
    threads[2].join(10)
    shed = answers["sheddable"]
    assert shed.status_code == 503 and shed.headers["retry-after"] == "2"
    assert json.loads(shed.content)["status"] == 503
    httpx.get(f"{base}/release")
    for thread in threads:
        thread.join(10)
    assert [answers[n].status_code for n in ("holder", "retry", "critical")] == [200] * 3
    assert httpx.get(f"{base}/entered").json() == ["holder", "critical", "retry"]
    status = httpx.get(f"{base}/status").json()
    assert status["refused"] == {"shed:sheddable": 1} and status["admitted"] == 3


@pytest.mark.parametrize(("waited", "learnt"), [(0.05, False), (1.0, True)])
def test_an_abandoned_request_teaches_what_its_wait_proves(
    clock: FakeClock, waited: float, learnt: bool
) -> None:
    """abandon(): a caller that left after more than the unloaded latency (min_rtt x
    (1 + tolerance) = 0.11 s) timed out as it saw it, and the limit falls by its
    backoff (10 -> 9); one that left sooner teaches nothing. The slot is given back
    either way."""
    limit = AdaptiveLimit(initial_limit=10, probe_samples=1, min_samples=1, clock=clock)
    control = OverloadControl(limit, clock=clock)
    probe = control.enter()
    assert isinstance(probe, Ticket)
    clock.advance(0.1)
    control.leave(probe)  # the start-up probe: min_rtt 0.1 s
    assert limit.queued_after == pytest.approx(0.11)
    clock.advance(0.2)
    ticket = control.enter()
    assert isinstance(ticket, Ticket)
    clock.advance(waited)
    control.abandon(ticket)
    assert control.in_flight == 0
    assert limit.limit == (9 if learnt else 10)
