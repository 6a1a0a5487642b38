"""Attempt numbers on the wire: every front end says which attempt a retry is
(``Retry-Attempt: N`` over HTTP, ``grpc-previous-rpc-attempts: N-1`` over gRPC),
as a real loopback server received them."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from http_support import (
    ScriptedServer,
    Sender,
    Step,
)

import stormguard
from stormguard import Constant, RetryPolicy
from stormguard.httpx import RetryTransport
from stormguard.testing import FakeClock

FAST = RetryPolicy(attempts=4, backoff=Constant(0.1, 0.1), deadline=30)


def _attempts(server: ScriptedServer) -> list[str | None]:
    # What each request carried, case-insensitively (None: no header).
    seen = []
    for received in server.received:
        lowered = {name.lower(): value for name, value in received.headers.items()}
        seen.append(lowered.get("retry-attempt"))
    return seen


def test_each_retry_carries_its_attempt_number(server: ScriptedServer, send: Sender) -> None:
    """503, 503, 200: the first attempt has no Retry-Attempt, the retries say 2 and 3."""
    server.script(Step(503), Step(503), Step(200))
    result = send(server.url + "/x", policy=FAST, clock=FakeClock())
    assert result.status == 200
    assert _attempts(server) == [None, "2", "3"]


def test_a_first_attempt_that_succeeds_says_nothing(server: ScriptedServer, send: Sender) -> None:
    """A plain success (the lock-free path) is sent without the header."""
    server.script(Step(200))
    assert send(server.url, policy=FAST, clock=FakeClock()).status == 200
    assert _attempts(server) == [None]


def test_a_retried_post_with_a_key_is_numbered_and_keeps_its_key(
    server: ScriptedServer, send: Sender
) -> None:
    """A keyed POST retried after 502: one key on every attempt, numbered 2 on the retry."""
    server.script(Step(502), Step(201))
    result = send(server.url, method="POST", policy=FAST, clock=FakeClock(), idempotency_keys=True)
    assert result.status == 201
    keys = {r.headers.get("Idempotency-Key") for r in server.received}
    assert len(keys) == 1 and None not in keys
    assert _attempts(server) == [None, "2"]


def test_the_callers_request_object_is_left_a_first_attempt(server: ScriptedServer) -> None:
    """A prepared request sent twice: the second call's first attempt carries no
    number left over from the first call's retries."""
    server.script(Step(503), Step(200), Step(200))
    transport = RetryTransport(policy=FAST, clock=FakeClock())
    with httpx.Client(transport=transport, timeout=10) as client:
        request = client.build_request("GET", server.url)
        assert client.send(request).status_code == 200
        assert client.send(request).status_code == 200
    assert "Retry-Attempt" not in request.headers
    assert _attempts(server) == [None, "2", None]


def test_the_decorator_tells_the_function_which_attempt_it_makes(
    server: ScriptedServer,
) -> None:
    """@retry around a raw httpx call: attempt_headers() gives each retry its number."""
    server.script(Step(503), Step(503), Step(200))
    numbers: list[int] = []

    @stormguard.retry(on=httpx.HTTPStatusError, policy=FAST, clock=FakeClock())
    def fetch() -> int:
        numbers.append(stormguard.current_attempt())
        with httpx.Client(timeout=10) as client:
            response = client.get(server.url, headers=stormguard.attempt_headers())
            return response.raise_for_status().status_code

    assert fetch() == 200
    assert numbers == [1, 2, 3]
    assert _attempts(server) == [None, "2", "3"]
    assert stormguard.current_attempt() == 1 and stormguard.attempt_headers() == {}


def test_the_async_decorator_tells_the_coroutine_which_attempt_it_makes(
    server: ScriptedServer,
) -> None:
    """The async twin: the number follows the coroutine across its awaits."""
    server.script(Step(503), Step(200))

    @stormguard.retry(on=httpx.HTTPStatusError, policy=FAST, clock=FakeClock())
    async def fetch() -> int:
        async with httpx.AsyncClient(timeout=10) as client:
            await asyncio.sleep(0)
            response = await client.get(server.url, headers=stormguard.attempt_headers())
            return response.raise_for_status().status_code

    assert asyncio.run(fetch()) == 200
    assert _attempts(server) == [None, "2"]


def test_a_retrying_block_numbers_its_attempts(server: ScriptedServer) -> None:
    """retrying(): inside `with attempt:` current_attempt() is the attempt's number."""
    server.script(Step(503), Step(200))
    seen: list[Any] = []
    for attempt in stormguard.retrying(on=httpx.HTTPStatusError, policy=FAST, clock=FakeClock()):
        with attempt:
            seen.append((attempt.number, stormguard.current_attempt()))
            headers = stormguard.attempt_headers()
            httpx.get(server.url, headers=headers, timeout=10).raise_for_status()
    assert seen == [(1, 1), (2, 2)]
    assert _attempts(server) == [None, "2"]
