"""Issue 15 items 3-6 on a real loopback server: honest journals when an answer
cannot be sent, read timeouts for half-sent requests, 400 for a bad Idempotency-Key,
and GitHub's own primary (403/429 + X-RateLimit-*) and secondary (403 +
Retry-After) rate-limit answers."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import stormguard
from stormguard.mock import MockServer, Scenario
from stormguard.mock._scenario import Match, Route, Step

Factory = Callable[..., MockServer]
Eventually = Callable[..., Any]


def one_route(**route: Any) -> dict[str, Any]:
    route.setdefault("match", {"path": "/x"})
    return {"seed": 1, "routes": [route]}


def finished(mock: MockServer) -> dict[str, Any] | None:
    """The first journal entry once the server is done with it, else None."""
    journal = mock.journal()
    return journal[0] if journal and journal[0]["end"] is not None else None


# --- item 3: the journal records what was sent ---------------------------------------


@pytest.mark.parametrize(
    "header",
    [("X-Bad", "a\r\nInjected: 1"), ("Bad Name", "x"), ("X-Caf\u00e9", "1"), ("X-A", "caf\u00e9")],
)
def test_an_unsendable_answer_is_journaled_as_send_failed(
    eventually: Eventually, header: tuple[str, str]
) -> None:
    """A header h11 refuses (bypassing load validation) is journaled, not `200 ok`."""
    scenario = Scenario(routes=(Route(Match("/x"), sequence=(Step(headers=(header,)),)),))
    with MockServer(scenario) as mock:
        with pytest.raises(httpx.TransportError):
            httpx.get(mock.url + "/x")
        entry = eventually(lambda: finished(mock))
    assert entry["outcome"] == "send-failed"
    assert entry["status"] is None
    assert entry["error"]


def test_a_send_failure_counts_as_maybe_processed(eventually: Eventually) -> None:
    """The checker treats a send failure like a lost answer: a keyless POST retry is unsafe."""
    scenario = Scenario(
        routes=(Route(Match("/x"), sequence=(Step(headers=(("X-Bad", "a\nb"),)),)),)
    )
    with MockServer(scenario) as mock:
        for _ in range(2):
            with pytest.raises(httpx.TransportError):
                httpx.post(mock.url + "/x", content=b"{}")
        eventually(lambda: all(e["end"] for e in mock.journal()) or None)
        assert "unsafe-retry" in mock.check().kinds()


# --- item 4: read timeouts ---------------------------------------------------------


def half_sent(port: int, kind: str) -> socket.socket:
    """A connection that sends part of a request (or nothing) and then stalls."""
    sock = socket.create_connection(("127.0.0.1", port))
    if kind == "head":
        sock.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\nX-Slow: ")
    elif kind == "body":
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789")
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (the socket times out after 30 s)."""
    sock.settimeout(30)
    data = b""
    with sock:
        while chunk := sock.recv(4096):
            data += chunk
    return data


@pytest.mark.parametrize("kind", ["nothing", "head", "body"])
def test_half_sent_requests_are_closed(eventually: Eventually, kind: str) -> None:
    """60 stalled connections are all closed by the server once the read timeout passes."""
    with MockServer(one_route(), header_timeout=0.2, body_timeout=0.2) as mock:
        sockets = [half_sent(mock.port, kind) for _ in range(60)]
        answers = [read_to_end(sock) for sock in sockets]
        eventually(lambda: mock.open_connections == 0 or None)
        assert mock.journal() == []
    if kind == "nothing":
        assert answers == [b""] * 60
    else:
        assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers)


def test_a_kept_alive_connection_still_serves_within_the_timeout() -> None:
    """Requests that arrive in time are served as before on one connection."""
    with MockServer(one_route(), header_timeout=5, body_timeout=5) as mock, httpx.Client() as c:
        codes = [c.get(mock.url + "/x").status_code for _ in range(3)]
    assert codes == [200, 200, 200]


def test_connections_past_the_cap_get_503(eventually: Eventually) -> None:
    """With max_connections=2, a third connection is answered 503 and closed."""
    with MockServer(one_route(), max_connections=2) as mock:
        held = [half_sent(mock.port, "head") for _ in range(2)]
        eventually(lambda: mock.open_connections == 2 or None)
        extra = half_sent(mock.port, "nothing")
        assert read_to_end(extra).startswith(b"HTTP/1.1 503 ")
        for sock in held:
            sock.close()


def test_timeouts_have_defaults_and_are_validated() -> None:
    """Sensible defaults; a non-positive timeout is a ConfigError naming the field."""
    mock = MockServer(one_route())
    assert (mock.header_timeout, mock.body_timeout, mock.max_connections) == (30.0, 60.0, 1024)
    with pytest.raises(stormguard.ConfigError, match="header_timeout"):
        MockServer(one_route(), header_timeout=0)


# --- item 5: invalid idempotency keys ------------------------------------------------


@pytest.mark.parametrize("key", ["", "k" * 256])
def test_an_empty_blank_or_long_key_gets_400(stormguard_mock: Factory, key: str) -> None:
    """On an idempotent route, a bad Idempotency-Key is refused (as Stripe does), not ignored."""
    mock = stormguard_mock(one_route(resource="payments", sequence=[{"status": 201}]))
    with httpx.Client() as client:
        codes = [
            client.post(mock.url + "/x", json={}, headers={"Idempotency-Key": key}).status_code
            for _ in range(2)
        ]
    assert codes == [400, 400]
    assert mock.ledger() == {}
    assert [e["outcome"] for e in mock.journal()] == ["invalid-key", "invalid-key"]


