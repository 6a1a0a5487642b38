"""The dashboard's files on the admin listener, and what /status gives the page."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import httpx
import pytest

from stormguard.gateway._app import AdminApp
from stormguard.gateway._config import parse_config
from stormguard.gateway._dashboard import DASHBOARD_PATHS
from stormguard.gateway._metrics import GatewayMetrics, StatusBuilder
from stormguard.gateway._serve import _facts

CONFIG = """
upstreams:
  orders: {url: "http://127.0.0.1:9", bulkhead: {limit: 8}}
  greeter: {url: "grpc://127.0.0.1:9"}
routes:
  - {path: /v1/orders, upstream: orders}
  - {path: /ws, upstream: orders, websocket: {messages_per_second: 5}}
  - {grpc: helloworld.Greeter, upstream: greeter}
"""


async def _get(app: AdminApp, path: str) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "path": path, "method": "GET", "headers": []}, receive, send)
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), body


@pytest.fixture
def admin() -> AdminApp:
    """An admin app over a fresh registry and the facts of CONFIG."""
    return AdminApp(StatusBuilder(GatewayMetrics(), _facts(parse_config(CONFIG))))


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/", b"text/html; charset=utf-8"),
        ("/dashboard", b"text/html; charset=utf-8"),
        ("/dashboard.css", b"text/css; charset=utf-8"),
        ("/dashboard.js", b"text/javascript; charset=utf-8"),
    ],
)
async def test_dashboard_files_are_served(admin: AdminApp, path: str, content_type: bytes) -> None:
    """Each dashboard path answers 200 with its type, no caching and a same-origin policy."""
    status, headers, body = await _get(admin, path)
    assert status == 200
    assert headers[b"content-type"] == content_type
    assert headers[b"cache-control"] == b"no-cache"
    assert b"script-src 'self'" in headers[b"content-security-policy"]
    assert int(headers[b"content-length"]) == len(body) > 0


async def test_unknown_admin_path_is_still_404(admin: AdminApp) -> None:
    """The dashboard adds paths; anything else on the admin listener stays a 404."""
    status, _, _ = await _get(admin, "/dashboard.png")
    assert status == 404


@pytest.mark.parametrize("name", ["dashboard.html", "dashboard.css", "dashboard.js"])
def test_assets_are_package_data_without_other_origins(name: str) -> None:
    """The files ship inside the package and load nothing from another origin (no CDN)."""
    text = resources.files("stormguard.gateway").joinpath("static", name).read_text()
    assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE)
    assert "@import" not in text


def test_script_marks_breakers_by_the_pinned_attributes() -> None:
    """The script tags each breaker with data-upstream and data-breaker (the pinned contract)."""
    script = resources.files("stormguard.gateway").joinpath("static", "dashboard.js").read_text()
    assert '"data-upstream": name' in script
    assert "card.badge.dataset.breaker = state" in script
    assert "card.badge.textContent = STATE_TEXT[state]" in script


def test_every_dashboard_path_is_known() -> None:
    """The admin app routes exactly the pages and the two assets the page links to."""
    html = resources.files("stormguard.gateway").joinpath("static", "dashboard.html").read_text()
    linked = set(re.findall(r'(?:href|src)="(/dashboard\.[a-z]+)"', html))
    assert linked == {"/dashboard.css", "/dashboard.js"}
    assert linked | {"/", "/dashboard", "/dashboard/"} == DASHBOARD_PATHS


def test_status_names_each_upstreams_routes_and_their_protocol() -> None:
    """An upstream's facts list its routes as http, websocket or grpc (per-upstream panels)."""
    facts = _facts(parse_config(CONFIG))
    assert facts["orders"]["routes"] == {"/v1/orders": "http", "/ws": "websocket"}
    assert facts["greeter"]["routes"] == {"helloworld.Greeter": "grpc"}


def test_status_counts_upstream_answers_and_websocket_messages() -> None:
    """/status carries per-upstream answers (for requests/s) and WebSocket messages by direction."""
    metrics = GatewayMetrics()
    for _ in range(3):
        metrics.latency.labels("orders").observe(0.01)
    metrics.ws_messages.labels("/ws", "in").inc(5)
    metrics.ws_messages.labels("/ws", "out").inc(2)
    metrics.count("/v1/orders", "breaker_open")
    status = StatusBuilder(metrics, _facts(parse_config(CONFIG))).status()
    assert status["upstreams"]["orders"]["requests"] == 3
    assert "requests" not in status["upstreams"]["greeter"]
    assert status["websocket_messages"] == {"/ws": {"in": 5, "out": 2}}
    assert status["routes"]["/v1/orders"] == {"allowed": 0, "breaker_open": 1}


@pytest.mark.redis
@pytest.mark.slow
def test_workers_dashboard_and_status_add_up_every_worker(
    owned_redis: Any, upstream_factory: Any, gateway_factory: Any
) -> None:
    """--workers 2: the supervisor serves the page, and /status counts answers from both workers."""
    up = upstream_factory()
    config = {
        "store": owned_redis.url,
        "upstreams": {"a": {"url": up.url}},
        "routes": [{"path": "/", "upstream": "a"}],
    }
    gw = gateway_factory(config, workers=2)
    for _ in range(6):
        with httpx.Client() as client:  # a new connection each time: spread over workers
            assert client.get(f"{gw.url}/echo").status_code == 200
    code, page = gw.admin("/dashboard")
    assert code == 200
    assert b'<script src="/dashboard.js"' in page
    upstream = gw.status()["upstreams"]["a"]
    assert upstream["requests"] == up.seen()["n"] == 6
    assert upstream["routes"] == {"/": "http"}
