"""The gateway's upstream attempts, run by the clients' retry conversation
(core/_engine.Conversation, gateway/_retries.py): the decision table, the budget
and the breaker on the wire, Retry-Attempt upstream, x-should-retry after giving up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from net_support import refused_port
from stormguard import CircuitOpen, RetryPolicy
from stormguard.core._engine import Outcome
from stormguard.core._policy import RetryFailure
from stormguard.gateway._retries import drive, gave_up, numbered, policy_of, stale_resend
from stormguard.httpx import RetryTransport
from stormguard.testing import FakeClock

Factory = Callable[..., Any]


def _gateway(gateway_factory: Factory, targets: list[str], **upstream: Any) -> Any:
    return gateway_factory(
        {
            "upstreams": {"a": {"targets": targets, **upstream}},
            "routes": [{"path": "/", "upstream": "a"}],
        }
    )


def _dead_url() -> str:
    """A loopback address nobody listens on (a connect failure)."""
    return f"http://127.0.0.1:{refused_port()}"


@pytest.mark.parametrize(
    ("method", "headers", "sends"),
    [
        ("GET", {}, 3),
        ("DELETE", {}, 3),
        ("POST", {}, 1),  # may have been processed: never repeated unkeyed
        ("PATCH", {}, 1),
        ("POST", {"Idempotency-Key": "k-1"}, 3),  # keyed: safe to repeat
    ],
)
def test_a_503_is_retried_as_the_table_says(
    upstream_factory: Factory,
    gateway_factory: Factory,
    method: str,
    headers: dict[str, str],
    sends: int,
) -> None:
    """A 503 is retried for idempotent and keyed requests, not for an unkeyed POST;
    the answer after giving up says x-should-retry: false, a first answer does not."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, [up.url], retries={"attempts": 3, "budget": 1})
    r = httpx.request(method, f"{gw.url}/status/503", headers=headers)
    assert r.status_code == 503
    assert up.seen()["n"] == sends
    assert r.headers.get("x-should-retry") == ("false" if sends > 1 else None)


@pytest.mark.parametrize("method", ["GET", "POST", "PATCH"])
def test_a_connect_failure_is_retried_for_any_method(
    upstream_factory: Factory, gateway_factory: Factory, method: str
) -> None:
    """Never sent: retried on the next target whatever the method; the retry says
    Retry-Attempt: 2."""
    up = upstream_factory()
    gw = _gateway(
        gateway_factory,
        [_dead_url(), up.url],
        retries={"attempts": 2, "budget": 1},
        eject={"failures": 5},
    )
    r = httpx.request(method, f"{gw.url}/echo", content=b"" if method == "GET" else b"body")
    assert r.status_code == 200
    seen = {k.lower(): v for k, v in r.json()["headers"].items()}
    assert seen["retry-attempt"] == "2"
    assert "x-should-retry" not in r.headers  # it did not give up


