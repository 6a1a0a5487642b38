"""The HTTP adapters' success path: lanes per origin, seen through OriginGuards."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import requests
from http_support import ScriptedServer, Step

from stormguard import CircuitOpen, RetryPolicy
from stormguard.client._driver import Engine
from stormguard.httpx import RetryTransport
from stormguard.protection import OriginGuards
from stormguard.protection import _origin as origin_module
from stormguard.protection._origin import process_guards, reset_process_guards
from stormguard.requests import RetryAdapter
from stormguard.testing import FakeClock

ORIGIN = "http://api.test"


class CountingEngine(Engine):
    """An Engine that counts the runs it starts."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.starts = 0

    def start(self, *args: Any, **kwargs: Any) -> Any:
        self.starts += 1
        return super().start(*args, **kwargs)


def _scripted(*statuses: int) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []
    queue = list(statuses)

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(queue.pop(0) if len(queue) > 1 else queue[0])

    return httpx.MockTransport(answer), seen


def _get(transport: RetryTransport, path: str = "/x") -> int:
    with httpx.Client(transport=transport) as client:
        return client.get(ORIGIN + path).status_code


def test_a_success_starts_no_engine_run() -> None:
    """A 200 is answered on the lean first attempt: the engine starts no run."""
    mock, seen = _scripted(200)
    transport = RetryTransport(mock, guards=OriginGuards(), clock=FakeClock())
    transport.engine = engine = CountingEngine(clock=transport.clock)
    assert _get(transport) == 200 and _get(transport) == 200
    assert engine.starts == 0 and len(seen) == 2


def test_a_failure_hands_the_call_to_the_engine_once() -> None:
    """503 then 200: one engine run continues from the first attempt (two sends)."""
    mock, seen = _scripted(503, 200)
    clock = FakeClock()
    policy = RetryPolicy(attempts=3, deadline=None)
    transport = RetryTransport(mock, policy=policy, guards=OriginGuards(clock=clock), clock=clock)
    transport.engine = engine = CountingEngine(clock=clock)
    assert _get(transport) == 200
    assert engine.starts == 1 and len(seen) == 2 and len(clock.sleeps) == 1


def test_reset_of_its_registry_is_seen_by_an_existing_transport() -> None:
    """A forced-open breaker refuses; after guards.reset() the same transport is admitted."""
    guards = OriginGuards()
    mock, _ = _scripted(200)
    transport = RetryTransport(mock, guards=guards)
    assert _get(transport) == 200
    guards.get(ORIGIN).breaker.force_open()  # type: ignore[union-attr]
    with pytest.raises(CircuitOpen):
        _get(transport)
    guards.reset()
    assert _get(transport) == 200


def test_reset_of_process_guards_is_seen_by_an_existing_transport() -> None:
    """reset_process_guards() reaches a default transport that already cached the origin."""
    mock, _ = _scripted(200)
    transport = RetryTransport(mock)
    assert _get(transport) == 200
    process_guards().get(ORIGIN).breaker.force_open()  # type: ignore[union-attr]
    with pytest.raises(CircuitOpen):
        _get(transport)
    reset_process_guards()
    assert _get(transport) == 200


def test_an_evicted_origin_is_asked_of_the_registry_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After eviction the transport uses the registry's new guard, not its cached one."""
    monkeypatch.setattr(origin_module, "_MAX_ORIGINS", 2)
    guards = OriginGuards()
    mock, _ = _scripted(200)
    transport = RetryTransport(mock, guards=guards)
    assert _get(transport) == 200
    old = guards.get(ORIGIN)
    guards.get("http://b.test")
    guards.get("http://c.test")  # the least recently used idle origin goes: ORIGIN
    assert ORIGIN not in guards.origins()
    assert _get(transport) == 200
    fresh = guards.get(ORIGIN)
    assert fresh is not old
    fresh.breaker.force_open()  # type: ignore[union-attr]
    with pytest.raises(CircuitOpen):
        _get(transport)


