"""A keyed request's 409 + Retry-After (an idempotency layer's "the first request
with this key is still running") is retried after the hint, by every front end;
any other 409 is an answer."""

from __future__ import annotations

import httpx
import pytest
from http_support import (
    ScriptedServer,
    Sender,
    Step,
)

from stormguard import Constant, RetryError, RetryPolicy, retry
from stormguard.testing import FakeClock

POLICY = RetryPolicy(attempts=4, backoff=Constant(0.25, 0.25), deadline=60)
IN_FLIGHT = Step(409, {"Retry-After": "2"}, b'{"title": "Conflict"}')


def test_a_keyed_post_in_flight_is_retried_after_the_hint(
    server: ScriptedServer, send: Sender
) -> None:
    """POST with an Idempotency-Key: 409 + Retry-After: 2, then the replayed 201."""
    server.script(IN_FLIGHT, Step(201, {"Idempotent-Replayed": "true"}))
    clock = FakeClock()
    headers = {"Idempotency-Key": "pay-1"}
    result = send(server.url, method="POST", policy=POLICY, clock=clock, headers=headers)
    assert result.status == 201 and len(server.received) == 2
    assert len(clock.sleeps) == 1 and 2.0 <= clock.sleeps[0] <= 2.2
    assert result.records[0].hint_used


def test_a_generated_key_counts_as_a_key(server: ScriptedServer, send: Sender) -> None:
    """idempotency_keys=True: the key the adapter added makes the 409 retryable."""
    server.script(IN_FLIGHT, Step(201))
    result = send(
        server.url, method="POST", policy=POLICY, clock=FakeClock(), idempotency_keys=True
    )
    assert result.status == 201 and len(server.received) == 2


def test_an_unkeyed_409_is_an_answer(server: ScriptedServer, send: Sender) -> None:
    """Without a key a 409 is the server's answer (a real conflict): one attempt."""
    server.script(IN_FLIGHT, Step(201))
    result = send(server.url, method="POST", policy=POLICY, clock=FakeClock())
    assert result.status == 409 and len(server.received) == 1


def test_a_keyed_409_without_a_hint_is_an_answer(server: ScriptedServer, send: Sender) -> None:
    """No Retry-After: not the in-flight answer, nothing says when to come back."""
    server.script(Step(409), Step(201))
    headers = {"Idempotency-Key": "pay-1"}
    result = send(server.url, method="POST", policy=POLICY, clock=FakeClock(), headers=headers)
    assert result.status == 409 and len(server.received) == 1


def test_retry_if_false_keeps_the_409(server: ScriptedServer, send: Sender) -> None:
    """retry_if can refuse it like any retryable failure."""
    server.script(IN_FLIGHT, Step(201))
    policy = POLICY.replace(retry_if=lambda response: False)
    headers = {"Idempotency-Key": "pay-1"}
    result = send(server.url, method="POST", policy=policy, clock=FakeClock(), headers=headers)
    assert result.status == 409 and len(server.received) == 1


def test_the_decorator_retries_a_keyed_409_it_sees_raised() -> None:
    """@retry around raise_for_status(): a keyed 409 + Retry-After is retried."""
    request = httpx.Request("POST", "https://api.example/pay", headers={"Idempotency-Key": "k"})
    in_flight = httpx.Response(409, headers={"Retry-After": "1"}, request=request)
    answers = [in_flight, httpx.Response(201, request=request)]
    clock = FakeClock()

    @retry(on=httpx.HTTPStatusError, policy=POLICY, clock=clock)
    def pay() -> int:
        return answers.pop(0).raise_for_status().status_code

    assert pay() == 201 and 1.0 <= clock.sleeps[0] <= 1.1

    unkeyed = httpx.Request("POST", "https://api.example/pay")
    conflict = httpx.Response(409, headers={"Retry-After": "1"}, request=unkeyed)

    @retry(on=httpx.HTTPStatusError, policy=POLICY, clock=FakeClock())
    def pay_unkeyed() -> int:
        return conflict.raise_for_status().status_code

    with pytest.raises(RetryError):
        pay_unkeyed()
