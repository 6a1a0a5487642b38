"""End to end: a retrying client whose keyed request meets its own first copy still
running behind a real IdempotencyMiddleware (uvicorn, Redis) gets the replay, and
the handler runs once."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
import redis

from net_support import Serve
from stormguard import Constant, RetryPolicy, RetryRecord
from stormguard.httpx import RetryTransport
from stormguard.testing import FakeClock

pytestmark = pytest.mark.redis


def test_a_duplicate_in_flight_is_retried_into_the_replay(
    uvicorn_app: Serve, redis_url: str, key_prefix: str, eventually: Any
) -> None:
    """First POST runs (held 1.5 s); the second, same key, gets 409 + Retry-After and,
    retried once the first has answered, the replayed 201: one execution."""
    url = uvicorn_app("idempotent_app", SG_REDIS=redis_url, SG_PREFIX=key_prefix, SG_DELAY="1.5")
    runs = redis.Redis.from_url(redis_url)
    headers = {"Idempotency-Key": "pay-9"}
    first: list[httpx.Response] = []
    holder = threading.Thread(
        target=lambda: first.append(
            httpx.post(url + "/pay", content=b"10", headers=headers, timeout=20)
        )
    )
    holder.start()
    eventually(lambda: runs.get(f"{key_prefix}runs:/pay::pay-9") is not None)

    def wait_for_first(record: RetryRecord) -> None:
        holder.join()  # the retry goes once the first copy has answered

    transport = RetryTransport(
        policy=RetryPolicy(backoff=Constant(0.1, 0.1)),
        clock=FakeClock(),
        on_retry=wait_for_first,
        breaker=False,
    )
    with httpx.Client(transport=transport, timeout=20) as client:
        second = client.post(url + "/pay", content=b"10", headers=headers)
    holder.join()
    assert first[0].status_code == 201 and "idempotent-replayed" not in first[0].headers
    assert second.status_code == 201 and second.headers["idempotent-replayed"] == "true"
    assert second.content == first[0].content
    assert int(runs.get(f"{key_prefix}runs:/pay::pay-9") or 0) == 1
