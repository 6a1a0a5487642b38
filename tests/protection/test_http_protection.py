"""Per-origin breaker, budget, cooldown, pacing and bulkhead in the httpx and requests adapters."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest
import requests

from stormguard import BulkheadFull, CircuitOpen, NoBackoff, RateLimited, RetryPolicy
from stormguard.httpx import RetryTransport
from stormguard.protection import OriginGuards
from stormguard.requests import RetryAdapter
from stormguard.testing import FakeClock

Handler = Callable[[httpx.Request], httpx.Response]


class Backend:
    """An in-process httpx backend that counts what reaches it."""

    def __init__(self, *responses: httpx.Response) -> None:
        self.responses = list(responses)
        self.hits: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.hits.append(str(request.url))
        response = self.responses[min(len(self.hits), len(self.responses)) - 1]
        return httpx.Response(response.status_code, headers=response.headers)


def client(backend: Backend, clock: FakeClock, **kwargs: Any) -> httpx.Client:
    policy = kwargs.pop("policy", RetryPolicy(attempts=1))
    transport = RetryTransport(httpx.MockTransport(backend), policy=policy, clock=clock, **kwargs)
    return httpx.Client(transport=transport)


def test_breaker_per_origin_opens_on_5xx(clock: FakeClock) -> None:
    """Failing 5xx open that origin's breaker; the refused request never reaches it."""
    backend = Backend(httpx.Response(500))
    with client(backend, clock, breaker={"min_calls": 3}) as http:
        for _ in range(3):
            assert http.get("https://sick.example/x").status_code == 500
        with pytest.raises(CircuitOpen):
            http.get("https://sick.example/x")
        assert len(backend.hits) == 3
        http.get("https://other.example/")  # another origin, another breaker
        assert len(backend.hits) == 4


def test_breaker_opening_mid_call_returns_the_last_response(clock: FakeClock) -> None:
    """When the breaker opens between attempts, the call ends with its last response."""
    backend = Backend(httpx.Response(502))
    policy = RetryPolicy(attempts=5, backoff=NoBackoff())
    with client(backend, clock, policy=policy, breaker={"min_calls": 2}) as http:
        assert http.get("https://sick.example/").status_code == 502
    assert len(backend.hits) == 2


def test_hinted_503_pauses_and_counts_against_the_breaker(clock: FakeClock) -> None:
    """503 + Retry-After pauses the origin and, being a 5xx, still trips the breaker."""
    backend = Backend(httpx.Response(503, headers={"Retry-After": "1"}))
    with client(backend, clock, breaker={"min_calls": 3}) as http:
        for _ in range(3):
            assert http.get("https://busy.example/").status_code == 503
        with pytest.raises(CircuitOpen):
            http.get("https://busy.example/")
    assert len(backend.hits) == 3
    assert clock.sleeps and all(1.0 <= wait <= 1.25 for wait in clock.sleeps)


def test_hinted_429_never_trips_the_breaker(clock: FakeClock) -> None:
    """429 + Retry-After pauses the origin but is no failure: the breaker stays closed."""
    backend = Backend(httpx.Response(429, headers={"Retry-After": "1"}))
    with client(backend, clock, breaker={"min_calls": 2}) as http:
        for _ in range(10):
            assert http.get("https://busy.example/").status_code == 429
    assert len(backend.hits) == 10


def test_4xx_do_not_count_as_failures(clock: FakeClock) -> None:
    """404s are answers, not failures: the breaker stays closed."""
    backend = Backend(httpx.Response(404))
    with client(backend, clock, breaker={"min_calls": 3}) as http:
        for _ in range(20):
            assert http.get("https://api.example/missing").status_code == 404


def test_breaker_off_with_one_keyword(clock: FakeClock) -> None:
    """breaker=False: nothing is ever refused."""
    backend = Backend(httpx.Response(500))
    with client(backend, clock, breaker=False) as http:
        for _ in range(30):
            assert http.get("https://sick.example/").status_code == 500


def test_budget_exhausted_returns_the_last_response(clock: FakeClock) -> None:
    """With the budget spent, a failing request ends at once with its last response."""
    backend = Backend(httpx.Response(503))
    policy = RetryPolicy(attempts=3, backoff=NoBackoff())
    budget = {"ratio": 0.0, "min_per_second": 0.1, "window": 10.0}  # one retry in reserve
    with client(backend, clock, policy=policy, budget=budget, breaker=False) as http:
        assert http.get("https://busy.example/").status_code == 503
        assert len(backend.hits) == 2  # first attempt + the one reserved retry
        assert http.get("https://busy.example/").status_code == 503
        assert len(backend.hits) == 3  # no retry left


