"""Fleet mode on real gateway processes: shadow limits, shared named limits, the
memory store's bound, approximate limits within their bound, and exact limits on a
Redis that answers slowly under load."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

Factory = Callable[..., Any]
LONG = 1_000_000


def _get_many(
    urls: list[str], n: int, *, threads: int = 6, headers: dict[str, str] | None = None
) -> list[int]:
    """``n`` GETs spread round-robin over ``urls`` from ``threads`` keep-alive clients."""
    codes: list[int] = []
    lock = threading.Lock()
    turn = iter(range(n))

    def worker() -> None:
        with httpx.Client(timeout=30) as client:
            while True:
                with lock:
                    i = next(turn, None)
                if i is None:
                    return
                code = client.get(urls[i % len(urls)], headers=headers).status_code
                with lock:
                    codes.append(code)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return codes


def _access_lines(gw: Any) -> list[dict[str, Any]]:
    """The gateway's access log lines so far (JSON, one per request)."""
    lines = [line for line in gw.output().splitlines() if line.startswith('{"method"')]
    return [json.loads(line) for line in lines]


# -- shadow limits -----------------------------------------------------------------


@pytest.mark.parametrize("where", ["limit", "top"])
def test_shadow_limit_lets_requests_through_and_counts_would_refuse(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any, where: str
) -> None:
    """Over a shadow limit every request passes; /status, /metrics and the access log
    count the would-be refusals as shadow:<limit>, apart from real refusals."""
    up = upstream_factory()
    limit: dict[str, Any] = {"algorithm": "fixed_window", "limit": 2, "window": LONG}
    config: dict[str, Any] = {
        "clients": {"key": ["header:X-API-Key", "ip"]},
        "upstreams": {"a": {"url": up.url}},
        "limits": {"trial": limit},
        "routes": [{"path": "/", "upstream": "a", "limits": ["trial"]}],
    }
    if where == "limit":
        limit["shadow"] = True
    else:
        config["shadow"] = True
    gw = gateway_factory(config)
    codes = [httpx.get(f"{gw.url}/echo", headers={"X-API-Key": "k"}).status_code for _ in range(5)]
    assert codes == [200] * 5
    assert up.seen()["n"] == 5
    status = eventually(lambda: gw.status()["shadow_refusals"].get("/"))
    assert status == {"shadow:trial": 3}
    assert gw.status()["routes"]["/"] == {"allowed": 5}  # no real refusal
    _, metrics = gw.admin("/metrics")
    assert b'stormguard_gateway_shadow_refusals_total{reason="shadow:trial",route="/"} 3.0' in (
        metrics
    )
    lines = eventually(lambda: len(_access_lines(gw)) >= 5 and _access_lines(gw))
    shadowed = [line.get("shadow") for line in lines]
    assert shadowed == [None, None, ["shadow:trial"], ["shadow:trial"], ["shadow:trial"]]
    assert [line["policy"] for line in lines] == ["allowed"] * 5


