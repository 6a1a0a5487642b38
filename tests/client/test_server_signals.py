"""Issue 9 through the HTTP adapters: GitHub 403s, should-retry headers, retry_if, deadline=None."""

from __future__ import annotations

import pytest
from http_support import ScriptedServer, Sender, Step
from test_http_adapters import FAST

from stormguard import RetryPolicy
from stormguard.testing import FakeClock

WALL = 1_700_000_000  # FakeClock's wall time at monotonic 0

# (`send`, each adapter in turn, is tests/client/conftest.py's fixture)


def test_github_403_with_remaining_0_is_retried_after_the_reset(
    server: ScriptedServer, send: Sender
) -> None:
    """403 + x-ratelimit-remaining: 0 waits for x-ratelimit-reset, then retries (even a POST)."""
    limited = {
        "x-ratelimit-limit": "5000",
        "x-ratelimit-remaining": "0",
        "x-ratelimit-reset": str(WALL + 7),
    }
    server.script(Step(403, limited), Step(201))
    clock = FakeClock()
    result = send(server.url, method="POST", policy=FAST, clock=clock, content=b"{}")
    assert result.status == 201 and len(server.received) == 2
    assert result.records[0].hint == 7.0 and 7.0 <= result.records[0].wait <= 7.7


def test_github_secondary_403_with_retry_after_is_retried(
    server: ScriptedServer, send: Sender
) -> None:
    """A secondary-limit 403 carrying Retry-After is retried after it."""
    server.script(Step(403, {"Retry-After": "3"}), Step(200))
    result = send(server.url, policy=FAST, clock=FakeClock())
    assert result.status == 200 and result.records[0].hint == 3.0


def test_github_403_bad_credentials_is_returned_after_one_attempt(
    server: ScriptedServer, send: Sender
) -> None:
    """A 403 without rate-limit headers is a final answer."""
    server.script(Step(403, {"x-ratelimit-remaining": "59"}), Step(200))
    result = send(server.url, policy=FAST, clock=FakeClock())
    assert result.status == 403 and len(server.received) == 1


@pytest.mark.parametrize(
    ("status", "headers", "method", "final", "attempts"),
    [
        (503, {"x-should-retry": "false"}, "GET", 503, 1),
        (429, {"X-Should-Retry": "FALSE"}, "POST", 429, 1),
        (500, {"Stripe-Should-Retry": "true"}, "POST", 200, 2),
        (409, {"x-should-retry": "true"}, "POST", 200, 2),
    ],
    ids=["false-503-get", "false-429-post", "stripe-true-500-post", "true-409-post"],
)
def test_should_retry_headers_decide_before_the_table(
    server: ScriptedServer,
    send: Sender,
    status: int,
    headers: dict[str, str],
    method: str,
    final: int,
    attempts: int,
) -> None:
    """should-retry false: never retried; true: retried, even an unkeyed POST outside the table."""
    server.script(Step(status, headers), Step(200))
    result = send(server.url, method=method, policy=FAST, clock=FakeClock(), content=b"{}")
    assert result.status == final and len(server.received) == attempts


def test_retry_after_ms_sets_the_wait(server: ScriptedServer, send: Sender) -> None:
    """retry-after-ms: 1500 waits 1.5 s (plus hint jitter), before Retry-After: 9."""
    server.script(Step(429, {"retry-after-ms": "1500", "Retry-After": "9"}), Step(200))
    clock = FakeClock()
    result = send(server.url, policy=FAST, clock=clock)
    assert result.status == 200 and result.records[0].hint == 1.5
    assert len(clock.sleeps) == 1 and 1.5 <= clock.sleeps[0] <= 1.65


def test_retry_if_retries_a_409_on_get(server: ScriptedServer, send: Sender) -> None:
    """retry_if returning True for the response makes a 409 retryable."""
    policy = FAST.replace(
        retry_if=lambda outcome: True if getattr(outcome, "status_code", None) == 409 else None
    )
    server.script(Step(409), Step(200))
    result = send(server.url, policy=policy, clock=FakeClock())
    assert result.status == 200 and len(server.received) == 2


def test_retry_if_false_stops_a_503(server: ScriptedServer, send: Sender) -> None:
    """retry_if returning False ends the call on a status the table would retry."""
    server.script(Step(503), Step(200))
    policy = FAST.replace(retry_if=lambda outcome: False)
    result = send(server.url, policy=policy, clock=FakeClock())
    assert result.status == 503 and len(server.received) == 1


def test_deadline_none_keeps_the_caller_timeouts(server: ScriptedServer, send: Sender) -> None:
    """deadline=None: no overall deadline; the call still ends after `attempts`."""
    policy = RetryPolicy(attempts=3, deadline=None, backoff=FAST.backoff)
    server.script(Step(503), Step(503), Step(503), Step(200))
    result = send(server.url, policy=policy, clock=FakeClock())
    assert result.status == 503 and len(server.received) == 3
