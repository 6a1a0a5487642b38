"""Issue 16: RetryError's response facts, the body excerpt size, OTel, pacing/cooldown lines."""

from __future__ import annotations

import logging
import random

import httpx
import pytest
import requests
from http_support import ScriptedServer, Step

from stormguard import (
    ConfigError,
    GiveUpReason,
    RateLimited,
    RetryError,
    RetryPolicy,
    RetryRecord,
    retry,
)
from stormguard.httpx import RetryTransport
from stormguard.protection import Cooldown, OriginGuard, Pacer
from stormguard.requests import RetryAdapter
from stormguard.testing import FakeClock

LIMIT_BODY = b'{"message": "API rate limit exceeded for user ID 1"}'
EXHAUSTED = {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "7"}


def limited_error(body: bytes = LIMIT_BODY) -> httpx.HTTPStatusError:
    """A 429 HTTPStatusError with an exhausted quota and a JSON body naming the limit."""
    request = httpx.Request("GET", "https://api.example/x")
    headers = {**EXHAUSTED, "Retry-After": "86400", "Content-Type": "application/json"}
    response = httpx.Response(429, headers=headers, content=body, request=request)
    return httpx.HTTPStatusError("too many", request=request, response=response)


def test_retry_error_carries_the_last_response_body_and_quota() -> None:
    """A give-up on a response-carrying error fills RetryError.response_body and .quota."""

    @retry(on=httpx.HTTPStatusError, clock=FakeClock())
    def call() -> None:
        raise limited_error()

    with pytest.raises(RetryError) as info:
        call()
    error = info.value
    assert error.reason == GiveUpReason.HINT_TOO_LONG
    assert error.response_body is not None and "API rate limit exceeded" in error.response_body
    assert error.quota is not None and error.quota.remaining == 0 and error.quota.limit == 60


def test_retry_error_without_a_response_has_no_body() -> None:
    """A plain exception leaves response_body and quota None."""

    @retry(on=ValueError, attempts=2, clock=FakeClock())
    def call() -> None:
        raise ValueError("nope")

    with pytest.raises(RetryError) as info:
        call()
    assert info.value.response_body is None and info.value.quota is None


def test_retry_error_body_is_cut_past_4_kib() -> None:
    """A long body is excerpted at 4096 characters with a cut marker."""

    @retry(on=httpx.HTTPStatusError, clock=FakeClock())
    def call() -> None:
        raise limited_error(b"x" * 10_000)

    with pytest.raises(RetryError) as info:
        call()
    body = info.value.response_body
    assert body is not None and body.startswith("x" * 4096) and "10000 bytes" in body


@pytest.mark.parametrize("size", [-1, 64 * 1024 + 1, 1.5, True, "4096"])
@pytest.mark.parametrize("adapter", [RetryTransport, RetryAdapter])
def test_body_excerpt_is_validated(adapter: type, size: object) -> None:
    """body_excerpt outside [0, 64 KiB] or not an int raises ConfigError naming it."""
    with pytest.raises(ConfigError) as info:
        adapter(body_excerpt=size)
    assert info.value.field == "body_excerpt"


def _records_httpx(url: str, body_excerpt: int) -> list[RetryRecord]:
    records: list[RetryRecord] = []
    transport = RetryTransport(
        policy=RetryPolicy(attempts=2),
        clock=FakeClock(),
        on_retry=records.append,
        body_excerpt=body_excerpt,
    )
    with httpx.Client(transport=transport, timeout=10) as client:
        client.get(url)
    return records


def _records_requests(url: str, body_excerpt: int) -> list[RetryRecord]:
    records: list[RetryRecord] = []
    adapter = RetryAdapter(
        policy=RetryPolicy(attempts=2),
        clock=FakeClock(),
        on_retry=records.append,
        body_excerpt=body_excerpt,
    )
    with requests.Session() as session:
        session.mount("http://", adapter)
        session.get(url, timeout=10)
    return records


@pytest.mark.parametrize("records_of", [_records_httpx, _records_requests])
@pytest.mark.parametrize(("size", "expected"), [(10, '{"message"'), (0, None)])
def test_body_excerpt_size_is_configurable(
    server: ScriptedServer, records_of: object, size: int, expected: str | None
) -> None:
    """The adapters' body_excerpt bounds the record's body (0 leaves it out)."""
    server.script(Step(429, {"Retry-After": "1"}, LIMIT_BODY), Step(200))
    assert callable(records_of)
    records = records_of(server.url, size)
    assert len(records) == 1
    body = records[0].body
    if expected is None:
        assert body is None
    else:
        assert body is not None and body.startswith(expected) and "bytes in all" in body


ORIGIN = "https://api.example"


def guard_with(clock: FakeClock) -> OriginGuard:
    """An origin guard with only a cooldown and pacing, on the fake clock."""
    return OriginGuard(
        ORIGIN,
        breaker=None,
        budget=None,
        bulkhead=None,
        cooldown=Cooldown(clock=clock),
        pacer=Pacer(clock=clock),
        clock=clock,
        rng=random.Random(7),
    )


def told(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    """The INFO records of the stormguard logger for ``event``."""
    return [
        record
        for record in caplog.records
        if record.levelno == logging.INFO
        and getattr(record, "stormguard", {}).get("event") == event
    ]


def test_a_cooldown_says_so_once_per_episode(caplog: pytest.LogCaptureFixture) -> None:
    """Three delayed requests, one line; after the pause ends, a new pause, a new line."""
    caplog.set_level(logging.INFO, logger="stormguard")
    clock = FakeClock()
    guard = guard_with(clock)
    guard.observe(429, [("Retry-After", "10")])
    waits = [guard.wait_before(60.0) for _ in range(3)]
    assert all(wait >= 10.0 for wait in waits)
    clock.advance(20)
    assert guard.wait_before(60.0) == 0.0
    guard.observe(429, [("Retry-After", "5")])
    guard.wait_before(60.0)
    lines = told(caplog, "cooldown")
    assert len(lines) == 2
    assert ORIGIN in lines[0].getMessage() and "10.000s" in lines[0].getMessage()
    assert lines[0].stormguard["wait"] == 10.0 and lines[0].stormguard["refused"] is False


def test_a_cooldown_refusal_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    """Requests refused by a day-long pause (capped at max_pause): one line marked refused."""
    caplog.set_level(logging.INFO, logger="stormguard")
    guard = guard_with(FakeClock())
    guard.observe(429, [("Retry-After", "86400")])
    for _ in range(3):
        with pytest.raises(RateLimited):
            guard.wait_before(60.0)
    (line,) = told(caplog, "cooldown")
    assert line.stormguard["refused"] is True and "3600.000s" in line.getMessage()


def test_pacing_says_so_once_with_the_quota(caplog: pytest.LogCaptureFixture) -> None:
    """A nearly spent GitHub quota paces requests: one line naming the quota and the wait."""
    caplog.set_level(logging.INFO, logger="stormguard")
    clock = FakeClock()
    guard = guard_with(clock)
    headers = [
        ("x-ratelimit-limit", "5000"),
        ("x-ratelimit-remaining", "10"),
        ("x-ratelimit-reset", str(int(clock.time()) + 100)),
        ("x-ratelimit-resource", "core"),
    ]
    guard.observe(200, headers)
    waits = [guard.wait_before(60.0) for _ in range(4)]
    assert waits[-1] > 0
    (line,) = told(caplog, "pacing")
    assert "core" in line.getMessage() and line.stormguard["quotas"] == ["core"]
