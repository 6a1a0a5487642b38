"""The HTTP proxy leg through a real gateway process and real upstream processes."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from local_gateway import until

Factory = Callable[..., Any]


def _config(up: Any, **route: Any) -> dict[str, Any]:
    upstream = route.pop("upstream_settings", {})
    extra = route.pop("extra", {})
    return {
        "upstreams": {"a": {"url": up.url, **upstream}},
        "routes": [{"path": "/", "upstream": "a", **route}],
        **extra,
    }


def _gateway(gateway_factory: Factory, up: Any, **route: Any) -> Any:
    return gateway_factory(_config(up, **route))


def test_headers_are_rewritten(upstream_factory: Factory, gateway_factory: Factory) -> None:
    """Hop-by-hop headers go, X-Forwarded-* and Via come, Idempotency-Key passes."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up)
    headers = {
        "Connection": "keep-alive, X-Hop",
        "X-Hop": "1",
        "Keep-Alive": "timeout=5",
        "X-Forwarded-For": "6.6.6.6",
        "Idempotency-Key": "k-1",
        "X-Other": "kept",
    }
    r = httpx.post(f"{gw.url}/echo?q=1", content=b"hello", headers=headers)
    assert r.status_code == 200
    seen = {k.lower(): v for k, v in r.json()["headers"].items()}
    assert r.json()["path"] == "/echo?q=1"
    assert r.json()["size"] == 5
    assert "x-hop" not in seen and "keep-alive" not in seen
    assert seen["x-forwarded-for"] == "127.0.0.1"  # an untrusted chain is replaced
    assert seen["x-forwarded-proto"] == "http"
    assert seen["x-forwarded-host"] == f"127.0.0.1:{gw.http_port}"
    assert seen["via"] == "1.1 stormguard"
    assert seen["idempotency-key"] == "k-1"
    assert seen["x-other"] == "kept"
    assert r.headers["via"] == "1.1 stormguard"


def test_bodies_stream_both_ways(upstream_factory: Factory, gateway_factory: Factory) -> None:
    """A large chunked upload arrives whole; a streamed answer arrives chunk by chunk."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up)

    def chunks() -> Any:
        for _ in range(50):
            yield b"y" * 10_000

    r = httpx.post(f"{gw.url}/echo", content=chunks())
    assert r.json()["size"] == 500_000
    with httpx.stream("GET", f"{gw.url}/stream?n=5") as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines == [f"chunk{i}" for i in range(5)]
    assert len(httpx.get(f"{gw.url}/big?n=300000").content) == 300_000


@pytest.mark.parametrize("chunked", [False, True])
def test_request_size_cap(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any, chunked: bool
) -> None:
    """A body over max_body gets 413 (declared or streamed) and never reaches the upstream."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, max_body=1000)
    body: Any = (b"z" * 500 for _ in range(4)) if chunked else b"z" * 2000
    r = httpx.post(f"{gw.url}/echo", content=body)
    assert r.status_code == 413
    assert r.headers["content-type"] == "application/problem+json"
    assert up.seen()["n"] == 0
    eventually(lambda: gw.status()["routes"]["/"].get("too_large") == 1)