def test_a_busy_lane_still_marks_its_origin_recently_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests through a cached lane keep their origin off the eviction end.

    The default lane's gate tells the registry whenever it counts its budget's
    batch of deposits: with a batch of none, every request does.
    """
    monkeypatch.setattr("stormguard.client._front._TOUCH_EVERY", 1)
    monkeypatch.setattr("stormguard.protection._tally.BATCH", 0)
    guards = OriginGuards()
    mock, _ = _scripted(200)
    transport = RetryTransport(mock, guards=guards)
    guards.get("http://old.test")
    assert _get(transport) == 200
    guards.get("http://old.test")
    assert _get(transport) == 200
    assert list(guards.origins()) == ["http://old.test", ORIGIN]


def test_one_lane_per_origin_not_per_path() -> None:
    """Two paths on one origin share its guard; another port is another origin."""
    guards = OriginGuards()
    mock, _ = _scripted(200)
    transport = RetryTransport(mock, guards=guards)
    with httpx.Client(transport=transport) as client:
        client.get(ORIGIN + "/a?q=1")
        client.get(ORIGIN + "/b")
        client.get("http://api.test:8080/c")
    assert sorted(guards.origins()) == [ORIGIN, "http://api.test:8080"]


@pytest.mark.parametrize(
    ("deadline", "expected"),
    [(None, {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}), (120.0, None)],
)
def test_timeouts_are_left_alone_when_the_deadline_does_not_shorten_them(
    deadline: float | None, expected: dict[str, float] | None
) -> None:
    """The request's timeout mapping reaches the inner transport as the client set it."""
    mock, seen = _scripted(200)
    policy = RetryPolicy(deadline=deadline)
    transport = RetryTransport(mock, policy=policy, guards=OriginGuards(), clock=FakeClock())
    with httpx.Client(transport=transport) as client:
        request = client.build_request("GET", ORIGIN)
        given = request.extensions["timeout"]
        client.send(request)
    assert seen[0].extensions["timeout"] is given
    if expected is not None:
        assert given == expected


def test_a_deadline_shorter_than_the_timeouts_caps_them() -> None:
    """deadline=2 s with 5 s timeouts: every timeout of the attempt is 2 s."""
    mock, seen = _scripted(200)
    policy = RetryPolicy(deadline=2.0)
    transport = RetryTransport(mock, policy=policy, guards=OriginGuards(), clock=FakeClock())
    assert _get(transport) == 200
    assert seen[0].extensions["timeout"] == dict.fromkeys(("connect", "read", "write", "pool"), 2.0)


def test_the_async_path_sees_a_reset_too() -> None:
    """The async lean path uses the registry's guard after guards.reset()."""
    guards = OriginGuards()

    async def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200)

    transport = RetryTransport(httpx.MockTransport(answer), guards=guards)

    async def get() -> int:
        async with httpx.AsyncClient(transport=transport) as client:
            return (await client.get(ORIGIN)).status_code

    assert asyncio.run(get()) == 200
    guards.get(ORIGIN).breaker.force_open()  # type: ignore[union-attr]
    with pytest.raises(CircuitOpen):
        asyncio.run(get())
    guards.reset()
    assert asyncio.run(get()) == 200


def test_the_requests_adapter_sees_a_reset(server: ScriptedServer) -> None:
    """RetryAdapter keeps a lane per origin and still follows guards.reset()."""
    server.script(Step(200))
    guards = OriginGuards()
    with requests.Session() as session:
        session.mount("http://", RetryAdapter(guards=guards))
        assert session.get(server.url, timeout=10).status_code == 200
        guards.for_url(server.url).breaker.force_open()  # type: ignore[union-attr]
        with pytest.raises(CircuitOpen):
            session.get(server.url, timeout=10)
        guards.reset()
        assert session.get(server.url, timeout=10).status_code == 200
    assert len(server.received) == 2


def test_a_budget_counts_each_first_attempt_once() -> None:
    """The lean first attempt deposits in the origin's budget once per request."""
    guards = OriginGuards(breaker=False, bulkhead=False, cooldown=False, pacing=False)
    mock, _ = _scripted(200)
    transport = RetryTransport(mock, guards=guards)
    budget = guards.get(ORIGIN).budget
    assert budget is not None
    before = budget.balance()
    for _ in range(10):
        _get(transport)
    assert budget.balance() == pytest.approx(before + 10 * 0.1, abs=1e-6)


def test_the_requests_adapter_sends_through_httpadapter_send_as_patched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A class-level patch of HTTPAdapter.send made after the adapter exists (the
    `responses` library does this) is what each attempt goes through."""
    from requests.adapters import HTTPAdapter

    adapter = RetryAdapter(guards=OriginGuards())
    sent: list[str] = []

    def fake_send(self: HTTPAdapter, request: requests.PreparedRequest, *args: Any) -> Any:
        sent.append(request.url or "")
        response = requests.Response()
        response.status_code = 200
        return response

    monkeypatch.setattr(HTTPAdapter, "send", fake_send)
    with requests.Session() as session:
        session.mount("http://", adapter)
        assert session.get(ORIGIN + "/x", timeout=10).status_code == 200
    assert sent == [ORIGIN + "/x"]