def test_429_hint_pauses_the_origin_and_short_deadlines_fail_fast(clock: FakeClock) -> None:
    """A 429 with Retry-After pauses every request to the origin; a shorter deadline fails fast."""
    backend = Backend(httpx.Response(429, headers={"Retry-After": "30"}), httpx.Response(200))
    policy = RetryPolicy(attempts=1, deadline=10.0)
    with client(backend, clock, policy=policy) as http:
        assert http.get("https://api.example/a").status_code == 429
        with pytest.raises(RateLimited) as info:
            http.get("https://api.example/b")
        assert info.value.retry_after == pytest.approx(30.0)
        assert len(backend.hits) == 1
        assert http.get("https://other.example/").status_code == 200


def test_cooldown_wait_is_slept_when_the_deadline_allows(clock: FakeClock) -> None:
    """Within the deadline, the next request waits out the pause (on the clock)."""
    backend = Backend(httpx.Response(503, headers={"Retry-After": "5"}), httpx.Response(200))
    with client(backend, clock, policy=RetryPolicy(attempts=1)) as http:
        assert http.get("https://api.example/").status_code == 503
        assert http.get("https://api.example/").status_code == 200
    assert len(clock.sleeps) == 1
    assert 5.0 <= clock.sleeps[0] <= 6.25  # the pause, spread by up to 25 %


def test_cooldown_off_with_one_keyword(clock: FakeClock) -> None:
    """cooldown=False: a 429 does not pause other requests."""
    backend = Backend(httpx.Response(429, headers={"Retry-After": "30"}), httpx.Response(200))
    with client(backend, clock, cooldown=False) as http:
        assert http.get("https://api.example/").status_code == 429
        assert http.get("https://api.example/").status_code == 200


def test_pacing_spreads_the_last_requests(clock: FakeClock) -> None:
    """Under 10 % of the quota left, requests are spaced to the reset."""
    reset = str(int(clock.time()) + 100)
    headers = {"x-ratelimit-limit": "100", "x-ratelimit-remaining": "5", "x-ratelimit-reset": reset}
    backend = Backend(httpx.Response(200, headers=headers))
    with client(backend, clock) as http:
        for _ in range(4):  # slots at 0, 0 (the quota's first), 20, 40
            http.get("https://api.github.example/")
    assert clock.sleeps == [pytest.approx(20.0, abs=1.0), pytest.approx(20.0, abs=1.0)]


def test_pacing_off_with_one_keyword(clock: FakeClock) -> None:
    """pacing=False: quota headers are ignored."""
    reset = str(int(clock.time()) + 100)
    headers = {"x-ratelimit-limit": "100", "x-ratelimit-remaining": "5", "x-ratelimit-reset": reset}
    backend = Backend(httpx.Response(200, headers=headers))
    with client(backend, clock, pacing=False) as http:
        for _ in range(3):
            http.get("https://api.github.example/")
    assert clock.sleeps == []


def test_bulkhead_per_origin(clock: FakeClock) -> None:
    """With a bulkhead of 1 and no wait, a second concurrent request is refused."""
    entered, release = threading.Event(), threading.Event()

    def slow(request: httpx.Request) -> httpx.Response:
        entered.set()
        release.wait(10)
        return httpx.Response(200)

    transport = RetryTransport(
        httpx.MockTransport(slow), clock=clock, bulkhead={"limit": 1, "max_wait": 0.0}
    )
    with httpx.Client(transport=transport) as http:
        first = threading.Thread(target=http.get, args=("https://api.example/",))
        first.start()
        assert entered.wait(10)
        with pytest.raises(BulkheadFull):
            http.get("https://api.example/")
        release.set()
        first.join(10)
        assert http.get("https://api.example/").status_code == 200


def test_guards_can_be_shared_between_clients(clock: FakeClock) -> None:
    """Two clients given one OriginGuards share the origin's breaker."""
    guards = OriginGuards(breaker={"min_calls": 2}, clock=clock)
    backend = Backend(httpx.Response(502))
    with client(backend, clock, guards=guards) as a, client(backend, clock, guards=guards) as b:
        a.get("https://sick.example/")
        b.get("https://sick.example/")
        with pytest.raises(CircuitOpen):
            a.get("https://sick.example/")


