"""The dashboard's files on the admin listener, and what /status gives the page."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from stormguard.gateway._app import AdminApp
from stormguard.gateway._cli import gateway_group
from stormguard.gateway._config import parse_config
from stormguard.gateway._dashboard import DASHBOARD_PATHS
from stormguard.gateway._h1client import ConnectTimeout, ReadTimeout, UpstreamConnectError
from stormguard.gateway._history import History, Snapshot, history_settings
from stormguard.gateway._metrics import BREAKER_CODES, GatewayMetrics, StatusBuilder
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
        ("/dashboard-charts.js", b"text/javascript; charset=utf-8"),
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


@pytest.mark.parametrize(
    "name", ["dashboard.html", "dashboard.css", "dashboard.js", "dashboard-charts.js"]
)
def test_assets_are_package_data_without_other_origins(name: str) -> None:
    """The files ship inside the package and load nothing from another origin (no CDN)."""
    text = resources.files("stormguard.gateway").joinpath("static", name).read_text()
    # The SVG namespace is a name, not an address: nothing is fetched from it.
    text = text.replace('"http://www.w3.org/2000/svg"', '"SVG_NS"')
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
    linked = set(re.findall(r'(?:href|src)="(/dashboard[a-z-]*\.[a-z]+)"', html))
    assert linked == {"/dashboard.css", "/dashboard.js", "/dashboard-charts.js"}
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
    owned_redis: Any, upstream_factory: Any, gateway_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--workers 2: the supervisor serves the page, and /status and /history count answers
    from both workers."""
    monkeypatch.setenv("STORMGUARD_HISTORY_BUCKET", "0.2")
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
    assert upstream["answers"]["2xx"] == 6
    assert upstream["routes"] == {"/": "http"}
    for _ in range(50):  # the sampler closes a bucket every 0.2 s
        doc = json.loads(gw.admin("/history")[1])
        t, rates = doc["t"], doc["upstreams"]["a"]["answers"]["2xx"]
        seen = sum(r * (t[i] - t[i - 1]) for i, r in enumerate(rates) if i > 0)
        if round(seen) == 6:
            break
        threading.Event().wait(0.1)
    assert round(seen) == 6  # both workers' answers, bucket by bucket


def test_status_gives_every_upstream_its_answers_by_class() -> None:
    """/status counts each upstream's answers by class, timeouts and connect errors (pinned)."""
    metrics = GatewayMetrics()
    for status in (200, 204, 302, 404, 500, 503, 503):
        metrics.observe_latency("orders", 0.01, status)
    metrics.upstream_failed("orders", ReadTimeout("silent"))
    metrics.upstream_failed("orders", ConnectTimeout("no connection in time"))
    metrics.upstream_failed("orders", UpstreamConnectError("refused"))
    status = StatusBuilder(metrics, _facts(parse_config(CONFIG))).status()
    assert status["upstreams"]["orders"]["answers"] == {
        "2xx": 2,
        "3xx": 1,
        "4xx": 1,
        "5xx": 3,
        "timeout": 1,
        "connect_error": 2,
    }
    assert status["upstreams"]["greeter"]["answers"] == dict.fromkeys(
        ("2xx", "3xx", "4xx", "5xx", "timeout", "connect_error"), 0
    )


def _outage(builder: StatusBuilder, metrics: GatewayMetrics) -> None:
    # t=100: baseline; 101: 5 fine answers; 102: 4 answers of 503; 103: breaker open.
    builder.sample(100.0)
    for _ in range(5):
        metrics.count("/v1/orders", "allowed")
        metrics.observe_latency("orders", 0.004, 200)
    builder.sample(101.0)
    for _ in range(4):
        metrics.count("/v1/orders", "allowed")
        metrics.observe_latency("orders", 0.2, 503)
    builder.sample(102.0)
    metrics.breaker.labels("orders").set(BREAKER_CODES["open"])
    for _ in range(6):
        metrics.count("/v1/orders", "breaker_open")
    builder.sample(103.5)


def test_history_keeps_the_outage_bucket_by_bucket() -> None:
    """/history: per bucket the rates by outcome, the answers by class, latency and breaker."""
    metrics = GatewayMetrics()
    builder = StatusBuilder(metrics, _facts(parse_config(CONFIG)), History(1.0, 60.0))
    _outage(builder, metrics)
    doc = builder.history_document()
    assert doc["t"] == [101.0, 102.0, 103.5]
    assert doc["bucket_seconds"] == 1.0
    assert doc["requests"] == [5.0, 4.0, 4.0]  # 6 in 1.5 s
    assert doc["outcomes"] == {"allowed": [5.0, 4.0, 0.0], "breaker_open": [0.0, 0.0, 4.0]}
    orders = doc["upstreams"]["orders"]
    assert orders["answers"]["2xx"] == [5.0, 0.0, 0.0]
    assert orders["answers"]["5xx"] == [0.0, 4.0, 0.0]
    assert orders["breaker"] == ["closed", "closed", "open"]
    p50 = orders["latency_ms"]["p50"]
    assert p50[0] is not None and p50[0] <= 5.0
    assert p50[1] is not None and 100.0 < p50[1] <= 250.0  # this bucket's answers only
    assert p50[2] is None  # no answer in it
    assert doc["upstreams"]["greeter"]["breaker"] == ["closed"] * 3


def test_history_is_a_bounded_ring() -> None:
    """Only the last span/bucket buckets stay; the oldest go first."""
    history = History(2.0, 10.0)
    for i in range(20):
        history.record(2.0 * i, Snapshot(outcomes={"allowed": float(i * i)}))
    assert len(history) == 5
    doc = history.document(())
    assert doc["t"] == [30.0, 32.0, 34.0, 36.0, 38.0]
    assert doc["outcomes"]["allowed"] == [(i * i - (i - 1) ** 2) / 2 for i in range(15, 20)]


