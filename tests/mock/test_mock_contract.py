"""The retry contract end to end: a naive retry loop double-charges under
commit-then-reset; stormguard's client does not, and it obeys Retry-After."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import stormguard
from stormguard.httpx import RetryTransport
from stormguard.mock import MockServer
from stormguard.protection import OriginGuards

Factory = Callable[..., MockServer]

PAYMENTS: dict[str, Any] = {
    "seed": 5,
    "routes": [
        {
            "match": {"method": "POST", "path": "/v1/payments"},
            "sequence_per": "idempotency-key",
            "resource": "payments",
            "sequence": [
                {"fault": "commit-then-reset"},
                {"status": 503, "headers": {"Retry-After": "1"}},
                {"status": 201, "body": {"status": "succeeded"}},
            ],
        }
    ],
}


def policy() -> stormguard.RetryPolicy:
    return stormguard.RetryPolicy(
        attempts=5, backoff=stormguard.FullJitter(0.01, 0.1), deadline=10, max_wait=5
    )


def naive_pay(url: str, body: dict[str, Any]) -> httpx.Response | None:
    """Immediate retries on any error, no idempotency key: the anti-pattern."""
    with httpx.Client() as client:
        for _ in range(5):
            try:
                response = client.post(url, json=body)
            except httpx.TransportError:
                continue
            if response.status_code < 500:
                return response
    return None


def test_naive_retry_loop_double_charges(stormguard_mock: Factory) -> None:
    """Retrying a keyless POST after commit-then-reset charges twice; the checker says so."""
    mock = stormguard_mock(PAYMENTS)
    response = naive_pay(mock.url + "/v1/payments", {"amount": 100})
    assert response is not None and response.status_code == 201
    assert sum(mock.ledger()["payments"].values()) == 2
    report = mock.check()
    assert {"duplicate-side-effect", "unsafe-retry", "early-retry"} <= report.kinds()


def test_stormguard_client_charges_once(stormguard_mock: Factory) -> None:
    """RetryTransport with idempotency keys: one charge, the replayed 201, a clean report."""
    mock = stormguard_mock(PAYMENTS)
    transport = RetryTransport(policy=policy(), idempotency_keys=True)
    with httpx.Client(transport=transport) as client:
        response = client.post(mock.url + "/v1/payments", json={"amount": 100})
    assert response.status_code == 201
    assert response.headers["idempotent-replayed"] == "true"
    assert mock.ledger()["payments"] == {mock.journal()[0]["idempotency_key"]: 1}
    report = mock.check()
    assert report.ok, report.summary()


def test_stormguard_client_waits_for_retry_after(stormguard_mock: Factory) -> None:
    """The attempt after a 503 with Retry-After: 1 comes at least a second later."""
    mock = stormguard_mock(PAYMENTS)
    with httpx.Client(transport=RetryTransport(policy=policy(), idempotency_keys=True)) as client:
        client.post(mock.url + "/v1/payments", json={"amount": 1})
    first, refused, accepted = mock.journal()
    assert refused["status"] == 503
    assert accepted["time"] - refused["end"] >= 0.95
    assert len({e["idempotency_key"] for e in (first, refused, accepted)}) == 1


async def test_async_stormguard_client_charges_once(stormguard_mock: Factory) -> None:
    """The async side of RetryTransport keeps the same key across attempts too."""
    scenario = {
        "routes": [
            {
                **PAYMENTS["routes"][0],
                "sequence": [{"fault": "commit-then-504"}, {"fault": "reset"}, {"status": 201}],
            }
        ]
    }
    mock = stormguard_mock(scenario)
    transport = RetryTransport(policy=policy(), idempotency_keys=True)
    async with httpx.AsyncClient(transport=transport) as client:
        response = await client.post(mock.url + "/v1/payments", json={"amount": 7})
    assert response.status_code == 201
    assert sum(mock.ledger()["payments"].values()) == 1
    assert mock.check().ok


def test_keyless_post_is_not_retried_by_stormguard(stormguard_mock: Factory) -> None:
    """Without idempotency keys, stormguard does not retry a maybe-processed POST."""
    mock = stormguard_mock(PAYMENTS)
    with (
        httpx.Client(transport=RetryTransport(policy=policy())) as client,
        pytest.raises(httpx.TransportError),
    ):
        client.post(mock.url + "/v1/payments", json={"amount": 100})
    assert len(mock.journal()) == 1
    assert mock.check().ok


FLEET: dict[str, Any] = {
    "routes": [
        {
            "match": {"method": "GET", "path": "/v1/status"},
            "sequence_per": "client",
            "sequence": [{"status": 503}, {"status": 200}],
        }
    ]
}


def _fleet(url: str, transport_for: Callable[[], httpx.BaseTransport | None]) -> None:
    def one(n: int) -> None:
        transport = transport_for()
        client = httpx.Client(transport=transport, headers={"X-Client-Id": f"c{n}"})
        with client:
            response = client.get(url + "/v1/status")
            if response.status_code == 503:  # a fixed-delay retry loop without jitter
                threading.Event().wait(0.2)
                client.get(url + "/v1/status")

    threads = [threading.Thread(target=one, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_fixed_delay_fleet_is_flagged_as_synchronized(stormguard_mock: Factory) -> None:
    """Twelve clients that all retry after exactly 0.2 s are reported as synchronised."""
    mock = stormguard_mock(FLEET)
    _fleet(mock.url, lambda: None)
    assert mock.check().kinds() == {"synchronized-retries"}


def test_full_jitter_fleet_is_not_flagged(stormguard_mock: Factory) -> None:
    """The same fleet through RetryTransport with full jitter spreads its retries."""
    mock = stormguard_mock(FLEET)
    policy = stormguard.RetryPolicy(attempts=3, backoff=stormguard.FullJitter(0.4, 1.0))
    # Each client stands for a separate host: each gets its own per-origin guards.
    _fleet(mock.url, lambda: RetryTransport(policy=policy, guards=OriginGuards()))
    report = mock.check()
    assert report.ok, report.summary()
    assert sum(len(op.attempts) for op in report.operations) == 24
