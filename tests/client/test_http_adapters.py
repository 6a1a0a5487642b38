"""httpx (sync and async) and requests adapters against a real server on loopback."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
import pytest
import requests
from http_support import (
    ScriptedServer,
    Sender,
    Step,
)

from stormguard import Constant, FullJitter, RetryPolicy
from stormguard.httpx import RetryTransport
from stormguard.requests import RetryAdapter
from stormguard.testing import FakeClock

FAST = RetryPolicy(attempts=5, backoff=Constant(0.25, 0.25), deadline=30)


def test_503_503_200_takes_three_attempts(server: ScriptedServer, send: Sender) -> None:
    """503, 503, 200 -> 200 after exactly 3 attempts."""
    server.script(Step(503), Step(503), Step(200))
    clock = FakeClock()
    result = send(server.url + "/x", policy=FAST, clock=clock)
    assert result.status == 200
    assert len(server.received) == 3
    assert [r.attempt for r in result.records] == [1, 2]
    assert clock.sleeps == [0.25, 0.25]


def test_retry_after_is_obeyed_in_real_time(server: ScriptedServer, send: Sender) -> None:
    """429 with Retry-After: 1 -> the next attempt arrives at least 1 s later."""
    server.script(Step(429, {"Retry-After": "1"}), Step(200))
    result = send(server.url, policy=FAST)
    assert result.status == 200
    first, second = server.received
    assert second.at - first.at >= 1.0
    assert result.records[0].hint_used and 1.0 <= result.records[0].wait <= 1.1


def test_400_is_final(server: ScriptedServer, send: Sender) -> None:
    """400 -> one attempt, returned as it is."""
    server.script(Step(400))
    result = send(server.url, policy=FAST, clock=FakeClock())
    assert result.status == 400 and len(server.received) == 1


def test_unkeyed_post_502_is_not_retried(server: ScriptedServer, send: Sender) -> None:
    """POST 502 without an Idempotency-Key -> one attempt."""
    server.script(Step(502), Step(200))
    result = send(server.url, method="POST", content=b"{}", policy=FAST, clock=FakeClock())
    assert result.status == 502 and len(server.received) == 1


def test_unkeyed_post_429_is_retried(server: ScriptedServer, send: Sender) -> None:
    """POST 429 proves nothing was processed: it is retried even without a key."""
    server.script(Step(429), Step(201))
    result = send(server.url, method="POST", content=b"{}", policy=FAST, clock=FakeClock())
    assert result.status == 201 and len(server.received) == 2


def test_generated_idempotency_key_is_reused(server: ScriptedServer, send: Sender) -> None:
    """POST with idempotency_keys=True is retried with the same key on every attempt."""
    server.script(Step(502), Step(503), Step(201))
    result = send(
        server.url,
        method="POST",
        content=b'{"amount": 5}',
        policy=FAST,
        clock=FakeClock(),
        idempotency_keys=True,
    )
    assert result.status == 201
    keys = {r.headers.get("Idempotency-Key") for r in server.received}
    assert len(server.received) == 3 and len(keys) == 1 and None not in keys
    assert {r.body for r in server.received} == {b'{"amount": 5}'}


def test_caller_key_is_kept(server: ScriptedServer, send: Sender) -> None:
    """A caller's own Idempotency-Key is sent unchanged and makes the POST retryable."""
    server.script(Step(503), Step(201))
    result = send(
        server.url,
        method="POST",
        content=b"x",
        policy=FAST,
        clock=FakeClock(),
        headers={"Idempotency-Key": "order-42"},
    )
    assert result.status == 201
    assert [r.headers["Idempotency-Key"] for r in server.received] == ["order-42"] * 2


def test_each_logical_request_gets_its_own_key(server: ScriptedServer, send: Sender) -> None:
    """Two logical POSTs get two different keys."""
    server.script(Step(201))
    for _ in range(2):
        send(server.url, method="POST", content=b"x", policy=FAST, idempotency_keys=True)
    keys = [r.headers["Idempotency-Key"] for r in server.received]
    assert len(keys) == 2 and keys[0] != keys[1]