def test_a_blank_key_gets_400(stormguard_mock: Factory) -> None:
    """A key of spaces and tabs (sent raw: httpx refuses to) is refused too."""
    mock = stormguard_mock(one_route(resource="payments", sequence=[{"status": 201}]))
    sock = socket.create_connection(("127.0.0.1", mock.port))
    sock.sendall(
        b"POST /x HTTP/1.1\r\nHost: a\r\nIdempotency-Key: \t  \t\r\n"
        b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
    )
    assert read_to_end(sock).startswith(b"HTTP/1.1 400 ")
    assert mock.ledger() == {}


def test_a_key_of_255_characters_is_accepted(stormguard_mock: Factory) -> None:
    """255 characters is the longest key accepted."""
    mock = stormguard_mock(one_route(resource="payments", sequence=[{"status": 201}]))
    response = httpx.post(mock.url + "/x", json={}, headers={"Idempotency-Key": "k" * 255})
    assert response.status_code == 201


def test_a_bad_key_on_a_plain_route_is_not_judged(stormguard_mock: Factory) -> None:
    """Routes without a resource do not use keys: they answer as scripted."""
    mock = stormguard_mock(one_route(sequence=[{"status": 201}]))
    response = httpx.post(mock.url + "/x", json={}, headers={"Idempotency-Key": ""})
    assert response.status_code == 201


# --- item 6: GitHub's own rate-limit answers -------------------------------------------


def github_limit(**options: Any) -> dict[str, Any]:
    """A one-request GitHub-style limit over 30 s with the given options."""
    return one_route(rate_limit={"limit": 1, "window": 30, "headers": "github", **options})


@pytest.mark.parametrize("status", [403, 429])
def test_github_primary_limit(stormguard_mock: Factory, status: int) -> None:
    """Primary limit: 403 or 429 with remaining 0 and the reset epoch, no Retry-After."""
    mock = stormguard_mock(github_limit(status=status, retry_after=False))
    with httpx.Client() as client:
        ok = client.get(mock.url + "/x")
        refused = client.get(mock.url + "/x")
    now = time.time()
    assert (ok.status_code, refused.status_code) == (200, status)
    assert refused.headers["x-ratelimit-remaining"] == "0"
    assert now < int(refused.headers["x-ratelimit-reset"]) <= now + 32
    assert "retry-after" not in refused.headers
    assert "rate limit exceeded" in refused.json()["message"]
    hint = stormguard.wait_hint(429, refused.headers, now=now)
    assert hint is not None and 0 < hint <= 32
    assert 0 < mock.journal()[1]["retry_after"] <= 32  # the checker holds clients to it


def test_github_secondary_limit(stormguard_mock: Factory) -> None:
    """Secondary limit: 403 with Retry-After, and no exhausted X-RateLimit-Remaining."""
    mock = stormguard_mock(github_limit(status=403, secondary=True))
    with httpx.Client() as client:
        client.get(mock.url + "/x")
        refused = client.get(mock.url + "/x")
    assert refused.status_code == 403
    assert 1 <= int(refused.headers["retry-after"]) <= 30
    assert "x-ratelimit-remaining" not in refused.headers
    assert "secondary rate limit" in refused.json()["message"]
    assert mock.journal()[1]["retry_after"] >= 1


def test_a_client_that_ignores_the_github_reset_is_flagged() -> None:
    """Retrying a primary-limit 403 before X-RateLimit-Reset is an early retry."""
    with MockServer(github_limit(status=403, retry_after=False)) as mock, httpx.Client() as client:
        client.get(mock.url + "/x")
        codes = [client.get(mock.url + "/x").status_code for _ in range(2)]
        report = mock.check(retryable_statuses={403, 429})
    assert codes == [403, 403]
    assert "early-retry" in report.kinds()


def test_the_github_example_plays_both_limits() -> None:
    """examples/github.yaml: a primary 403 without Retry-After, a secondary 403 with it."""
    example = Path(__file__).resolve().parents[2] / "examples" / "github.yaml"
    with MockServer(example) as mock, httpx.Client(base_url=mock.url) as client:
        reads = [client.get("/repos/octo/hello") for _ in range(6)]
        posts = [client.post("/repos/octo/hello/issues", json={}) for _ in range(3)]
        credentials = client.get("/user")
    assert [r.status_code for r in reads] == [200] * 5 + [403]
    assert reads[-1].headers["x-ratelimit-remaining"] == "0"
    assert "retry-after" not in reads[-1].headers
    assert [p.status_code for p in posts] == [201, 201, 403]
    assert "retry-after" in posts[-1].headers
    assert credentials.status_code == 403
    assert "x-ratelimit-remaining" not in credentials.headers


@pytest.mark.parametrize(
    ("limit", "words"),
    [
        ({"status": 500}, "expected 429 or 403"),
        ({"secondary": "yes"}, "expected true or false"),
        ({"secondary": True, "headers": "stripe"}, "needs headers: github"),
    ],
)
def test_rate_limit_options_are_validated(limit: dict[str, Any], words: str) -> None:
    """status, secondary and retry_after are checked at load."""
    spec = {"limit": 1, "window": 1, **limit}
    with pytest.raises(stormguard.ScenarioError, match=words):
        stormguard.mock.parse_scenario(one_route(rate_limit=spec))