def test_read_timeout_is_504(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """An upstream slower than timeout.read answers 504 (upstream_timeout)."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, upstream_settings={"timeout": {"connect": 1, "read": 0.3}})
    r = httpx.get(f"{gw.url}/slow?s=3", timeout=10)
    assert r.status_code == 504
    eventually(lambda: gw.status()["routes"]["/"].get("upstream_timeout") == 1)


def test_routes_match_prefix_methods_and_host(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """Longest prefix wins, methods and host narrow a route, no match is 404."""
    a, b = upstream_factory("a"), upstream_factory("b")
    gw = gateway_factory(
        {
            "upstreams": {"a": {"url": a.url}, "b": {"url": b.url}},
            "routes": [
                {"path": "/echo", "upstream": "a"},
                {"path": "/echo/b", "upstream": "b", "methods": ["POST"]},
                {"path": "/v1", "upstream": "b", "host": "api.example"},
            ],
        }
    )
    assert httpx.get(f"{gw.url}/echo/b").json()["name"] == "a"
    assert httpx.post(f"{gw.url}/echo/b").json()["name"] == "b"
    assert httpx.get(f"{gw.url}/echoes").status_code == 404
    assert httpx.get(f"{gw.url}/v1/x").status_code == 404
    assert httpx.get(f"{gw.url}/v1/x", headers={"Host": "api.example"}).json()["name"] == "b"


def test_round_robin_and_passive_ejection(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """Targets take turns; a dead target is ejected and its requests retried elsewhere."""
    a, b = upstream_factory("a"), upstream_factory("b")
    gw = gateway_factory(
        {
            "upstreams": {
                "u": {
                    "targets": [a.url, b.url],
                    "retries": {"attempts": 2, "budget": 0.5},
                    "eject": {"failures": 1, "for": 60},
                }
            },
            "routes": [{"path": "/", "upstream": "u"}],
        }
    )
    names = [httpx.get(f"{gw.url}/echo").json()["name"] for _ in range(4)]
    assert sorted(names) == ["a", "a", "b", "b"]
    b.stop()
    codes = [httpx.get(f"{gw.url}/echo").status_code for _ in range(6)]
    assert codes == [200] * 6
    assert a.seen()["n"] == 2 + 6


async def test_an_ejected_target_returns_when_its_ejection_ends(
    upstream_factory: Factory, local_gateway: Factory
) -> None:
    """An ejected target gets no request for `eject.for` seconds of the gateway's clock,
    then takes its turn again."""
    a, b = upstream_factory("a"), upstream_factory("b")
    config = {
        "upstreams": {
            "u": {
                "targets": [a.url, b.url],
                "retries": {"attempts": 2, "budget": 0.5},
                "eject": {"failures": 1, "for": 60},
            }
        },
        "routes": [{"path": "/", "upstream": "u"}],
    }
    gw = await local_gateway(config)
    async with httpx.AsyncClient(base_url=gw.url) as client:

        async def names(n: int) -> list[str]:
            return [(await client.get("/echo")).json()["name"] for _ in range(n)]

        assert sorted(await names(2)) == ["a", "b"]
        b.stop()
        assert await names(3) == ["a"] * 3  # b failed once (retried on a): ejected
        b.start()
        gw.clock.advance(59.0)
        assert await names(4) == ["a"] * 4
        gw.clock.advance(1.0)
        assert sorted(await names(4)) == ["a", "a", "b", "b"]


@pytest.mark.parametrize(("method", "upstream_hits"), [("GET", 2), ("POST", 1)])
def test_only_safe_failures_are_retried(
    upstream_factory: Factory, gateway_factory: Factory, method: str, upstream_hits: int
) -> None:
    """A 503 is retried for GET, never for an unkeyed POST (it may have been processed)."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, upstream_settings={"retries": {"attempts": 2, "budget": 1}})
    r = httpx.request(method, f"{gw.url}/status/503")
    assert r.status_code == 503
    assert up.seen()["n"] == upstream_hits


def test_limit_admits_exactly_n_per_client(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """N requests pass, the next gets 429 + Retry-After + RateLimit headers; others unaffected."""
    up = upstream_factory()
    gw = _gateway(
        gateway_factory,
        up,
        limits=["pc"],
        extra={
            "clients": {"key": ["header:X-API-Key", "ip"]},
            "limits": {"pc": {"algorithm": "sliding_window", "limit": 3, "window": 60}},
        },
    )
    alice = {"X-API-Key": "alice-secret"}
    codes = [httpx.get(f"{gw.url}/echo", headers=alice).status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    r = httpx.get(f"{gw.url}/echo", headers=alice)
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["ratelimit-policy"] == '"pc";q=3;w=60'
    assert r.json()["status"] == 429
    assert httpx.get(f"{gw.url}/echo", headers={"X-API-Key": "bob"}).status_code == 200
    assert up.seen()["n"] == 4
    status = gw.status()
    assert status["routes"]["/"] == {"allowed": 4, "limited:pc": 3}
    alice_id = hashlib.sha256(b"h:x-api-key:alice-secret").hexdigest()[:8]
    assert status["top_limited_clients"][0] == {
        "client": alice_id,
        "reason": "limited:pc",
        "refusals": 3,
    }
    log = gw.logged('"policy":"limited:pc"', alice_id)
    assert "alice-secret" not in log


@pytest.mark.parametrize("method", ["GET", "POST"])  # the callback path; the ASGI path
async def test_a_limit_window_refills_on_the_gateway_clock(
    upstream_factory: Factory, local_gateway: Factory, method: str
) -> None:
    """A full window refuses (429, Retry-After up to its end) until the gateway's clock
    has moved past it; then the client has its whole limit again."""
    up = upstream_factory()
    limits = {"pc": {"algorithm": "fixed_window", "limit": 2, "window": 60}}
    gw = await local_gateway(_config(up, limits=["pc"], extra={"limits": limits}))
    body = b"x" if method == "POST" else None

    async def codes(client: httpx.AsyncClient, n: int) -> list[int]:
        return [(await client.request(method, "/echo", content=body)).status_code for _ in range(n)]

    async with httpx.AsyncClient(base_url=gw.url) as client:
        assert await codes(client, 3) == [200, 200, 429]
        gw.clock.advance(59.0)
        refused = await client.request(method, "/echo", content=body)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) == 1
        gw.clock.advance(1.0)
        assert await codes(client, 3) == [200, 200, 429]
    assert up.seen()["n"] == 4


def test_global_limit_refusal_takes_nothing_from_client_quota(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """Client and global limits are decided together: all or nothing."""
    up = upstream_factory()
    gw = _gateway(
        gateway_factory,
        up,
        limits=["pc", "all"],
        extra={
            "clients": {"key": ["header:X-API-Key"]},
            "limits": {
                "pc": {"algorithm": "sliding_window", "limit": 2, "window": 60},
                "all": {"algorithm": "sliding_window", "limit": 3, "window": 60, "per": "global"},
            },
        },
    )
    seq = [("a", 200), ("a", 200), ("b", 200), ("b", 429), ("a", 429)]
    for who, code in seq:
        assert httpx.get(f"{gw.url}/echo", headers={"X-API-Key": who}).status_code == code
    expected = {"allowed": 3, "limited:all": 1, "limited:pc": 1}
    eventually(lambda: gw.status()["routes"]["/"] == expected)


async def test_shaping_holds_instead_of_refusing(
    upstream_factory: Factory, local_gateway: Factory
) -> None:
    """With {delay: S} a burst is held and passes at the permitted rate, one request
    per 1/rate seconds of the gateway's clock; none waits past S."""
    up = upstream_factory()
    limits = {"pc": {"algorithm": "gcra", "rate": 0.5, "burst": 1}}
    gw = await local_gateway(
        _config(up, limits=["pc"], on_limit={"delay": 5}, extra={"limits": limits})
    )
    clock = gw.clock
    async with httpx.AsyncClient(base_url=gw.url) as client:
        burst = [asyncio.ensure_future(client.get("/echo")) for _ in range(3)]
        await until(lambda: sum(t.done() for t in burst) == 1 and clock.sleepers == 2)
        assert clock.sleeps == [2.0, 2.0]  # both told to come back in 1/rate s
        clock.advance(1.9)
        await asyncio.sleep(0.05)
        assert sum(t.done() for t in burst) == 1  # still held
        clock.advance(0.1)
        await until(lambda: sum(t.done() for t in burst) == 2 and clock.sleepers == 1)
        clock.advance(2.0)
        answers = await asyncio.gather(*burst)
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert clock.sleeps == [2.0, 2.0, 2.0]
    assert up.seen()["n"] == 3


async def test_shaping_refuses_what_would_wait_past_its_delay(
    upstream_factory: Factory, local_gateway: Factory
) -> None:
    """A request that would be held past `delay` is refused at once (429), and
    `reject` refuses every request over the limit without holding any."""
    up = upstream_factory()
    limits = {"pc": {"algorithm": "gcra", "rate": 0.5, "burst": 1}}
    held = await local_gateway(
        _config(up, limits=["pc"], on_limit={"delay": 1.5}, extra={"limits": limits})
    )
    rejecting = await local_gateway(
        _config(up, limits=["pc"], on_limit="reject", extra={"limits": limits})
    )
    for gw in (held, rejecting):
        async with httpx.AsyncClient(base_url=gw.url) as client:
            answers = await asyncio.gather(*(client.get("/echo") for _ in range(3)))
        assert sorted(r.status_code for r in answers) == [200, 429, 429]
        assert gw.clock.sleeps == []
    assert up.seen()["n"] == 2


async def test_idempotency_require_executes_once(
    upstream_factory: Factory, local_gateway: Factory
) -> None:
    """require: 400 without a key; a keyed POST runs once, retries replay, changes get
    422, and the same key while the first is in flight gets 409 + Retry-After."""
    up = upstream_factory()
    gw = await local_gateway(_config(up, idempotency="require"))
    async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
        assert (await client.post("/echo")).status_code == 400
        key = {"Idempotency-Key": "order-1"}
        first = await client.post("/echo", content=b"buy", headers=key)
        again = await client.post("/echo", content=b"buy", headers=key)
        assert first.status_code == again.status_code == 200
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json() == first.json()
        assert (await client.post("/echo", content=b"sell", headers=key)).status_code == 422
        assert up.seen()["n"] == 1
        slow_key = {"Idempotency-Key": "order-2"}
        held = asyncio.ensure_future(client.post("/slow?s=30", headers=slow_key))
        await until(lambda: up.seen()["in_flight"] == 1)
        conflict = await client.post("/slow?s=30", headers=slow_key)
        assert conflict.status_code == 409 and "retry-after" in conflict.headers
        assert not held.done()
        held.cancel()
        await until(lambda: up.seen()["in_flight"] == 0)
    routes = (await gw.status())["routes"]["/"]
    assert routes["idempotency_conflict"] == 1
    assert routes["idempotency_mismatch"] == 1
    assert routes["idempotency_invalid"] == 1


def test_idempotency_releases_the_claim_on_5xx(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """An upstream 5xx is not stored: the retry with the same key runs again."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, idempotency="honor")
    key = {"Idempotency-Key": "pay-1"}
    assert httpx.post(f"{gw.url}/status/500", headers=key).status_code == 500
    assert httpx.post(f"{gw.url}/status/500", headers=key).status_code == 500
    assert httpx.post(f"{gw.url}/echo").status_code == 200  # honor: keyless passes
    assert up.seen()["n"] == 3


async def test_breaker_opens_fails_fast_and_recovers(
    upstream_factory: Factory, local_gateway: Factory
) -> None:
    """Upstream killed: 502s open the breaker, then 503 + Retry-After for its whole
    cooldown on the gateway's clock; after it, one half-open probe, then traffic."""
    up = upstream_factory()
    breaker = {"min_calls": 3, "failure_rate": 0.5, "window": 30, "open_for": 4}
    gw = await local_gateway(_config(up, upstream_settings={"breaker": breaker}))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        assert (await client.get("/echo")).status_code == 200
        up.stop()
        answers = [await client.get("/echo") for _ in range(6)]
        assert [r.status_code for r in answers] == [502, 502] + [503] * 4
        assert all(1 <= int(r.headers["retry-after"]) <= 4 for r in answers[2:])
        assert (await gw.status())["upstreams"]["a"]["breaker"] == "open"
        up.start()
        gw.clock.advance(3.5)  # open_for 4, shortened by at most its jitter (10 %): 3.6
        assert (await client.get("/echo")).status_code == 503
        assert up.seen()["n"] == 0
        gw.clock.advance(0.5)
        assert (await client.get("/echo")).status_code == 200
        assert up.seen()["n"] == 1  # exactly the half-open probe, then normal traffic
        assert (await gw.status())["upstreams"]["a"]["breaker"] == "closed"
        assert (await client.get("/echo")).status_code == 200


async def test_bulkhead_keeps_other_upstream_responsive(
    upstream_factory: Factory, local_gateway: Factory
) -> None:
    """A slow upstream fills its own bulkhead (503) while another upstream answers at once."""
    slow, fast = upstream_factory("slow"), upstream_factory("fast")
    gw = await local_gateway(
        {
            "upstreams": {
                "slow": {"url": slow.url, "bulkhead": {"limit": 2, "max_wait": 0}},
                "fast": {"url": fast.url},
            },
            "routes": [
                {"path": "/slow", "upstream": "slow"},
                {"path": "/echo", "upstream": "fast"},
            ],
        }
    )
    pool = gw.runtime.upstreams["slow"]
    async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
        held = [asyncio.ensure_future(client.get("/slow?s=30")) for _ in range(2)]
        await until(lambda: pool.in_flight == 2 and slow.seen()["in_flight"] == 2)
        r = await client.get("/slow?s=0")
        assert r.status_code == 503
        assert r.json()["status"] == 503 and "retry-after" in r.headers
        assert [(await client.get("/echo")).status_code for _ in range(5)] == [200] * 5
        assert pool.in_flight == 2 and not any(t.done() for t in held)
        for t in held:  # the held clients leave: their slots and upstream calls end
            t.cancel()
        await until(lambda: pool.in_flight == 0 and slow.seen()["in_flight"] == 0)
    assert (await gw.status())["routes"]["/slow"].get("bulkhead_full") == 1


async def test_a_bulkhead_waiter_gives_up_after_max_wait_on_the_gateway_clock(
    upstream_factory: Factory, local_gateway: Factory
) -> None:
    """A request that finds the bulkhead full waits for a slot `max_wait` seconds of the
    gateway's clock, then gets 503; a slot freed before that admits it instead."""
    up = upstream_factory()
    gw = await local_gateway(
        _config(up, upstream_settings={"bulkhead": {"limit": 1, "max_wait": 5}})
    )
    async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
        held = asyncio.ensure_future(client.get("/hold?key=slot"))
        await until(lambda: up.seen()["in_flight"] == 1)
        bulkhead = gw.runtime.upstreams["a"].bulkhead.bulkhead
        waiting = asyncio.ensure_future(client.get("/echo"))
        await until(lambda: bulkhead.waiting == 1)  # its wait began on the clock's now
        gw.clock.advance(4.9)
        await asyncio.sleep(0.05)  # (the waiter reads the clock every 10 ms)
        assert not waiting.done()
        gw.clock.advance(0.2)
        refused = await asyncio.wait_for(waiting, 2.0)  # (not the 5 s of a real clock)
        assert refused.status_code == 503 and "retry-after" in refused.headers
        second = asyncio.ensure_future(client.get("/echo"))
        await until(lambda: bulkhead.waiting == 1)
        gw.clock.advance(4.0)
        up.release("slot")
        assert (await held).status_code == 200
        assert (await second).status_code == 200
    assert up.seen()["n"] == 2


def test_vanished_client_cancels_upstream_and_frees_slot(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """A client that disconnects mid-request frees its bulkhead slot and the upstream call."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, upstream_settings={"bulkhead": {"limit": 1}})
    sock = socket.create_connection(("127.0.0.1", gw.http_port))
    sock.sendall(b"GET /slow?s=30 HTTP/1.1\r\nHost: x\r\n\r\n")
    eventually(lambda: up.seen()["in_flight"] == 1)
    eventually(lambda: gw.status()["upstreams"]["a"]["in_flight"] == 1)
    sock.close()
    eventually(lambda: up.seen()["in_flight"] == 0)
    eventually(lambda: gw.status()["upstreams"]["a"]["in_flight"] == 0)
    assert httpx.get(f"{gw.url}/echo").status_code == 200


def test_slowloris_head_is_cut(upstream_factory: Factory, gateway_factory: Factory) -> None:
    """A client trickling its request head is disconnected after header_timeout."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, extra={"header_timeout": 0.5})
    with socket.create_connection(("127.0.0.1", gw.http_port)) as sock:
        sock.settimeout(10)
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\n")
        assert sock.recv(100) == b""  # closed by the gateway, no answer
    assert up.seen()["n"] == 0


def test_half_sent_body_is_cut(upstream_factory: Factory, gateway_factory: Factory) -> None:
    """A body that stops arriving gets 408 after body_timeout; the upstream never sees it."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, extra={"body_timeout": 0.5})
    with socket.create_connection(("127.0.0.1", gw.http_port)) as sock:
        sock.settimeout(10)
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        answer = sock.recv(1000)
    assert answer.startswith(b"HTTP/1.1 408")
    assert up.seen()["n"] == 0


def test_admin_endpoints(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """/healthz, /readyz, /metrics and /status answer; /status has the documented shape."""
    up = upstream_factory()
    gw = _gateway(gateway_factory, up, upstream_settings={"bulkhead": {"limit": 7}})
    httpx.get(f"{gw.url}/echo")
    assert gw.admin("/healthz")[0] == 200
    assert gw.admin("/readyz")[0] == 200
    code, metrics = gw.admin("/metrics")
    assert code == 200
    assert b'stormguard_gateway_requests_total{outcome="allowed",route="/"} 1.0' in metrics
    eventually(lambda: gw.status()["upstreams"]["a"]["in_flight"] == 0)  # gauges refresh
    status = gw.status()
    upstream = status["upstreams"]["a"]
    assert upstream["breaker"] == "closed"
    assert upstream["bulkhead_limit"] == 7
    assert status["routes"]["/"] == {"allowed": 1}
    assert set(upstream["latency_ms"]) == {"p50", "p99"}


def test_trusted_proxy_forwarded_for(upstream_factory: Factory, gateway_factory: Factory) -> None:
    """Behind a trusted proxy the forwarded address names the client and the chain grows."""
    up = upstream_factory()
    gw = _gateway(
        gateway_factory,
        up,
        limits=["pc"],
        extra={
            "clients": {"key": ["ip"], "trusted_proxies": ["127.0.0.0/8"]},
            "limits": {"pc": {"algorithm": "token_bucket", "rate": 0.001, "burst": 1}},
        },
    )
    first = httpx.get(f"{gw.url}/echo", headers={"X-Forwarded-For": "198.51.100.7"})
    seen = {k.lower(): v for k, v in first.json()["headers"].items()}
    assert seen["x-forwarded-for"] == "198.51.100.7, 127.0.0.1"
    again = httpx.get(f"{gw.url}/echo", headers={"X-Forwarded-For": "198.51.100.7"})
    other = httpx.get(f"{gw.url}/echo", headers={"X-Forwarded-For": "198.51.100.8"})
    assert (again.status_code, other.status_code) == (429, 200)