def test_history_survives_a_counter_going_back_and_the_clock_too() -> None:
    """A restarted worker's counters count from zero; a clock going back sets a new baseline."""
    history = History(1.0, 60.0)
    history.record(10.0, Snapshot(outcomes={"allowed": 50.0}))
    history.record(11.0, Snapshot(outcomes={"allowed": 3.0}))
    history.record(9.0, Snapshot(outcomes={"allowed": 4.0}))
    history.record(10.0, Snapshot(outcomes={"allowed": 6.0}))
    assert history.document(())["outcomes"]["allowed"] == [3.0, 2.0]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STORMGUARD_HISTORY_BUCKET": "soon"}, "STORMGUARD_HISTORY_BUCKET must be a number"),
        ({"STORMGUARD_HISTORY_BUCKET": "-1"}, "STORMGUARD_HISTORY_BUCKET must be a positive"),
        ({"STORMGUARD_HISTORY_SECONDS": "nan"}, "STORMGUARD_HISTORY_SECONDS must be a positive"),
        (
            {"STORMGUARD_HISTORY_BUCKET": "5", "STORMGUARD_HISTORY_SECONDS": "2"},
            "STORMGUARD_HISTORY_SECONDS (2) must be at least",
        ),
    ],
)
def test_history_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    """A bad history setting fails with the variable's name."""
    with pytest.raises(ValueError, match=re.escape(message)):
        history_settings(env)


def test_history_settings_default_to_a_second_over_five_minutes() -> None:
    """Without the variables: 1 s buckets over 300 s; with them, what they say."""
    assert history_settings({}) == (1.0, 300.0)
    assert history_settings({"STORMGUARD_HISTORY_BUCKET": "0.25"}) == (0.25, 300.0)


async def test_admin_app_samples_between_startup_and_shutdown() -> None:
    """The admin app's lifespan runs the sampler; /history serves what it kept."""
    times = iter(range(1000, 2000))
    metrics = GatewayMetrics()
    builder = StatusBuilder(metrics, _facts(parse_config(CONFIG)), History(0.01, 60.0))
    app = AdminApp(builder, clock=lambda: float(next(times)))
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    lifespan = asyncio.ensure_future(app({"type": "lifespan"}, inbox.get, send))
    await inbox.put({"type": "lifespan.startup"})
    while len(builder.history) < 3:
        metrics.count("/v1/orders", "allowed")
        await asyncio.sleep(0.005)
    await inbox.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(lifespan, 5)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    kept = len(builder.history)
    await asyncio.sleep(0.05)
    assert len(builder.history) == kept  # the sampler stopped
    status, headers, body = await _get(app, "/history")
    assert status == 200
    assert headers[b"content-type"] == b"application/json"
    doc = json.loads(body)
    assert doc["t"][:2] == [1001.0, 1002.0]
    assert sum(doc["outcomes"]["allowed"]) > 0
    assert set(doc["upstreams"]) == {"orders", "greeter"}


def test_gateway_start_refuses_a_bad_history_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stormguard gateway --config FILE` stops before serving, naming the variable."""
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG)
    monkeypatch.setenv("STORMGUARD_HISTORY_BUCKET", "0")
    result = CliRunner().invoke(gateway_group, ["--config", str(path)])
    assert result.exit_code == 1
    assert "STORMGUARD_HISTORY_BUCKET must be a positive number of seconds" in result.output


@pytest.mark.slow
def test_status_answers_count_what_a_real_gateway_got_on_both_paths(
    upstream_factory: Any, gateway_factory: Any
) -> None:
    """Each class, a timeout and a refused connection, through the callback path (GET) and
    the ASGI path (POST with a body): /status counts each attempt once, where it happened."""
    from net_support import refused_port

    up = upstream_factory()
    live = {"url": up.url, "timeout": {"read": 0.3}}
    dead = {"url": f"http://127.0.0.1:{refused_port()}", "timeout": {"connect": 0.5}}
    gw = gateway_factory(
        {
            "access_log": False,
            "upstreams": {"live": live, "dead": dead},
            "routes": [
                {"path": "/echo", "upstream": "live"},
                {"path": "/status", "upstream": "live"},
                {"path": "/slow", "upstream": "live"},
                {"path": "/v1", "upstream": "dead"},
            ],
        }
    )
    expected = {"/echo": 200, "/status/404": 404, "/status/503": 503, "/slow?s=2": 504}
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for path, code in [*expected.items(), ("/v1/x", 502)]:
            assert client.get(path).status_code == code, path
            assert client.post(path, content=b"a body").status_code == code, path
    answers = {name: row["answers"] for name, row in gw.status()["upstreams"].items()}
    zero = dict.fromkeys(("2xx", "3xx", "4xx", "5xx", "timeout", "connect_error"), 0)
    assert answers["live"] == {**zero, "2xx": 2, "4xx": 2, "5xx": 2, "timeout": 2}
    assert answers["dead"] == {**zero, "connect_error": 2}


def test_history_started_counts_what_came_before_the_first_sample() -> None:
    """Started at the gateway's start, the first bucket holds the requests served before
    the first sample (a late first sample loses none of them)."""
    history = History(1.0, 60.0)
    history.start(10.0)
    history.record(11.0, Snapshot(outcomes={"allowed": 4.0}))
    history.record(12.0, Snapshot(outcomes={"allowed": 6.0}))
    assert history.document(())["outcomes"]["allowed"] == [4.0, 2.0]
    history.start(12.0)  # started already: no new baseline
    history.record(13.0, Snapshot(outcomes={"allowed": 7.0}))
    assert history.document(())["outcomes"]["allowed"] == [4.0, 2.0, 1.0]
