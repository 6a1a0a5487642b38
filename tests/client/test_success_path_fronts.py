"""The success path written out in each front end (httpx sync, httpx async, requests):
the same protection as the general path, whatever the front end."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import requests
from requests.adapters import HTTPAdapter

from stormguard import CircuitOpen, RetryPolicy
from stormguard.client import _front, _httpx, _requests
from stormguard.httpx import RetryTransport
from stormguard.protection import OriginGuards
from stormguard.protection import _origin as origin_module
from stormguard.protection._quick import QuickGuard
from stormguard.requests import RetryAdapter
from stormguard.testing import FakeClock

ORIGIN = "http://api.test"
ONE_ATTEMPT = RetryPolicy(attempts=1, deadline=None)
FRONTS = ["httpx", "httpx-async", "requests"]

# What the scripted upstream answers: a status and headers per request.
Answer = Callable[[], tuple[int, dict[str, str]]]


def _answers(*script: tuple[int, dict[str, str]]) -> Answer:
    queue = list(script)

    def answer() -> tuple[int, dict[str, str]]:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return answer


def ok(headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    """A 200 with ``headers``."""
    return 200, headers or {}


class Front:
    """One front end over a scripted upstream: ``get(n)`` sends n GETs to ORIGIN."""

    def __init__(
        self, kind: str, answer: Answer, monkeypatch: pytest.MonkeyPatch, **options: Any
    ) -> None:
        self.kind = kind
        if kind == "requests":

            def fake_send(adapter: HTTPAdapter, request: Any, *args: Any, **kw: Any) -> Any:
                status, headers = answer()
                response = requests.Response()
                response.status_code = status
                response.headers.update(headers)
                response.url = request.url
                response._content = b""
                return response

            monkeypatch.setattr(HTTPAdapter, "send", fake_send)
            self.adapter = RetryAdapter(**options)
            return

        def reply(request: httpx.Request) -> httpx.Response:
            status, headers = answer()
            return httpx.Response(status, headers=headers)

        async def areply(request: httpx.Request) -> httpx.Response:
            return reply(request)

        mock = httpx.MockTransport(areply if kind == "httpx-async" else reply)
        self.transport = RetryTransport(mock, **options)

    @property
    def front(self) -> Any:
        """The RetryTransport or RetryAdapter under test."""
        return self.adapter if self.kind == "requests" else self.transport

    def get(self, count: int = 1) -> list[int]:
        """``count`` GETs to ORIGIN, one after the other: their statuses."""
        if self.kind == "requests":
            with requests.Session() as session:
                session.mount("http://", self.adapter)
                return [session.get(ORIGIN + "/x", timeout=10).status_code for _ in range(count)]
        if self.kind == "httpx":
            with httpx.Client(transport=self.transport) as client:
                return [client.get(ORIGIN + "/x").status_code for _ in range(count)]

        async def many() -> list[int]:
            async with httpx.AsyncClient(transport=self.transport) as client:
                return [(await client.get(ORIGIN + "/x")).status_code for _ in range(count)]

        return asyncio.run(many())


@pytest.fixture
def fresh_plain_names(monkeypatch: pytest.MonkeyPatch) -> tuple[set[Any], set[Any]]:
    """Empty sets of header names found plain, for httpx and for requests."""
    names: tuple[set[Any], set[Any]] = (set(), set())
    monkeypatch.setattr(_httpx, "_PLAIN_NAMES", names[0])
    monkeypatch.setattr(_requests, "_PLAIN_NAMES", names[1])
    return names


def _plain_names(kind: str, names: tuple[set[Any], set[Any]]) -> set[Any]:
    return names[1] if kind == "requests" else names[0]


def _quota(remaining: int, clock: FakeClock, family: str = "x-ratelimit") -> dict[str, str]:
    reset = str(int(clock.time()) + 100)
    return {
        f"{family}-limit": "100",
        f"{family}-remaining": str(remaining),
        f"{family}-reset": reset,
    }


@pytest.mark.parametrize("kind", FRONTS)
@pytest.mark.parametrize("family", ["x-ratelimit", "X-RateLimit", "x-rate-limit", "RateLimit"])
def test_quota_headers_on_a_success_reach_the_pacer_after_plain_ones(
    kind: str, family: str, monkeypatch: pytest.MonkeyPatch, fresh_plain_names: Any
) -> None:
    """Plain successes first (their names learnt), then quota headers: pacing starts."""
    clock = FakeClock()
    quota = ok(_quota(5, clock, family))
    plain = ok({"content-type": "text/plain", "x-request-id": "a"})
    front = Front(
        kind,
        _answers(plain, plain, plain, quota),
        monkeypatch,
        guards=OriginGuards(clock=clock),
        clock=clock,
    )
    assert front.get(7) == [200] * 7
    # the quota's slots: 0, 0 (its first), 20, 40 (as tests/protection's pacing test)
    assert clock.sleeps == [pytest.approx(20.0, abs=1.0), pytest.approx(20.0, abs=1.0)]


@pytest.mark.parametrize("kind", FRONTS)
def test_a_quota_name_beside_known_plain_ones_is_found(
    kind: str, monkeypatch: pytest.MonkeyPatch, fresh_plain_names: Any
) -> None:
    """Names learnt plain, then the same names and quota headers: pacing starts; no
    rate-limit name is ever kept as plain."""
    clock = FakeClock()
    plain = {"content-type": "text/plain", "x-request-id": "a"}
    front = Front(
        kind,
        _answers(ok(plain), ok(plain), ok({**plain, **_quota(5, clock)})),
        monkeypatch,
        guards=OriginGuards(clock=clock),
        clock=clock,
    )
    assert front.get(2) == [200] * 2
    names = _plain_names(kind, fresh_plain_names)
    assert len(names) == 2
    assert front.get(3) == [200] * 3
    assert clock.sleeps == [pytest.approx(20.0, abs=1.0)]
    assert len(names) == 2


@pytest.mark.parametrize("kind", FRONTS)
def test_the_plain_names_kept_are_bounded(
    kind: str, monkeypatch: pytest.MonkeyPatch, fresh_plain_names: Any
) -> None:
    """Past the bound no name is kept, and quota headers are still found."""
    monkeypatch.setattr(_front, "_MAX_PLAIN_NAMES", 2)
    clock = FakeClock()
    answers = [ok({f"x-custom-{i}": "1", f"x-other-{i}": "2"}) for i in range(4)]
    front = Front(
        kind,
        _answers(*answers, ok(_quota(5, clock))),
        monkeypatch,
        guards=OriginGuards(clock=clock),
        clock=clock,
    )
    assert front.get(8) == [200] * 8
    assert len(_plain_names(kind, fresh_plain_names)) == 2  # the first response's, no more
    assert clock.sleeps == [pytest.approx(20.0, abs=1.0), pytest.approx(20.0, abs=1.0)]


@pytest.mark.parametrize("kind", FRONTS)
def test_the_breaker_opens_at_the_exact_failure_count_after_inline_successes(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every part on: 30 successes then 5xx; the breaker opens at the 30th failure, not before."""
    clock = FakeClock()
    guards = OriginGuards(clock=clock, breaker={"min_calls": 10, "failure_rate": 0.5})
    front = Front(
        kind,
        _answers(*[ok()] * 30, (500, {})),
        monkeypatch,
        guards=guards,
        clock=clock,
        policy=ONE_ATTEMPT,
    )
    assert front.get(30) == [200] * 30
    assert front.get(30) == [500] * 30
    with pytest.raises(CircuitOpen):
        front.get()


