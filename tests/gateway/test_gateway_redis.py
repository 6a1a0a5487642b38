"""Several gateway processes on one real Redis: exact shared limits, a fleet-wide
breaker, store outages in each mode, and --workers N."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

Factory = Callable[..., Any]

pytestmark = pytest.mark.redis


def _config(redis: Any, up: Any, **extra: Any) -> dict[str, Any]:
    upstream = extra.pop("upstream", {})
    route = extra.pop("route", {})
    return {
        "store": redis.url,
        "clients": {"key": ["header:X-API-Key", "ip"]},
        "upstreams": {"a": {"url": up.url, **upstream}},
        "limits": {
            "pc": {"algorithm": "sliding_window", "limit": 5, "window": 600},
            "all": {"algorithm": "sliding_window", "limit": 8, "window": 600, "per": "global"},
        },
        "routes": [{"path": "/", "upstream": "a", "limits": ["pc", "all"], **route}],
        **extra,
    }


def test_two_gateways_share_limits_exactly(
    owned_redis: Any, upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """A client limited to N gets exactly N through two gateways; the global limit holds."""
    up = upstream_factory()
    gateways = [gateway_factory(_config(owned_redis, up)) for _ in range(2)]
    codes = [
        httpx.get(f"{gateways[i % 2].url}/echo", headers={"X-API-Key": "alice"}).status_code
        for i in range(10)
    ]
    assert codes.count(200) == 5
    assert codes[:5] == [200] * 5
    bob = [
        httpx.get(f"{gateways[i % 2].url}/echo", headers={"X-API-Key": "bob"}).status_code
        for i in range(5)
    ]
    assert bob == [200, 200, 200, 429, 429]  # the global limit (8) binds, across both
    assert up.seen()["n"] == 8


def test_breaker_is_fleet_wide(
    owned_redis: Any, upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """Opened through one gateway, both refuse; half-open lets one probe through in total."""
    up = upstream_factory()
    breaker = {"min_calls": 2, "failure_rate": 0.5, "window": 60, "open_for": 3}
    config = _config(owned_redis, up, upstream={"breaker": breaker}, routes=None)
    config["routes"] = [{"path": "/", "upstream": "a"}]
    gw1, gw2 = gateway_factory(config), gateway_factory(config)
    assert [httpx.get(f"{gw1.url}/status/500").status_code for _ in range(2)] == [500, 500]
    # gw2 never saw a failure; it learns the open state from Redis (its near cache
    # is at most `staleness` old) and then refuses without contacting the upstream.
    eventually(lambda: gw2.status()["upstreams"]["a"]["breaker"] == "open")
    seen = up.seen()["n"]
    assert httpx.get(f"{gw2.url}/status/500").status_code == 503
    assert up.seen()["n"] == seen
    eventually(lambda: gw2.status()["upstreams"]["a"]["breaker"] == "half_open", timeout=30)
    codes: list[int] = []

    def hit(gw: Any) -> None:
        codes.append(httpx.get(f"{gw.url}/status/500", timeout=20).status_code)

    threads = [threading.Thread(target=hit, args=(gw,)) for gw in (gw1, gw2) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert up.seen()["n"] == seen + 1  # exactly one probe reached the upstream
    assert sorted(codes) == [500] + [503] * 7


@pytest.mark.parametrize(
    ("mode", "while_down"),
    [("open", [200, 200, 200]), ("closed", [503, 503, 503]), ("local", [200, 200, 429])],
)
def test_redis_outage_follows_on_store_error(
    owned_redis: Any,
    upstream_factory: Factory,
    gateway_factory: Factory,
    eventually: Any,
    mode: str,
    while_down: list[int],
) -> None:
    """Redis killed: answers follow on_store_error, never a 500; Redis back: limits rejoin."""
    up = upstream_factory()
    config = _config(owned_redis, up, on_store_error=mode)
    config["limits"]["pc"]["limit"] = 2
    gw = gateway_factory(config)
    alice = {"X-API-Key": "alice"}
    assert httpx.get(f"{gw.url}/echo", headers=alice).status_code == 200
    owned_redis.stop()
    codes = [httpx.get(f"{gw.url}/echo", headers=alice).status_code for _ in range(3)]
    assert codes == while_down
    owned_redis.start()
    # Back on Redis (empty after the restart): two allowed, then refused -- shared again.
    eventually(lambda: gw.status()["store"] == "unavailable")

    def rejoined() -> bool:
        httpx.get(f"{gw.url}/echo", headers={"X-API-Key": "probe"})
        return bool(gw.status()["store"] == "ok")

    eventually(rejoined)
    after = [
        httpx.get(f"{gw.url}/echo", headers={"X-API-Key": "carol"}).status_code for _ in range(3)
    ]
    assert after == [200, 200, 429]


def test_workers_share_limits_and_metrics(
    owned_redis: Any, upstream_factory: Factory, gateway_factory: Factory, eventually: Any
) -> None:
    """--workers 2: the limit holds across workers; /metrics and /status add them up."""
    up = upstream_factory()
    gw = gateway_factory(_config(owned_redis, up), workers=2)
    codes = []
    for _ in range(9):
        with httpx.Client() as client:  # a new connection each time: spread over workers
            codes.append(client.get(f"{gw.url}/echo", headers={"X-API-Key": "alice"}).status_code)
    assert codes == [200] * 5 + [429] * 4
    # Counted right after each answer went out: poll until the last count lands.
    eventually(lambda: gw.status()["routes"]["/"] == {"allowed": 5, "limited:pc": 4})
    _, metrics = gw.admin("/metrics")
    assert b'stormguard_gateway_requests_total{outcome="allowed",route="/"} 5.0' in metrics
