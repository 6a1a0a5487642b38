"""The mock server on loopback against a real httpx client: every fault kind,
sequences, idempotency, rate limits and the admin API."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import stormguard
from stormguard.mock import MockServer

Factory = Callable[..., MockServer]
Eventually = Callable[..., Any]  # the `eventually` fixture of tests/conftest.py


def _finished(mock: MockServer) -> dict[str, Any] | None:
    """The only journal entry once the server has finished with it, else None."""
    (entry,) = mock.journal()
    return entry if entry["end"] is not None else None


def one_route(**route: Any) -> dict[str, Any]:
    route.setdefault("match", {"path": "/x"})
    return {"seed": 1, "routes": [route]}


def test_status_step_with_headers_and_body(stormguard_mock: Factory) -> None:
    """A status step answers with its status, headers and JSON body."""
    mock = stormguard_mock(
        one_route(sequence=[{"status": 418, "headers": {"X-Tea": "yes"}, "body": {"a": 1}}])
    )
    response = httpx.get(mock.url + "/x")
    assert response.status_code == 418
    assert response.headers["x-tea"] == "yes"
    assert response.json() == {"a": 1}


@pytest.mark.parametrize(
    ("fault", "errors"),
    [
        ("reset", (httpx.ReadError, httpx.RemoteProtocolError)),
        ("empty", (httpx.RemoteProtocolError,)),
        ("malformed-chunked", (httpx.RemoteProtocolError,)),
        ("commit-then-reset", (httpx.ReadError, httpx.RemoteProtocolError)),
    ],
)
def test_connection_faults_raise_in_the_client(
    stormguard_mock: Factory, fault: str, errors: tuple[type[Exception], ...]
) -> None:
    """Reset, empty response and a broken chunked body surface as transport errors."""
    mock = stormguard_mock(one_route(sequence=[{"fault": fault}]))
    with pytest.raises(errors):
        httpx.get(mock.url + "/x")
    (entry,) = mock.journal()
    assert entry["outcome"] == fault
    assert entry["status"] is None


def test_hang_holds_until_the_client_gives_up(
    stormguard_mock: Factory, eventually: Eventually
) -> None:
    """`hang` sends nothing; the client times out and the journal notes when it left."""
    mock = stormguard_mock(one_route(sequence=[{"fault": "hang"}]))
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(mock.url + "/x", timeout=0.3)
    entry = eventually(lambda: _finished(mock))
    assert entry["outcome"] == "hang"
    assert entry["end"] > entry["time"]  # closed when the client left, not before it came


def test_commit_then_reset_records_the_side_effect(stormguard_mock: Factory) -> None:
    """The charge is in the ledger even though the client saw only a reset."""
    mock = stormguard_mock(
        one_route(resource="payments", sequence=[{"fault": "commit-then-reset"}])
    )
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        httpx.post(mock.url + "/x", json={"amount": 5})
    assert mock.ledger() == {"payments": {"request-1": 1}}
    assert mock.journal()[0]["side_effect"] == "request-1"


def test_commit_then_504_records_the_side_effect(stormguard_mock: Factory) -> None:
    """The client gets a 504 for a request the server did process."""
    mock = stormguard_mock(one_route(resource="payments", sequence=[{"fault": "commit-then-504"}]))
    response = httpx.post(mock.url + "/x", json={}, headers={"Idempotency-Key": "k"})
    assert response.status_code == 504
    assert mock.ledger() == {"payments": {"k": 1}}


def test_delay_holds_the_answer(stormguard_mock: Factory) -> None:
    """A fixed delay is waited before answering (lower bound only)."""
    mock = stormguard_mock(one_route(delay=0.2))
    started = time.monotonic()
    assert httpx.get(mock.url + "/x").status_code == 200
    assert time.monotonic() - started >= 0.2


def test_probability_is_seeded(stormguard_mock: Factory) -> None:
    """With the same seed, probabilistic steps play out identically."""
    scenario = one_route(
        sequence_per="idempotency-key",
        sequence=[{"status": 500, "probability": 0.5}, {"status": 200}],
    )
    runs = []
    for _ in range(2):
        mock = stormguard_mock(scenario, seed=99)
        with httpx.Client() as client:
            runs.append(
                [
                    client.get(mock.url + "/x", headers={"Idempotency-Key": str(i)}).status_code
                    for i in range(20)
                ]
            )
    assert runs[0] == runs[1]
    assert set(runs[0]) == {200, 500}


def test_probability_falls_through_to_the_next_step(stormguard_mock: Factory) -> None:
    """A step whose draw fails hands the request to the following step."""
    mock = stormguard_mock(
        one_route(
            sequence_per="client",
            sequence=[{"status": 500, "probability": 0.0}, {"status": 201}],
        )
    )
    assert httpx.get(mock.url + "/x").status_code == 201
    always = stormguard_mock(
        one_route(sequence_per="client", sequence=[{"status": 500, "probability": 1.0}, {}])
    )
    assert httpx.get(always.url + "/x").status_code == 500


def test_probabilities_follow_the_rate(stormguard_mock: Factory) -> None:
    """About `probability` of the requests take a probabilistic step."""
    # a per-key sequence restarts for every new key, so each request draws once
    mock = stormguard_mock(
        one_route(
            sequence_per="idempotency-key", sequence=[{"status": 503, "probability": 0.3}, {}]
        )
    )
    with httpx.Client() as client:
        codes = [
            client.get(mock.url + "/x", headers={"Idempotency-Key": str(i)}).status_code
            for i in range(200)
        ]
    assert 30 <= codes.count(503) <= 90


def test_the_last_step_repeats(stormguard_mock: Factory) -> None:
    """Once the sequence is used up, every request gets its last step."""
    mock = stormguard_mock(one_route(sequence=[{"status": 503}, {"status": 201}]))
    with httpx.Client() as client:
        codes = [client.get(mock.url + "/x").status_code for _ in range(4)]
    assert codes == [503, 201, 201, 201]


@pytest.mark.parametrize(
    ("sequence_per", "expected"),
    [
        ("global", [503, 201, 201, 201]),
        ("client", [503, 503, 201, 201]),
        ("idempotency-key", [503, 503, 201, 201]),
    ],
)
def test_who_shares_a_place_in_the_sequence(
    stormguard_mock: Factory, sequence_per: str, expected: list[int]
) -> None:
    """sequence_per decides whether clients/keys each start the sequence afresh."""
    mock = stormguard_mock(
        one_route(sequence_per=sequence_per, sequence=[{"status": 503}, {"status": 201}])
    )
    calls = [("a", "k1"), ("b", "k2"), ("a", "k1"), ("b", "k2")]
    with httpx.Client() as client:
        codes = [
            client.post(
                mock.url + "/x", json={}, headers={"X-Client-Id": who, "Idempotency-Key": key}
            ).status_code
            for who, key in calls
        ]
    assert codes == expected


def test_keyless_requests_share_a_sequence_per_operation(stormguard_mock: Factory) -> None:
    """Without a key, per-idempotency-key sequences follow client + method + path + body."""
    mock = stormguard_mock(
        one_route(sequence_per="idempotency-key", sequence=[{"status": 503}, {"status": 201}])
    )
    with httpx.Client() as client:
        first = [client.post(mock.url + "/x", json={"id": 1}).status_code for _ in range(2)]
        other = client.post(mock.url + "/x", json={"id": 2}).status_code
    assert first == [503, 201]
    assert other == 503


def test_success_on_a_resource_replays_for_the_same_key(stormguard_mock: Factory) -> None:
    """A key that already committed gets the stored answer with Idempotent-Replayed."""
    mock = stormguard_mock(
        one_route(resource="payments", sequence=[{"status": 201, "body": {"id": "ch_1"}}])
    )
    headers = {"Idempotency-Key": "k1"}
    with httpx.Client() as client:
        first = client.post(mock.url + "/x", json={"a": 1}, headers=headers)
        again = client.post(mock.url + "/x", json={"a": 1}, headers=headers)
        keyless = [client.post(mock.url + "/x", json={"a": 1}) for _ in range(2)]
    assert first.status_code == again.status_code == 201
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == {"id": "ch_1"}
    assert all(r.status_code == 201 for r in keyless)
    assert mock.ledger() == {"payments": {"k1": 1, "request-3": 1, "request-4": 1}}


def test_commit_then_reset_then_retry_with_key_is_charged_once(stormguard_mock: Factory) -> None:
    """After commit-then-reset, a retry with the same key is replayed, not charged again."""
    mock = stormguard_mock(
        one_route(
            resource="payments",
            sequence_per="idempotency-key",
            sequence=[{"fault": "commit-then-reset"}, {"status": 201}],
        )
    )
    headers = {"Idempotency-Key": "k1"}
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        httpx.post(mock.url + "/x", json={"a": 1}, headers=headers)
    again = httpx.post(mock.url + "/x", json={"a": 1}, headers=headers)
    assert again.headers["idempotent-replayed"] == "true"
    assert mock.ledger() == {"payments": {"k1": 1}}


def test_same_key_different_body_is_422(stormguard_mock: Factory) -> None:
    """Reusing a key with another body is refused with 422 and no side effect."""
    mock = stormguard_mock(one_route(resource="payments"))
    headers = {"Idempotency-Key": "k1"}
    assert httpx.post(mock.url + "/x", json={"a": 1}, headers=headers).status_code == 200
    assert httpx.post(mock.url + "/x", json={"a": 2}, headers=headers).status_code == 422
    assert mock.ledger() == {"payments": {"k1": 1}}
    assert mock.journal()[1]["outcome"] == "mismatch"


def test_duplicate_in_flight_is_409(stormguard_mock: Factory, eventually: Eventually) -> None:
    """A second request with a key still being processed gets 409."""
    # the delay only has to outlast the second request's arrival, also on a loaded machine
    mock = stormguard_mock(one_route(resource="payments", delay=2.0))
    headers = {"Idempotency-Key": "k1"}
    results: list[int] = []
    slow = threading.Thread(
        target=lambda: results.append(
            httpx.post(mock.url + "/x", json={}, headers=headers).status_code
        )
    )
    slow.start()
    eventually(mock.journal)
    assert httpx.post(mock.url + "/x", json={}, headers=headers).status_code == 409
    slow.join()
    assert results == [200]
    assert mock.ledger() == {"payments": {"k1": 1}}


@pytest.mark.parametrize(
    ("style", "names"),
    [
        ("github", {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}),
        ("stripe", {"stripe-ratelimit-limit", "stripe-ratelimit-remaining"}),
        ("ietf", {"ratelimit", "ratelimit-policy"}),
        ("openai", {"x-ratelimit-limit-requests", "x-ratelimit-reset-requests"}),
    ],
)
def test_rate_limit_answers_429_in_the_chosen_style(
    stormguard_mock: Factory, style: str, names: set[str]
) -> None:
    """Past the limit: 429 with Retry-After and the header style asked for."""
    mock = stormguard_mock(
        one_route(rate_limit={"limit": 2, "window": 30, "per": "client", "headers": style})
    )
    with httpx.Client(headers={"X-Client-Id": "alice"}) as client:
        codes = [client.get(mock.url + "/x") for _ in range(3)]
        other = client.get(mock.url + "/x", headers={"X-Client-Id": "bob"})
    assert [r.status_code for r in codes] == [200, 200, 429]
    assert names <= set(codes[0].headers)
    assert names <= set(codes[2].headers)
    assert int(codes[2].headers["retry-after"]) >= 1
    assert other.status_code == 200
    quotas = stormguard.parse_rate_limits(codes[2].headers, now=time.time())
    assert any(q.limit == 2 and q.remaining == 0 for q in quotas)
    assert mock.journal()[2]["outcome"] == "rate-limited"
    assert mock.journal()[2]["retry_after"] >= 1


def test_global_rate_limit_is_shared(stormguard_mock: Factory) -> None:
    """`per: global` counts every client against one limit (a token bucket: a fixed
    window's edge could fall between the two requests)."""
    limit = {"limit": 1, "window": 30, "per": "global", "algorithm": "token-bucket"}
    mock = stormguard_mock(one_route(rate_limit=limit))
    first = httpx.get(mock.url + "/x", headers={"X-Client-Id": "a"})
    second = httpx.get(mock.url + "/x", headers={"X-Client-Id": "b"})
    assert (first.status_code, second.status_code) == (200, 429)


def test_rate_limit_headers_parse_with_stormguard(stormguard_mock: Factory) -> None:
    """The 429's headers give stormguard's own wait_hint a positive wait."""
    limit = {"limit": 1, "window": 5, "headers": "github", "algorithm": "token-bucket"}
    mock = stormguard_mock(one_route(rate_limit=limit))
    httpx.get(mock.url + "/x")
    refused = httpx.get(mock.url + "/x")
    hint = stormguard.wait_hint(refused.status_code, refused.headers, now=time.time())
    assert hint is not None
    assert 0 < hint <= 6


def test_admin_api_journal_ledger_reset(stormguard_mock: Factory) -> None:
    """GET /__mock/journal and /__mock/ledger report; POST /__mock/reset forgets."""
    mock = stormguard_mock(one_route(resource="orders", match={"method": "POST", "path": "/o"}))
    with httpx.Client(base_url=mock.url) as client:
        client.post(
            "/o?x=1", content=b"hello", headers={"Idempotency-Key": "k", "X-Client-Id": "c"}
        )
        client.get("/nowhere")
        journal = client.get("/__mock/journal").json()
        ledger = client.get("/__mock/ledger").json()
        assert client.post("/__mock/reset").status_code == 200
        after = client.get("/__mock/journal").json()
        assert client.get("/__mock/nope").status_code == 404
    assert ledger == {"orders": {"k": 1}}
    first, missing = journal
    assert {"time", "method", "path", "client", "idempotency_key", "body_sha256", "outcome"} <= set(
        first
    )
    assert (first["method"], first["path"], first["query"]) == ("POST", "/o", "x=1")
    assert (first["client"], first["idempotency_key"], first["outcome"]) == ("c", "k", "ok")
    assert (
        first["body_sha256"] == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    )
    assert (missing["status"], missing["outcome"]) == (404, "no-route")
    assert after == []
    assert mock.ledger() == {}


def test_keep_alive_serves_many_requests_on_one_connection(stormguard_mock: Factory) -> None:
    """Plain answers keep the connection open for the next request."""
    mock = stormguard_mock(one_route())
    with httpx.Client() as client:
        for _ in range(20):
            assert client.get(mock.url + "/x").status_code == 200
    assert len(mock.journal()) == 20


def test_stop_leaves_nothing_running(eventually: Eventually) -> None:
    """stop() ends the server thread, even with a hung connection open."""
    before = threading.active_count()
    mock = MockServer(one_route(sequence=[{"fault": "hang"}])).start()
    hung = threading.Thread(target=_ignore_errors(lambda: httpx.get(mock.url + "/x", timeout=5)))
    hung.start()
    eventually(mock.journal)  # the hung request has arrived
    mock.stop()
    hung.join(timeout=10)
    assert not hung.is_alive()
    assert threading.active_count() == before
    with pytest.raises(httpx.ConnectError):
        httpx.get(mock.url + "/x")


def _ignore_errors(fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except httpx.HTTPError:
            pass

    return run


def test_head_and_no_content_answers(stormguard_mock: Factory) -> None:
    """HEAD gets the headers without the body; 204 carries no body."""
    mock = stormguard_mock(
        {
            "routes": [
                {"match": {"path": "/x"}, "sequence": [{"body": {"a": 1}}]},
                {"match": {"path": "/empty"}, "sequence": [{"status": 204, "body": "ignored"}]},
            ]
        }
    )
    with httpx.Client(base_url=mock.url) as client:
        head = client.head("/x")
        nothing = client.delete("/empty")
        after = client.get("/x")
    assert (head.status_code, head.content, head.headers["content-length"]) == (200, b"", "7")
    assert (nothing.status_code, nothing.content) == (204, b"")
    assert after.json() == {"a": 1}


def test_garbage_gets_400(stormguard_mock: Factory) -> None:
    """Bytes that are not HTTP/1.1 get a 400 and a closed connection."""
    mock = stormguard_mock(one_route())
    with socket.create_connection((mock.host, mock.port), timeout=5) as sock:
        sock.sendall(b"NOT HTTP\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400 ")
    assert mock.journal() == []


def test_client_timeout_during_a_delay_is_journaled(
    stormguard_mock: Factory, eventually: Eventually
) -> None:
    """A client that times out during a slow answer leaves a charged, unanswered entry."""
    mock = stormguard_mock(one_route(resource="payments", delay=1.0))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(mock.url + "/x", json={"a": 1}, timeout=0.2)
    entry = eventually(lambda: _finished(mock))
    assert (entry["status"], entry["outcome"]) == (None, "client-gone")
    assert entry["end"] - entry["time"] < 0.9
    assert mock.ledger() == {"payments": {"request-1": 1}}