def test_huge_retry_after_returns_at_once(server: ScriptedServer, send: Sender) -> None:
    """Retry-After: 86400 -> the 429 is returned at once, nothing slept."""
    server.script(Step(429, {"Retry-After": "86400"}), Step(200))
    clock = FakeClock()
    result = send(server.url, policy=FAST, clock=clock)
    assert result.status == 429 and len(server.received) == 1 and clock.sleeps == []


def test_deadline_bounds_the_whole_call(server: ScriptedServer, send: Sender) -> None:
    """A 2 s deadline against a server that keeps failing -> done within 2 s."""
    server.script(Step(503))
    policy = RetryPolicy(attempts=1000, backoff=FullJitter(0.05, 1.0), deadline=2)
    started = time.monotonic()
    result = send(server.url, policy=policy)
    elapsed = time.monotonic() - started
    assert result.status == 503
    assert elapsed < 2.0 + 1.0  # slack for thread scheduling on a busy machine
    assert len(server.received) >= 2


def test_deadline_cuts_a_hanging_attempt(server: ScriptedServer, send: Sender) -> None:
    """An attempt that hangs is cut at the deadline instead of the client's 10 s timeout."""
    server.script(Step(200, delay=5))
    policy = RetryPolicy(attempts=3, deadline=1)
    started = time.monotonic()
    result = send(server.url, policy=policy)
    assert result.error is not None
    assert time.monotonic() - started < 4


def test_connection_refused_is_retried_even_for_post(dead_url: str, send: Sender) -> None:
    """A POST that never reached the server is retried; the last error is raised."""
    clock = FakeClock()
    result = send(
        dead_url,
        method="POST",
        content=b"x",
        policy=RetryPolicy(attempts=3, backoff=Constant(0.5, 0.5)),
        clock=clock,
    )
    assert result.error is not None and result.status is None
    assert len(result.records) == 2 and clock.sleeps == [0.5, 0.5]
    assert "not sent" in result.records[0].reason


def test_one_shot_body_is_never_retried(server: ScriptedServer, send: Sender) -> None:
    """A streamed (generator) body cannot be replayed, so a 503 is returned after one attempt."""
    server.script(Step(503), Step(200))
    result = send(
        server.url, method="PUT", content=iter([b"a", b"b"]), policy=FAST, clock=FakeClock()
    )
    assert result.status == 503 and len(server.received) == 1


def test_retries_are_logged(
    server: ScriptedServer, send: Sender, caplog: pytest.LogCaptureFixture
) -> None:
    """Each retry is logged on the 'stormguard' logger with the reason and the wait."""
    server.script(Step(503), Step(200))
    with caplog.at_level(logging.INFO, logger="stormguard"):
        send(server.url + "/path?token=secret", policy=FAST, clock=FakeClock())
    messages = [r.getMessage() for r in caplog.records if r.name == "stormguard"]
    assert len(messages) == 1
    assert "status 503" in messages[0] and "0.250s" in messages[0]
    assert "secret" not in messages[0]