async def test_async_client_breaker_and_cooldown(clock: FakeClock) -> None:
    """The async path applies the same breaker and cooldown."""
    backend = Backend(httpx.Response(429, headers={"Retry-After": "60"}))
    transport = RetryTransport(
        httpx.MockTransport(backend), policy=RetryPolicy(attempts=1, deadline=5.0), clock=clock
    )
    async with httpx.AsyncClient(transport=transport) as http:
        assert (await http.get("https://api.example/")).status_code == 429
        with pytest.raises(RateLimited):
            await http.get("https://api.example/")
    sick = Backend(httpx.Response(500))
    transport = RetryTransport(
        httpx.MockTransport(sick),
        policy=RetryPolicy(attempts=1),
        clock=clock,
        breaker={"min_calls": 2},
    )
    async with httpx.AsyncClient(transport=transport) as http:
        for _ in range(2):
            await http.get("https://sick.example/")
        with pytest.raises(CircuitOpen):
            await http.get("https://sick.example/")
    assert len(sick.hits) == 2


# -- requests ------------------------------------------------------------------------


class _Scripted(BaseHTTPRequestHandler):
    statuses: ClassVar[list[tuple[int, dict[str, str]]]] = []
    hits = 0

    def do_GET(self) -> None:
        cls = type(self)
        status, headers = cls.statuses[min(cls.hits, len(cls.statuses) - 1)]
        cls.hits += 1
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[tuple[str, type[_Scripted]]]:
    """A loopback HTTP server answering the statuses a test sets."""
    handler = type("Handler", (_Scripted,), {"statuses": [(200, {})], "hits": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def session(clock: FakeClock, **kwargs: Any) -> requests.Session:
    s = requests.Session()
    policy = kwargs.pop("policy", RetryPolicy(attempts=1))
    s.mount("http://", RetryAdapter(policy=policy, clock=clock, **kwargs))
    return s


def test_requests_breaker_opens(scripted: tuple[str, type[_Scripted]], clock: FakeClock) -> None:
    """The requests adapter opens the origin's breaker on 5xx."""
    url, handler = scripted
    handler.statuses = [(503, {})]
    with session(clock, breaker={"min_calls": 2}) as s:
        for _ in range(2):
            assert s.get(url).status_code == 503
        with pytest.raises(CircuitOpen):
            s.get(url)
    assert handler.hits == 2


def test_requests_cooldown_fails_fast(
    scripted: tuple[str, type[_Scripted]], clock: FakeClock
) -> None:
    """A 429 hint pauses the origin for the requests adapter too."""
    url, handler = scripted
    handler.statuses = [(429, {"Retry-After": "120"}), (200, {})]
    with session(clock, policy=RetryPolicy(attempts=1, deadline=10.0)) as s:
        assert s.get(url).status_code == 429
        with pytest.raises(RateLimited):
            s.get(url)
    assert handler.hits == 1


def test_requests_everything_off(scripted: tuple[str, type[_Scripted]], clock: FakeClock) -> None:
    """All protections off: the adapter behaves as a plain retrying adapter."""
    url, handler = scripted
    handler.statuses = [(500, {})]
    off = {"breaker": False, "budget": False, "bulkhead": False, "cooldown": False, "pacing": False}
    with session(clock, **off) as s:
        for _ in range(15):
            assert s.get(url).status_code == 500
    assert handler.hits == 15


@pytest.mark.redis
def test_cooldown_shared_by_two_clients_through_redis(
    redis_url: str, key_prefix: str, clock: FakeClock
) -> None:
    """With store=RedisStore, a 429 seen by one client pauses another (any process)."""
    from stormguard.stores import RedisStore

    with (
        RedisStore(redis_url, prefix=key_prefix) as store_a,
        RedisStore(redis_url, prefix=key_prefix) as store_b,
    ):
        limited = Backend(httpx.Response(429, headers={"Retry-After": "60"}))
        other = Backend(httpx.Response(200))
        policy = RetryPolicy(attempts=1, deadline=5.0)
        with (
            client(limited, clock, policy=policy, store=store_a) as a,
            client(other, clock, policy=policy, store=store_b) as b,
        ):
            assert a.get("https://api.example/").status_code == 429
            with pytest.raises(RateLimited) as info:
                b.get("https://api.example/")
            assert 55.0 < info.value.retry_after <= 60.0
        assert other.hits == []


def test_default_protection_is_shared_by_the_whole_process() -> None:
    """Two clients with default protection share one breaker per origin; custom ones do not."""
    a = RetryTransport(httpx.MockTransport(lambda request: httpx.Response(200)))
    b = RetryTransport(httpx.MockTransport(lambda request: httpx.Response(200)))
    custom = RetryTransport(breaker={"min_calls": 5})
    assert a.guards is b.guards
    assert a.guards.get("https://api.example.com").breaker is (
        b.guards.get("https://api.example.com").breaker
    )
    assert custom.guards is not a.guards
