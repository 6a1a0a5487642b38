"""The overload-control runtime objects: AdaptiveLimit, AdmissionControl and the
client's AdaptiveThrottle (alone, as a breaker, and per origin in the HTTP clients)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from stormguard import (
    AdaptiveLimit,
    AdaptiveThrottle,
    AdmissionControl,
    CircuitBreaker,
    CircuitOpen,
    RetryPolicy,
    Throttled,
)
from stormguard._errors import ConfigError
from stormguard.httpx import RetryTransport
from stormguard.protection import OriginGuards, ThrottledBreaker
from stormguard.testing import FakeClock


def test_adaptive_limit_counts_slots_and_learns(clock: FakeClock) -> None:
    """try_acquire() stops at the limit (the start-up probe's first); release() feeds it."""
    limit = AdaptiveLimit(initial_limit=8, probe_samples=4, clock=clock)
    assert limit.limit == 2  # probing at ceil(8 * 0.25)
    held = [limit.try_acquire(), limit.try_acquire()]
    assert limit.try_acquire() is None and limit.in_flight == 2
    clock.advance(0.02)
    for started in held:
        assert started is not None
        limit.release(started)
    for _ in range(2):
        started = limit.try_acquire()
        assert started is not None
        clock.advance(0.02)
        limit.release(started)
    status = limit.status()
    assert status["min_rtt"] == pytest.approx(0.02) and status["probing"] is False
    assert status["limit"] == 8 and status["in_flight"] == 0 and status["probes"] == 1


def test_adaptive_limit_divides_fleet_bounds_by_instances() -> None:
    """Bounds given for a fleet are each instance's share, rounded up, at least 1."""
    limit = AdaptiveLimit(min_limit=2, max_limit=100, initial_limit=40, instances=3)
    status = limit.status()
    assert (status["min_limit"], status["max_limit"], status["instances"]) == (1, 34, 3)
    with pytest.raises(ConfigError, match="instances"):
        AdaptiveLimit(instances=0)


def test_admission_control_refuses_a_fraction(clock: FakeClock) -> None:
    """All requests failing: about max_reject of new ones are refused, and counted."""
    control = AdmissionControl(min_rps=0, clock=clock, rng=random.Random(7))
    for _ in range(100):
        control.record(False)
    refused = sum(not control.admits() for _ in range(1000))
    assert control.reject_probability == 0.8
    assert 740 <= refused <= 860 and control.refused == refused
    assert control.status()["requests"] == 100


def test_throttle_alone(clock: FakeClock) -> None:
    """allow() counts every attempt; accepts keep p at 0; failures raise it."""
    throttle = AdaptiveThrottle(clock=clock, rng=random.Random(3))
    for _ in range(10):
        assert throttle.allow()
        throttle.accept()
    assert throttle.probability == 0.0
    for _ in range(30):
        throttle.allow()
    assert throttle.probability == pytest.approx((40 - 2 * 10) / 41)
    assert throttle.status()["requests"] == 40


def test_throttled_breaker_asks_the_breaker_first(clock: FakeClock) -> None:
    """An open breaker refuses with CircuitOpen before the throttle draws."""
    breaker = CircuitBreaker(min_calls=1, clock=clock)
    breaker.acquire().record(failure=True)
    guarded = AdaptiveThrottle(clock=clock).guarding(breaker)
    with pytest.raises(CircuitOpen) as refused:
        guarded.acquire()
    assert not isinstance(refused.value, Throttled)
    assert guarded.throttle.status()["requests"] == 0


def test_throttle_refusal_gives_the_breaker_permit_back(clock: FakeClock) -> None:
    """A half-open probe admitted by the breaker but refused by the throttle is returned."""
    breaker = CircuitBreaker(min_calls=1, open_for=1.0, half_open_probes=1, clock=clock)
    breaker.acquire().record(failure=True)
    clock.advance(1.5)  # half-open: one probe
    throttle = AdaptiveThrottle(clock=clock, rng=random.Random(1), max_reject=1.0)
    for _ in range(50):
        throttle.allow()  # nothing accepted: p near 1
    guarded = ThrottledBreaker(throttle, breaker)
    with pytest.raises(Throttled):
        for _ in range(20):
            guarded.acquire().release()
    breaker.acquire().record(failure=False)  # the probe slot is free again
    assert breaker.state == "closed"


def test_permit_reports_to_both(clock: FakeClock) -> None:
    """record(failure=False) is an accept for the throttle and a success for the breaker."""
    breaker = CircuitBreaker(min_calls=1, clock=clock)
    throttle = AdaptiveThrottle(clock=clock)
    permit = throttle.guarding(breaker).acquire()
    permit.record(failure=False)
    permit.record(failure=False)  # reported once only
    assert throttle.status()["accepts"] == 1
    assert breaker.state == "closed"


class Backend:
    """An in-process httpx backend answering a fixed status; counts what reaches it."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.hits = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.hits += 1
        return httpx.Response(self.status)


def _run(backend: Backend, clock: FakeClock, calls: int, **kwargs: Any) -> dict[str, int]:
    transport = RetryTransport(
        httpx.MockTransport(backend),
        policy=RetryPolicy(attempts=1),
        clock=clock,
        rng=random.Random(5),
        breaker=False,
        budget=False,
        cooldown=False,
        **kwargs,
    )
    seen = {"answered": 0, "throttled": 0}
    with httpx.Client(transport=transport) as http:
        for _ in range(calls):
            try:
                http.get("https://api.example/x")
                seen["answered"] += 1
            except Throttled:
                seen["throttled"] += 1
            clock.advance(0.1)
    return seen


def test_transport_throttle_refuses_locally_when_the_origin_fails(clock: FakeClock) -> None:
    """throttle=True: a failing origin sees few attempts; the rest fail fast, unsent."""
    backend = Backend(503)
    seen = _run(backend, clock, 200, throttle={"window": 60})
    assert seen["throttled"] >= 150
    assert backend.hits == seen["answered"] < 50


def test_transport_throttle_stays_open_for_a_healthy_origin(clock: FakeClock) -> None:
    """Successful answers are accepts: nothing is refused."""
    backend = Backend(200)
    assert _run(backend, clock, 100, throttle=True) == {"answered": 100, "throttled": 0}


def test_429_counts_as_a_refusal(clock: FakeClock) -> None:
    """A 429 is not a 5xx, yet the throttle reads it as refused: it throttles too."""
    backend = Backend(429)
    seen = _run(backend, clock, 200, throttle={"window": 60})
    assert seen["throttled"] >= 150


def test_throttle_is_off_by_default() -> None:
    """Default protection has no throttle; throttle=True gives each origin its own."""
    assert OriginGuards().get("https://a.example").throttle is None
    guards = OriginGuards(throttle=True)
    first, second = guards.get("https://a.example"), guards.get("https://b.example")
    assert first.throttle is not None and first.throttle is not second.throttle
    with pytest.raises(ConfigError, match="throttle"):
        OriginGuards(throttle=3)  # type: ignore[arg-type]


class _Failing(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def failing_server() -> Iterator[tuple[str, list[int]]]:
    """A real HTTP server on loopback answering 503; counts the requests it saw."""
    hits: list[int] = []

    class Handler(_Failing):
        def do_GET(self) -> None:
            hits.append(1)
            super().do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()


async def test_async_transport_throttles_a_real_failing_server(
    failing_server: tuple[str, list[int]],
) -> None:
    """Async client, real loopback server answering 503: most calls are refused unsent."""
    url, hits = failing_server
    transport = RetryTransport(
        policy=RetryPolicy(attempts=1), throttle=True, breaker=False, rng=random.Random(2)
    )
    throttled = 0
    async with httpx.AsyncClient(transport=transport) as http:
        for _ in range(60):
            try:
                await http.get(url)
            except Throttled:
                throttled += 1
    assert throttled + len(hits) == 60
    assert throttled >= 40