@pytest.mark.parametrize("kind", FRONTS)
def test_batches_of_inline_counts_lose_nothing(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """600 successes (queues counted every 256): the breaker saw 600, the budget 600."""
    clock = FakeClock()
    guards = OriginGuards(clock=clock, budget={"ratio": 0.5, "min_per_second": 0})
    front = Front(kind, _answers(ok()), monkeypatch, guards=guards, clock=clock)
    assert front.get(600) == [200] * 600
    guard = guards.get(ORIGIN)
    assert guard.breaker is not None and guard.budget is not None
    assert guard.breaker.local_state() == "closed"  # counts the queued successes
    assert guard.breaker._core._ring is not None
    assert guard.breaker._core._ring.a_total == 600
    assert guard.budget.balance() == pytest.approx(300.0)


@pytest.mark.parametrize("kind", FRONTS)
def test_an_evicted_origin_is_asked_of_the_registry_again(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its eviction a front end uses the registry's new guard, not its lane's."""
    monkeypatch.setattr(origin_module, "_MAX_ORIGINS", 2)
    guards = OriginGuards()
    front = Front(kind, _answers(ok()), monkeypatch, guards=guards)
    assert front.get() == [200]
    old = guards.get(ORIGIN)
    guards.get("http://b.test")
    guards.get("http://c.test")  # the least recently used idle origin goes: ORIGIN
    assert ORIGIN not in guards.origins()
    assert front.get() == [200]
    fresh = guards.get(ORIGIN)
    assert fresh is not old
    fresh.breaker.force_open()  # type: ignore[union-attr]
    with pytest.raises(CircuitOpen):
        front.get()


@pytest.mark.parametrize("kind", FRONTS)
def test_a_reset_is_seen_by_every_front_end(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forced-open breaker refuses; after guards.reset() the same front end is admitted."""
    guards = OriginGuards()
    front = Front(kind, _answers(ok()), monkeypatch, guards=guards)
    assert front.get() == [200]
    guards.get(ORIGIN).breaker.force_open()  # type: ignore[union-attr]
    with pytest.raises(CircuitOpen):
        front.get()
    guards.reset()
    assert front.get(2) == [200, 200]


@pytest.mark.parametrize("kind", FRONTS)
def test_a_busy_lane_still_marks_its_origin_recently_used(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests through a cached lane keep their origin off the eviction end (a
    lane with the lock-free gate: each time it counts its budget's batch, here
    of none)."""
    monkeypatch.setattr(_front, "_TOUCH_EVERY", 1)
    monkeypatch.setattr("stormguard.protection._tally.BATCH", 0)
    guards = OriginGuards()
    front = Front(kind, _answers(ok()), monkeypatch, guards=guards)
    guards.get("http://old.test")
    assert front.get() == [200]
    guards.get("http://old.test")
    assert front.get(2) == [200, 200]
    assert list(guards.origins()) == ["http://old.test", ORIGIN]


@pytest.mark.parametrize(
    ("parts", "counts_itself"),
    [({}, True), ({"budget": False}, False), ({"bulkhead": False}, True)],
)
def test_only_a_gate_with_a_budget_tells_the_registry_itself(
    parts: dict[str, Any], counts_itself: bool
) -> None:
    """Every lock-free gate is entered by its methods; one with a budget tells the
    registry from its budget's batches, the others' lanes count their requests."""
    transport = RetryTransport(
        httpx.MockTransport(lambda request: httpx.Response(200)), guards=OriginGuards(**parts)
    )
    lane = transport.lane_of(ORIGIN, httpx.URL(ORIGIN), str)
    assert isinstance(lane.gate, QuickGuard)
    assert (lane.quick is lane.gate) is counts_itself


class Interrupted(BaseException):
    """Not an Exception: a first attempt it ends is never judged."""


@pytest.mark.parametrize("kind", FRONTS)
def test_an_interrupted_attempt_gives_its_slot_back(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt raised inside the send is raised as it is; the bulkhead slot is free."""

    def answer() -> tuple[int, dict[str, str]]:
        raise Interrupted

    guards = OriginGuards()
    front = Front(kind, answer, monkeypatch, guards=guards)
    with pytest.raises(Interrupted):
        front.get()
    bulkhead = guards.get(ORIGIN).bulkhead
    assert bulkhead is not None and bulkhead.in_flight == 0


async def test_an_async_slot_given_back_inline_wakes_a_waiting_task() -> None:
    """Bulkhead of 1: a second task waits; the first's inline settle hands it the slot."""
    inside = asyncio.Event()
    release = asyncio.Event()

    async def answer(request: httpx.Request) -> httpx.Response:
        inside.set()
        await release.wait()
        return httpx.Response(200)

    guards = OriginGuards(bulkhead={"limit": 1, "max_wait": 30.0})
    transport = RetryTransport(httpx.MockTransport(answer), guards=guards)
    bulkhead = guards.get(ORIGIN).bulkhead
    assert bulkhead is not None
    async with httpx.AsyncClient(transport=transport) as client:
        first = asyncio.create_task(client.get(ORIGIN))
        await inside.wait()
        second = asyncio.create_task(client.get(ORIGIN))
        # No event says a task is queued: the bulkhead's queue is looked at.
        while not bulkhead.waiting:  # noqa: ASYNC110
            await asyncio.sleep(0)
        release.set()
        statuses = [(await first).status_code, (await second).status_code]
    assert statuses == [200, 200] and bulkhead.in_flight == 0 and bulkhead.waiting == 0


def test_requests_headers_of_another_kind_are_still_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A patched send answering with a plain dict of headers: quota headers still pace."""
    clock = FakeClock()
    reset = str(int(clock.time()) + 100)
    headers = {"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "5", "X-RateLimit-Reset": reset}

    def fake_send(adapter: HTTPAdapter, request: Any, *args: Any, **kw: Any) -> Any:
        response = requests.Response()
        response.status_code = 200
        response.headers = dict(headers)  # type: ignore[assignment]
        response._content = b""
        return response

    monkeypatch.setattr(HTTPAdapter, "send", fake_send)
    adapter = RetryAdapter(guards=OriginGuards(clock=clock), clock=clock)
    with requests.Session() as session:
        session.mount("http://", adapter)
        for _ in range(4):
            assert session.get(ORIGIN, timeout=10).status_code == 200
    assert clock.sleeps == [pytest.approx(20.0, abs=1.0), pytest.approx(20.0, abs=1.0)]


@pytest.mark.parametrize("kind", ["httpx", "httpx-async"])
def test_origins_sharing_a_host_keep_their_own_guards(kind: str) -> None:
    """http, https and another port of one host, in turns: each origin's breaker alone."""
    origins = ["http://api.test", "https://api.test", "http://api.test:8080"]
    guards = OriginGuards()
    transport = RetryTransport(
        httpx.MockTransport(lambda request: httpx.Response(200)), guards=guards
    )

    def get_all() -> list[Any]:
        async def aget_all() -> list[Any]:
            async with httpx.AsyncClient(transport=transport) as client:
                return [await _status_or_error(client.get(origin + "/x")) for origin in origins]

        if kind == "httpx-async":
            return asyncio.run(aget_all())
        with httpx.Client(transport=transport) as client:
            return [_sync_status_or_error(client, origin + "/x") for origin in origins]

    assert get_all() == [200, 200, 200]
    for turn, origin in enumerate(origins):
        guards.get(origin).breaker.force_open()  # type: ignore[union-attr]
        expected = [CircuitOpen if i <= turn else 200 for i in range(len(origins))]
        assert get_all() == expected
        assert get_all() == expected


async def _status_or_error(pending: Any) -> Any:
    try:
        return (await pending).status_code
    except CircuitOpen:
        return CircuitOpen


def _sync_status_or_error(client: httpx.Client, url: str) -> Any:
    try:
        return client.get(url).status_code
    except CircuitOpen:
        return CircuitOpen
