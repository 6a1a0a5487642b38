"""Issue 16: RetryError's response facts, the body excerpt size, OTel, pacing/cooldown lines."""

from __future__ import annotations

import httpx
import pytest
import requests
from http_support import ScriptedServer, Step

from stormguard import ConfigError, GiveUpReason, RetryError, RetryPolicy, RetryRecord, retry
from stormguard.httpx import RetryTransport
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