def test_a_first_attempt_carries_no_retry_attempt(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """Retry-Attempt is a retry's alone."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, [up.url], retries={"attempts": 2, "budget": 1})
    seen = {k.lower() for k in httpx.get(f"{gw.url}/echo").json()["headers"]}
    assert "retry-attempt" not in seen


def test_the_client_s_retry_attempt_is_replaced_on_a_retry(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """On the gateway's retry the upstream sees the gateway's count."""
    up = upstream_factory()
    gw = _gateway(
        gateway_factory,
        [_dead_url(), up.url],
        retries={"attempts": 2, "budget": 1},
        eject={"failures": 5},
    )
    r = httpx.get(f"{gw.url}/echo", headers={"Retry-Attempt": "7"})
    seen = [(k.lower(), v) for k, v in r.json()["headers"].items()]
    assert [v for k, v in seen if k == "retry-attempt"] == ["2"]


def test_every_target_down_gives_502_with_should_retry_false(
    gateway_factory: Factory,
) -> None:
    """Out of attempts after connect failures: 502, and the client is told not to retry."""
    gw = _gateway(gateway_factory, [_dead_url(), _dead_url()], retries={"attempts": 2, "budget": 1})
    r = httpx.post(f"{gw.url}/echo", content=b"x")
    assert r.status_code == 502
    assert r.headers["x-should-retry"] == "false"


def test_the_budget_stops_retries(upstream_factory: Factory, gateway_factory: Factory) -> None:
    """budget 0: only the reserve (1/s over 10 s) is spent, then no retry at all;
    the answers it stopped say x-should-retry: false."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, [up.url], retries={"attempts": 2, "budget": 0})
    with httpx.Client() as client:
        answers = [client.get(f"{gw.url}/status/503") for _ in range(20)]
    sends = up.seen()["n"]
    assert 20 + 5 <= sends <= 20 + 10  # the reserve's retries, never one per request
    assert all(a.status_code == 503 for a in answers)
    assert answers[-1].headers["x-should-retry"] == "false"


def test_an_open_breaker_stops_retries(upstream_factory: Factory, gateway_factory: Factory) -> None:
    """The breaker opens on the second failure: the third attempt is not sent (the
    breaker is asked before each retry, after the budget), the 503 is the answer."""
    up = upstream_factory()
    gw = _gateway(
        gateway_factory,
        [up.url],
        retries={"attempts": 3, "budget": 1},
        breaker={"failure_rate": 0.5, "min_calls": 2, "window": 30, "open_for": 30},
    )
    r = httpx.get(f"{gw.url}/status/503")
    assert r.status_code == 503 and r.text == "status"  # the upstream's last answer
    assert r.headers["x-should-retry"] == "false"
    assert up.seen()["n"] == 2
    r = httpx.get(f"{gw.url}/status/503")
    assert r.status_code == 503 and r.text != "status"  # the gateway's refusal
    assert gw.status()["upstreams"]["a"]["breaker"] == "open"
    assert up.seen()["n"] == 2


def test_three_attempts_behind_a_retrying_client_are_three_sends(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """A stormguard client with 3 attempts in front of a gateway with 3: the gateway's
    x-should-retry: false ends the client's retries, so the upstream sees 3, not 9."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, [up.url], retries={"attempts": 3, "budget": 1})
    transport = RetryTransport(policy=RetryPolicy(attempts=3), clock=FakeClock(), breaker=False)
    with httpx.Client(transport=transport) as client:
        r = client.get(f"{gw.url}/status/503")
    assert r.status_code == 503
    assert up.seen()["n"] == 3


def test_without_retries_a_503_is_sent_once(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """One attempt (the callback path's routes): the 503 goes back as it came, no verdict."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, [up.url])
    r = httpx.get(f"{gw.url}/status/503")
    assert r.status_code == 503 and "x-should-retry" not in r.headers
    assert up.seen()["n"] == 1


@pytest.mark.parametrize(
    ("method", "keyed", "resend"),
    [("GET", False, True), ("DELETE", False, True), ("POST", False, False), ("POST", True, True)],
)
def test_a_stale_connection_resend_follows_the_table(
    method: str, keyed: bool, resend: bool
) -> None:
    """The callback path's and the upstream client's resend: the maybe-processed row."""
    assert stale_resend(method, keyed) is resend


def test_numbered_headers() -> None:
    """No Retry-Attempt on a first attempt; the gateway's N in place of the client's."""
    headers = [(b"retry-attempt", b"7"), (b"x", b"1")]
    assert numbered(headers, 1) is headers
    assert numbered(headers, 3) == [(b"x", b"1"), (b"retry-attempt", b"3")]


class _Budget:
    def __init__(self, retries: int) -> None:
        self.retries = retries
        self.log: list[str] = []

    def record_request(self) -> None:
        self.log.append("count")

    def try_retry(self) -> bool:
        self.log.append("spend")
        self.retries -= 1
        return self.retries >= 0


class _Permit:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def arecord(self, failure: bool) -> None:
        self.log.append(f"record {failure}")

    async def arelease(self) -> None:
        self.log.append("release")


class _Breaker:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def acquire(self) -> _Permit:  # (RetryPolicy checks for it)
        raise AssertionError("the driver awaits")

    async def aacquire(self) -> _Permit:
        self.log.append("admit")
        return _Permit(self.log)

    async def aopen_remaining(self) -> float:
        self.log.append("peek")
        return 0.0


def test_the_driver_asks_the_budget_then_the_breaker() -> None:
    """The first attempt uses the guard's permit; each retry: budget, then breaker."""
    budget = _Budget(retries=1)
    breaker = _Breaker(budget.log)
    policy = policy_of(3, budget, breaker)
    failure = RetryFailure(True, "status 503")

    async def send(number: int) -> Outcome:
        budget.log.append(f"send {number}")
        return Outcome(failure, True)

    finish = asyncio.run(drive(policy, _Permit(budget.log), send, lambda _: None))
    assert budget.log == [
        "count",
        "send 1",
        "record True",
        "peek",
        "spend",
        "admit",
        "send 2",
        "record True",
        "peek",
        "spend",  # refused: no third attempt
    ]
    assert finish.attempts == 2 and str(finish.give_up.reason) == "retry budget exhausted"  # type: ignore[union-attr]


def test_a_send_that_raises_gives_the_permit_back() -> None:
    """The client's body failed mid-attempt: not the upstream's failure."""
    log: list[str] = []
    policy = policy_of(2, None, _Breaker(log))

    async def send(number: int) -> Outcome:
        raise ValueError("body")

    with pytest.raises(ValueError):
        asyncio.run(drive(policy, _Permit(log), send, lambda _: None))
    assert log == ["release"]


class _Refusing(_Breaker):
    async def aacquire(self) -> _Permit:
        self.log.append("admit")
        raise CircuitOpen("a", 3.0)


def test_a_refused_retry_ends_with_the_last_answer() -> None:
    """The breaker refuses the retry (half-open, its probe taken): the call ends with
    the last attempt's outcome, which the front end was told to discard -- so the
    gateway releases a discarded answer only when the next attempt goes out."""
    log: list[str] = []
    policy = policy_of(3, None, _Refusing(log))
    first = Outcome(RetryFailure(True, "status 503"), True, value="answer")
    discarded: list[Outcome] = []

    async def send(number: int) -> Outcome:
        return first

    finish = asyncio.run(drive(policy, _Permit(log), send, discarded.append))
    assert log == ["record True", "peek", "admit"]
    assert discarded == [first] and finish.outcome is first
    assert finish.attempts == 1 and str(finish.give_up.reason) == "circuit open"  # type: ignore[union-attr]
    assert gave_up(finish)  # stopped by the breaker: the client is told not to retry


def test_an_answer_asking_for_a_wait_is_not_retried_by_the_gateway() -> None:
    """The gateway never waits between attempts: a 503 with Retry-After: 5 is the
    answer (the client can wait), and the client is not told not to retry."""
    policy = policy_of(3, None, None)
    sends: list[int] = []

    async def send(number: int) -> Outcome:
        sends.append(number)
        return Outcome(RetryFailure(True, "status 503", hint=5.0), True)

    finish = asyncio.run(drive(policy, None, send, lambda _: None))
    assert sends == [1]
    assert str(finish.give_up.reason) == "hint too long"  # type: ignore[union-attr]
    assert not gave_up(finish)