def test_shadow_limit_is_decided_after_the_enforced_ones(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """A request the enforced limit refuses is refused (429) and not counted by the shadow one."""
    up = upstream_factory()
    config = {
        "upstreams": {"a": {"url": up.url}},
        "limits": {
            "real": {"algorithm": "fixed_window", "limit": 3, "window": LONG},
            "trial": {"algorithm": "fixed_window", "limit": 1, "window": LONG, "shadow": True},
        },
        "routes": [{"path": "/", "upstream": "a", "limits": ["real", "trial"]}],
    }
    gw = gateway_factory(config)
    codes = [httpx.get(f"{gw.url}/echo").status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    assert eventually(lambda: gw.status()["shadow_refusals"].get("/")) == {"shadow:trial": 2}
    assert gw.status()["routes"]["/"] == {"allowed": 3, "limited:real": 2}


# -- two routes, one named limit -----------------------------------------------------


def _shared_config(store: str, up: Any, **limit: Any) -> dict[str, Any]:
    return {
        "store": store,
        "clients": {"key": ["header:X-API-Key", "ip"]},
        "upstreams": {"a": {"url": up.url}},
        "limits": {
            "shared": {"algorithm": "fixed_window", "limit": 6, "window": LONG, **limit},
            "everyone": {"algorithm": "token_bucket", "rate": 1e-6, "burst": 10, "per": "global"},
        },
        "routes": [
            {"path": "/echo/one", "upstream": "a", "limits": ["shared"]},
            {"path": "/echo/two", "upstream": "a", "limits": ["shared", "everyone"]},
        ],
    }


def test_two_routes_naming_one_limit_share_its_budget_in_one_process(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """Requests to two routes that name the same limit draw from one budget (memory store)."""
    up = upstream_factory()
    gw = gateway_factory(_shared_config("memory", up))
    alice = {"X-API-Key": "alice"}
    codes = [httpx.get(f"{gw.url}/echo/{'one' if i % 2 else 'two'}", headers=alice).status_code
             for i in range(10)]  # fmt: skip
    assert codes.count(200) == 6
    assert up.seen()["n"] == 6


@pytest.mark.redis
@pytest.mark.parametrize("sync", [None, 0.5])
def test_two_routes_naming_one_limit_share_its_budget_across_processes(
    owned_redis: Any, upstream_factory: Factory, gateway_factory: Factory, sync: float | None
) -> None:
    """Two gateways, two routes, one named limit: one budget of 6 (exact and approximate)."""
    up = upstream_factory()
    extra = {"sync": {"every": sync}} if sync else {}
    gateways = [gateway_factory(_shared_config(owned_redis.url, up, **extra)) for _ in range(2)]
    urls = [f"{gw.url}/echo/{route}" for gw in gateways for route in ("one", "two")]
    codes = _get_many(urls, 24, headers={"X-API-Key": "alice"})
    admitted = codes.count(200)
    if sync is None:
        assert admitted == 6
    else:  # never over; under by at most the units leases hold (N x lease <= limit / 4)
        assert 6 - 6 // 4 <= admitted <= 6
    assert up.seen()["n"] == admitted


# -- the memory store's bound --------------------------------------------------------


def test_memory_store_bound_counts_and_logs_forgotten_clients(
    upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """store_max_keys bounds the memory store; keys forgotten before their limit was
    full again are counted in /status and /metrics and logged once."""
    up = upstream_factory()
    config = {
        "store_max_keys": 3,
        "clients": {"key": ["header:X-API-Key"]},
        "upstreams": {"a": {"url": up.url}},
        "limits": {"pc": {"algorithm": "fixed_window", "limit": 5, "window": LONG}},
        "routes": [{"path": "/", "upstream": "a", "limits": ["pc"]}],
    }
    gw = gateway_factory(config)
    for i in range(8):
        assert httpx.get(f"{gw.url}/echo", headers={"X-API-Key": f"c{i}"}).status_code == 200
    eventually(lambda: gw.status()["store_evictions"] == 5)
    _, metrics = gw.admin("/metrics")
    assert b"stormguard_gateway_store_evictions_total 5.0" in metrics
    assert gw.output().count("memory store full (store_max_keys=3)") == 1


# -- approximate limits: within their bound ------------------------------------------

INSTANCES, EVERY, QUOTA = 3, 0.5, 60
APPROXIMATE = {
    "token_bucket": {"algorithm": "token_bucket", "rate": QUOTA / LONG, "burst": QUOTA},
    "gcra": {"algorithm": "gcra", "rate": QUOTA / LONG, "burst": QUOTA},
    "fixed_window": {"algorithm": "fixed_window", "limit": QUOTA, "window": LONG},
    "sliding_window": {"algorithm": "sliding_window", "limit": QUOTA, "window": LONG},
}


def _bound(limit: dict[str, Any], seconds: float) -> float:
    """The documented over-admission bound for ``seconds`` of traffic (fleet.md)."""
    if limit["algorithm"] in ("token_bucket", "gcra"):
        return limit["rate"] * (seconds + EVERY)  # rate * (T + every) beyond burst
    return 0.0  # windows: at most `limit` per window


@pytest.mark.redis
@pytest.mark.stress  # three gateways hammered on one Redis, ~15 s: `make stress`
def test_approximate_limits_stay_within_their_bound_on_several_processes(
    owned_redis: Any, upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """Three gateways on one Redis, each limit approximate: what the fleet admits is
    measured and stays within the formula (and above its under-admission bound)."""
    up = upstream_factory()
    config = {
        "store": owned_redis.url,
        "instances": INSTANCES,
        "clients": {"key": ["header:X-API-Key", "ip"]},
        "upstreams": {"a": {"url": up.url}},
        "limits": {
            name: {**limit, "per": "global", "sync": {"every": EVERY}}
            for name, limit in APPROXIMATE.items()
        },
        "routes": [
            {"path": f"/echo/{name}", "upstream": "a", "limits": [name]} for name in APPROXIMATE
        ],
    }
    gateways = [gateway_factory(config) for _ in range(INSTANCES)]
    for name, limit in APPROXIMATE.items():
        started = time.monotonic()
        codes = _get_many([f"{gw.url}/echo/{name}" for gw in gateways], 3 * QUOTA, threads=9)
        time.sleep(EVERY + 0.2)  # reservations expire and are given back
        codes += _get_many([f"{gw.url}/echo/{name}" for gw in gateways], QUOTA, threads=9)
        seconds = time.monotonic() - started
        admitted = codes.count(200)
        over = admitted - QUOTA
        assert set(codes) <= {200, 429}, name
        assert over <= _bound(limit, seconds), (name, admitted)
        # Under-admission: at most instances * lease (lease <= limit / (4 instances)).
        assert admitted >= QUOTA - QUOTA / 4, (name, admitted)


@pytest.mark.redis
@pytest.mark.slow
def test_approximate_token_bucket_with_refill_stays_within_its_bound(
    owned_redis: Any, upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """A refilling bucket shared approximately by three gateways admits at most
    burst + rate * (T + every) in T seconds."""
    up = upstream_factory()
    rate, burst = 40.0, 10.0
    config = {
        "store": owned_redis.url,
        "instances": INSTANCES,
        "upstreams": {"a": {"url": up.url}},
        "limits": {
            "tb": {
                "algorithm": "token_bucket",
                "rate": rate,
                "burst": burst,
                "per": "global",
                "sync": {"every": EVERY},
            }
        },
        "routes": [{"path": "/", "upstream": "a", "limits": ["tb"]}],
    }
    gateways = [gateway_factory(config) for _ in range(INSTANCES)]
    started = time.monotonic()
    codes = _get_many([f"{gw.url}/echo" for gw in gateways], 600, threads=9)
    seconds = time.monotonic() - started
    admitted = codes.count(200)
    assert set(codes) <= {200, 429}
    assert admitted <= burst + rate * (seconds + EVERY), (admitted, seconds)
    assert admitted >= burst  # it did admit (the bucket starts full)


# -- exact limits on a slow Redis, under load ----------------------------------------


def _load(ports: list[int], connections: int, seconds: float) -> None:
    """Keep ``connections`` keep-alive connections per port busy for ``seconds``
    (client "load"; run in a process of its own)."""
    import asyncio

    request = b"GET /echo HTTP/1.1\r\nHost: gw\r\nX-API-Key: load\r\n\r\n"

    async def one(port: int, deadline: float) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        loop = asyncio.get_running_loop()
        try:
            while loop.time() < deadline:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
        finally:
            writer.close()

    async def main() -> None:
        deadline = asyncio.get_running_loop().time() + seconds
        await asyncio.gather(
            *(one(port, deadline) for port in ports for _ in range(connections)),
            return_exceptions=True,
        )

    asyncio.run(main())


@pytest.mark.redis
@pytest.mark.stress  # two gateways under load on a stalling Redis, ~15 s: `make stress`
def test_exact_limits_stay_exact_on_a_redis_that_answers_slowly_under_load(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """Redis blocked for 90 ms again and again (alive, answering within 100 ms), two
    gateways under concurrent load: exactly N admitted, never an outage answer."""
    from redis_support import RedisProcess, command

    slow = RedisProcess(extra=("--enable-debug-command", "yes")).start()
    stop = threading.Event()

    def stall() -> None:  # another client keeps Redis busy: 90 ms of every ~100 ms
        while not stop.is_set():
            command(slow.port, "DEBUG", "SLEEP", "0.09")
            time.sleep(0.01)

    try:
        up = upstream_factory()
        config = {
            "store": slow.url,
            "on_store_error": "open",  # an outage answer would admit too many
            "clients": {"key": ["header:X-API-Key", "ip"]},
            "upstreams": {"a": {"url": up.url}},
            "limits": {
                "pc": {"algorithm": "sliding_window", "limit": 100, "window": LONG},
                "all": {"algorithm": "token_bucket", "rate": 1e9, "burst": 1e9, "per": "global"},
            },
            "routes": [{"path": "/", "upstream": "a", "limits": ["pc", "all"]}],
        }
        gateways = [gateway_factory(config) for _ in range(2)]
        staller = threading.Thread(target=stall)
        staller.start()
        import multiprocessing

        load = multiprocessing.get_context("spawn").Process(
            target=_load, args=([gw.http_port for gw in gateways], 48, 8.0)
        )
        load.start()
        time.sleep(1.0)  # the load is on
        codes = _get_many(
            [f"{gw.url}/echo" for gw in gateways], 300, threads=16, headers={"X-API-Key": "k"}
        )
        stop.set()
        staller.join()
        load.join()
        assert codes.count(200) == 100
        assert codes.count(429) == 200
        for gw in gateways:
            assert "shared store unreachable" not in gw.output()
            assert gw.status()["store"] == "ok"
    finally:
        stop.set()
        slow.discard()


# -- a Sentinel store ----------------------------------------------------------------


@pytest.mark.redis
def test_two_gateways_share_exact_limits_through_sentinel(
    redis_sentinel: Any, upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """store: redis+sentinel://...: two gateways decide on the master the sentinels name."""
    import uuid

    up = upstream_factory()
    name = f"pc-{uuid.uuid4().hex[:8]}"  # the Sentinel set is shared by the session
    config = {
        "store": redis_sentinel.url,
        "clients": {"key": ["header:X-API-Key", "ip"]},
        "upstreams": {"a": {"url": up.url}},
        "limits": {name: {"algorithm": "fixed_window", "limit": 4, "window": LONG}},
        "routes": [{"path": "/", "upstream": "a", "limits": [name]}],
    }
    gateways = [gateway_factory(config) for _ in range(2)]
    codes = _get_many([f"{gw.url}/echo" for gw in gateways], 10, headers={"X-API-Key": "s"})
    assert codes.count(200) == 4
    assert up.seen()["n"] == 4
