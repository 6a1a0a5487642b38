"""IdempotencyMiddleware under two uvicorn processes on one Redis, and a retrying client."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redis

from net_support import Serve
from stormguard import NoBackoff, RetryPolicy
from stormguard.httpx import RetryTransport

pytestmark = pytest.mark.redis


@pytest.fixture
def two_apps(uvicorn_app: Serve, redis_url: str, key_prefix: str) -> tuple[list[str], Any]:
    """Two uvicorn processes of the idempotent app sharing one Redis, and a run counter."""
    env = {"SG_REDIS": redis_url, "SG_PREFIX": key_prefix, "SG_DELAY": "0.2"}
    urls = [uvicorn_app("idempotent_app", **env), uvicorn_app("idempotent_app", **env)]
    client = redis.Redis.from_url(redis_url)

    def runs(path: str, tenant: str = "", key: str = "") -> int:
        return int(client.get(f"{key_prefix}runs:{path}:{tenant}:{key}") or 0)

    return urls, runs


async def test_fifty_concurrent_duplicates_run_once(two_apps: tuple[list[str], Any]) -> None:
    """50 duplicate POSTs over two processes: one execution; the rest 409 or the replay."""
    urls, runs = two_apps
    headers = {"Idempotency-Key": "pay-1"}
    async with httpx.AsyncClient(timeout=30) as http:
        answers = await asyncio.gather(
            *(http.post(urls[i % 2] + "/pay", content=b"10", headers=headers) for i in range(50))
        )
        after = await http.post(urls[1] + "/pay", content=b"10", headers=headers)
        changed = await http.post(urls[0] + "/pay", content=b"11", headers=headers)
    assert runs("/pay", key="pay-1") == 1
    codes = [a.status_code for a in answers]
    assert set(codes) <= {201, 409} and codes.count(201) >= 1
    executed = [
        a for a in answers if a.status_code == 201 and "idempotent-replayed" not in a.headers
    ]
    assert len(executed) == 1
    assert after.status_code == 201 and after.headers["idempotent-replayed"] == "true"
    assert after.content == executed[0].content
    assert changed.status_code == 422


def test_failed_attempt_runs_again_and_tenants_are_apart(two_apps: tuple[list[str], Any]) -> None:
    """A 500 then a retry executes twice; equal keys of two tenants both execute."""
    urls, runs = two_apps
    with httpx.Client(timeout=10) as http:
        flaky = [
            http.post(urls[i % 2] + "/flaky", headers={"Idempotency-Key": "f"}).status_code
            for i in range(3)
        ]
        for tenant in ("a", "b", "a"):
            http.post(urls[0] + "/pay", headers={"Idempotency-Key": "same", "X-API-Key": tenant})
    assert flaky == [500, 201, 201]
    assert runs("/flaky", key="f") == 2
    assert (runs("/pay", "a", "same"), runs("/pay", "b", "same")) == (1, 1)


class ProcessedThenLost(httpx.BaseTransport):
    """The mock's commit-then-reset fault in front of a real app: the first request is
    processed upstream, then its connection drops before the answer reaches the client."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.sent: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.headers.get("idempotency-key"))
        response = self.inner.handle_request(request)
        if len(self.sent) == 1:
            response.read()
            response.close()
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


def test_retrying_client_through_processed_then_lost(two_apps: tuple[list[str], Any]) -> None:
    """RetryTransport(idempotency_keys=True) through a lost answer: exactly one execution."""
    urls, runs = two_apps
    fault = ProcessedThenLost()
    policy = RetryPolicy(backoff=NoBackoff(), attempts=3)
    transport = RetryTransport(fault, policy=policy, idempotency_keys=True, breaker=False)
    with httpx.Client(transport=transport, timeout=10) as http:
        response = http.post(urls[0] + "/pay", content=b"charge")
    assert len(fault.sent) == 2 and fault.sent[0] == fault.sent[1] is not None
    assert response.status_code == 201
    assert response.headers["idempotent-replayed"] == "true"
    assert runs("/pay", key=fault.sent[0]) == 1


def test_redis_killed_keyed_requests_fail_closed(uvicorn_app: Serve, owned_redis: Any) -> None:
    """Redis killed: keyed POSTs get 503 + Retry-After and do not run; unkeyed ones run."""
    env = {"SG_REDIS": owned_redis.url, "SG_PREFIX": "kill:", "SG_COUNT": "memory"}
    url = uvicorn_app("idempotent_app", **env)
    with httpx.Client(timeout=10) as http:
        before = http.post(url + "/pay", headers={"Idempotency-Key": "a"})
        owned_redis.stop()
        keyed = [http.post(url + "/pay", headers={"Idempotency-Key": k}) for k in "abc"]
        unkeyed = http.post(url + "/pay")
    assert before.status_code == 201
    assert [r.status_code for r in keyed] == [503, 503, 503]
    assert all(int(r.headers["retry-after"]) >= 1 for r in keyed)
    assert unkeyed.json()["runs"] == 1  # only the unkeyed request reached the handler
