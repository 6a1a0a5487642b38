"""End to end through a real gateway: a retrying client's keyed request that meets
its own first copy still in flight (409 + Retry-After) is retried into the replay."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx

from stormguard import Constant, RetryPolicy, RetryRecord
from stormguard.httpx import RetryTransport
from stormguard.testing import FakeClock

Factory = Callable[..., Any]


def test_a_duplicate_in_flight_at_the_gateway_gets_the_replay(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """idempotency: honor; the first keyed POST is held at the upstream; the second gets
    409, then (retried once the first answered) the stored answer: one upstream run."""
    up = upstream_factory()
    config = {
        "upstreams": {"a": {"url": up.url}},
        "routes": [{"path": "/", "upstream": "a", "idempotency": "honor"}],
    }
    gw = gateway_factory(config)
    headers = {"Idempotency-Key": "order-7"}
    first: list[httpx.Response] = []
    holder = threading.Thread(
        target=lambda: first.append(
            httpx.post(f"{gw.url}/hold?key=k7", headers=headers, timeout=20)
        )
    )
    holder.start()
    eventually(lambda: up.seen()["in_flight"] == 1)
    statuses: list[int] = []

    def wait_for_first(record: RetryRecord) -> None:
        statuses.append(int(record.reason.split()[1]))
        up.release("k7")  # the first copy answers now
        holder.join()

    transport = RetryTransport(
        policy=RetryPolicy(backoff=Constant(0.1, 0.1)),
        clock=FakeClock(),
        on_retry=wait_for_first,
        breaker=False,
    )
    with httpx.Client(transport=transport, timeout=20) as client:
        second = client.post(f"{gw.url}/hold?key=k7", headers=headers)
    holder.join()
    assert statuses == [409]
    assert first[0].status_code == 200 and second.status_code == 200
    assert second.headers.get("idempotent-replayed") == "true"
    assert second.content == first[0].content == b"held"
    assert up.seen()["n"] == 1