class RecordingTransport(httpx.BaseTransport):
    """Wraps a real transport and keeps every response it returned."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.responses: list[httpx.Response] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        self.responses.append(response)
        return response

    def close(self) -> None:
        self.inner.close()


def test_failed_responses_are_closed_before_the_next_attempt(server: ScriptedServer) -> None:
    """Every failed response is closed; the returned one is left open for the caller."""
    server.script(Step(503), Step(503), Step(200))
    inner = RecordingTransport()
    transport = RetryTransport(inner, policy=FAST, clock=FakeClock())
    with httpx.Client(transport=transport) as client, client.stream("GET", server.url) as response:
        assert [r.is_closed for r in inner.responses] == [True, True, False]
        assert response.read() == b"ok"


def test_close_is_forwarded(server: ScriptedServer) -> None:
    """Closing the client closes the inner transport."""
    inner = RecordingTransport()
    closed: list[bool] = []
    inner.close = lambda: closed.append(True)  # type: ignore[method-assign]
    with httpx.Client(transport=RetryTransport(inner)):
        pass
    assert closed == [True]


def test_requests_adapter_rejects_max_retries() -> None:
    """urllib3 retries are off: passing max_retries is an error, not a silent double retry."""
    with pytest.raises(TypeError, match="max_retries"):
        RetryAdapter(max_retries=3)


HOSTILE = [
    {"Retry-After": "86400"},
    {"Retry-After": "9999999999"},
    {"Retry-After": "-1"},
    {"Retry-After": "soon, I promise"},
    {"Retry-After": "Sun, 06 Nov 1994 08:49:37 GMT"},
    {"Retry-After": "Fri, 01 Jan 2100 00:00:00 GMT"},
    {"Retry-After": "1" * 10_000},
    {"Retry-After": "9" * 400 + ".5"},
    {"Retry-After": "nan"},
    {"Retry-After": "inf"},
    {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "99999999999999999999"},
    {"RateLimit": "x;r=0;t=" + "9" * 5000},
    {"RateLimit-Policy": '"' * 3000},
]


@pytest.mark.parametrize("headers", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_headers_never_crash_or_oversleep(
    server: ScriptedServer, send: Sender, headers: dict[str, str]
) -> None:
    """Hostile wait headers neither raise nor make the client sleep past its deadline."""
    server.script(Step(503, headers), Step(503, headers), Step(200))
    clock = FakeClock()
    policy = RetryPolicy(attempts=3, deadline=30, max_wait=60)
    result = send(server.url, policy=policy, clock=clock)
    assert result.error is None
    assert result.status in (200, 503)
    assert sum(clock.sleeps) < 30
    assert all(wait >= 0 for wait in clock.sleeps)


def test_wait_hint_from_a_429_body(server: ScriptedServer, send: Sender) -> None:
    """Without headers, a Discord-style JSON body sets the wait."""
    body = b'{"message": "You are being rate limited.", "retry_after": 0.75}'
    server.script(Step(429, {"Content-Type": "application/json"}, body=body), Step(200))
    clock = FakeClock()
    result = send(server.url, policy=FAST, clock=clock)
    assert result.status == 200
    assert len(clock.sleeps) == 1 and 0.75 <= clock.sleeps[0] <= 0.825
    assert result.records[0].hint_used


def test_one_shot_body_transport_error_is_never_retried(dead_url: str, send: Sender) -> None:
    """Every adapter ends a one-shot-body request at its first transport error, no retry."""
    clock = FakeClock()
    result = send(dead_url, method="PUT", content=iter([b"a", b"b"]), policy=FAST, clock=clock)
    assert result.error is not None and result.records == [] and clock.sleeps == []


def test_one_shot_body_beats_should_retry_and_retry_if(
    server: ScriptedServer, send: Sender
) -> None:
    """A body that cannot be replayed is not retried even when the server or retry_if says so."""
    server.script(Step(503, {"x-should-retry": "true"}), Step(200))
    policy = FAST.replace(retry_if=lambda subject: True)
    result = send(
        server.url, method="PUT", content=iter([b"a", b"b"]), policy=policy, clock=FakeClock()
    )
    assert result.status == 503 and len(server.received) == 1 and result.records == []


def test_retry_if_retries_a_409_on_get(server: ScriptedServer, send: Sender) -> None:
    """retry_if sees the response: True makes a 409 (outside the table) retryable on GET."""
    server.script(Step(409), Step(200))
    seen: list[int] = []

    def retry_if(response: Any) -> bool | None:
        seen.append(response.status_code)
        return True if response.status_code == 409 else None

    result = send(server.url, policy=FAST.replace(retry_if=retry_if), clock=FakeClock())
    assert result.status == 200 and len(server.received) == 2 and seen == [409]


def test_retry_if_tells_bad_credentials_403_from_a_rate_limit(
    server: ScriptedServer, send: Sender
) -> None:
    """retry_if=False on a failure the table would retry: returned after one attempt."""
    server.script(Step(503, body=b"Bad credentials"), Step(200))

    def retry_if(response: Any) -> bool | None:
        return False if b"Bad credentials" in response.content else None

    result = send(server.url, policy=FAST.replace(retry_if=retry_if), clock=FakeClock())
    assert result.status == 503 and len(server.received) == 1


def test_retry_if_cannot_retry_an_unkeyed_post_that_may_have_been_processed(
    server: ScriptedServer, send: Sender
) -> None:
    """retry_if=True does not repeat an unkeyed POST whose 503 may mean 'processed'."""
    server.script(Step(503), Step(201))
    policy = FAST.replace(retry_if=lambda response: True)
    result = send(server.url, method="POST", content=b"{}", policy=policy, clock=FakeClock())
    assert result.status == 503 and len(server.received) == 1


def test_should_retry_true_beats_the_table_in_every_adapter(
    server: ScriptedServer, send: Sender
) -> None:
    """x-should-retry: true retries even an unkeyed POST 503; false never retries a 429."""
    server.script(Step(503, {"x-should-retry": "true"}), Step(429, {"x-should-retry": "false"}))
    result = send(server.url, method="POST", content=b"{}", policy=FAST, clock=FakeClock())
    assert result.status == 429 and len(server.received) == 2


@pytest.mark.parametrize("adapter", ["httpx", "requests"])
def test_retry_if_keyword_on_the_adapters(server: ScriptedServer, adapter: str) -> None:
    """RetryTransport(retry_if=...) and RetryAdapter(retry_if=...) join it to the policy."""
    server.script(Step(409), Step(200))

    def retry_if(response: Any) -> bool | None:
        return response.status_code == 409 or None

    if adapter == "httpx":
        transport = RetryTransport(policy=FAST, retry_if=retry_if, clock=FakeClock())
        with httpx.Client(transport=transport) as client:
            status = client.get(server.url).status_code
    else:
        with requests.Session() as session:
            session.mount(
                "http://", RetryAdapter(policy=FAST, retry_if=retry_if, clock=FakeClock())
            )
            status = session.get(server.url, timeout=10).status_code
    assert status == 200 and len(server.received) == 2


def test_giving_up_is_logged_once_at_warning(
    server: ScriptedServer, send: Sender, caplog: pytest.LogCaptureFixture
) -> None:
    """Retry-After: 86400 -> one WARNING give-up line with the reason, status and hint."""
    server.script(Step(429, {"Retry-After": "86400"}))
    with caplog.at_level(logging.INFO, logger="stormguard"):
        result = send(server.url + "/x?api_key=secret", policy=FAST, clock=FakeClock())
    assert result.status == 429
    warnings = [r for r in caplog.records if r.name == "stormguard"]
    assert [r.levelno for r in warnings] == [logging.WARNING]
    message = warnings[0].getMessage()
    assert "hint too long" in message and "status 429" in message and "secret" not in message
    fields = warnings[0].stormguard  # type: ignore[attr-defined]
    assert fields["event"] == "give_up" and fields["reason"] == "hint too long"
    assert fields["attempts"] == 1 and fields["hint"] == 86400.0


def test_retry_records_travel_as_structured_fields(
    server: ScriptedServer, send: Sender, caplog: pytest.LogCaptureFixture
) -> None:
    """Each retry line carries extra={'stormguard': {...}} with stable field names."""
    server.script(Step(503), Step(200))
    with caplog.at_level(logging.INFO, logger="stormguard"):
        send(server.url, policy=FAST, clock=FakeClock())
    (record,) = [r for r in caplog.records if r.name == "stormguard"]
    fields = record.stormguard  # type: ignore[attr-defined]
    assert set(fields) == {
        "event",
        "attempt",
        "wait",
        "reason",
        "hint_used",
        "hint",
        "elapsed",
        "target",
        "body",
        "quota",
    }
    assert fields["event"] == "retry" and fields["reason"] == "status 503"


LIMIT_BODY = b'{"message": "API rate limit exceeded for user ID 42."}'
GITHUB_LIMIT = {
    "Retry-After": "1",
    "Content-Type": "application/json",
    "X-RateLimit-Limit": "5000",
    "X-RateLimit-Remaining": "0",
    "X-RateLimit-Resource": "core",
    "X-RateLimit-Reset-After": "1",
}


def test_the_retry_line_names_the_limit_from_the_body_and_the_quota(
    server: ScriptedServer, send: Sender, caplog: pytest.LogCaptureFixture
) -> None:
    """429 + Retry-After + a JSON body naming the limit: the INFO line and record carry both."""
    server.script(Step(429, GITHUB_LIMIT, body=LIMIT_BODY), Step(200))
    with caplog.at_level(logging.INFO, logger="stormguard"):
        result = send(server.url, policy=FAST, clock=FakeClock())
    assert result.status == 200
    (record,) = result.records
    assert record.body is not None and "rate limit exceeded for user ID 42" in record.body
    assert record.quota is not None and record.quota.remaining == 0
    assert record.quota.limit == 5000
    (line,) = [r.getMessage() for r in caplog.records if r.name == "stormguard"]
    assert "API rate limit exceeded for user ID 42" in line and "0/5000" in line


def test_the_give_up_line_carries_the_body(
    server: ScriptedServer, send: Sender, caplog: pytest.LogCaptureFixture
) -> None:
    """Retry-After: 86400 with a body: one WARNING line that quotes the body."""
    server.script(Step(429, {**GITHUB_LIMIT, "Retry-After": "86400"}, body=LIMIT_BODY))
    with caplog.at_level(logging.INFO, logger="stormguard"):
        send(server.url, policy=FAST, clock=FakeClock())
    (record,) = [r for r in caplog.records if r.name == "stormguard"]
    assert record.levelno == logging.WARNING
    assert "user ID 42" in record.getMessage()
    assert "user ID 42" in record.stormguard["body"]  # type: ignore[attr-defined]


def test_credentials_never_reach_a_record(
    server: ScriptedServer, send: Sender, caplog: pytest.LogCaptureFixture
) -> None:
    """An Authorization header and an ?api_key= value appear in no log record or hook record."""
    server.script(Step(429, GITHUB_LIMIT, body=LIMIT_BODY), Step(429, {"Retry-After": "86400"}))
    with caplog.at_level(logging.DEBUG, logger="stormguard"):
        result = send(
            server.url + "/v1?api_key=sk-secret-1",
            policy=FAST,
            clock=FakeClock(),
            headers={"Authorization": "Bearer tok-secret-2"},
        )
    texts = [r.getMessage() + repr(r.__dict__) for r in caplog.records] + [
        repr(r) for r in result.records
    ]
    assert texts and not any("secret" in text for text in texts)


def test_a_body_cut_off_mid_read_is_retried_as_a_read_failure(
    server: ScriptedServer, send: Sender
) -> None:
    """A 503 whose body breaks off mid-read fails as a read error: a GET is retried."""
    server.script(Step(503, body=b"x" * 200, cut_body_at=10), Step(200))
    clock = FakeClock()
    result = send(server.url, policy=RetryPolicy(attempts=2), clock=clock)
    assert (result.status, result.error) == (200, None)
    assert len(server.received) == 2


def test_a_body_cut_off_on_the_last_attempt_raises_the_read_error(
    server: ScriptedServer, send: Sender
) -> None:
    """The last attempt's broken body surfaces as the client library's own error."""
    server.script(Step(503, body=b"x" * 200, cut_body_at=10))
    result = send(server.url, policy=RetryPolicy(attempts=1), clock=FakeClock())
    assert result.status is None
    assert result.error is not None
