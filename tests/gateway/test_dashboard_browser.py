"""The dashboard in a real headless Chromium: a breaker opens and closes before a person's eyes.

Chromium is the system's (Debian `chromium`), driven by Playwright from PyPI with
`executable_path`; never `playwright install`. Without a browser these tests skip,
unless STORMGUARD_REQUIRE_BROWSER=1 (CI), where a missing browser fails the run.
"""

from __future__ import annotations

import http.client
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stormguard.gateway._clients import client_id
from stormguard.gateway._dashboard_shot import BROWSER_ARGS, find_chromium

Factory = Callable[..., Any]
PACE = 0.004  # seconds between two requests of one load thread (keeps 2 cores usable)
GREEDY, CALM = "greedy-client-key", "calm-client-key"

pytestmark = pytest.mark.slow


def _unavailable(why: str) -> None:
    if os.environ.get("STORMGUARD_REQUIRE_BROWSER") == "1":
        pytest.fail(f"STORMGUARD_REQUIRE_BROWSER=1 but {why}")
    pytest.skip(why)


@pytest.fixture
def browser() -> Iterator[Any]:
    """The system Chromium, launched headless (closed after the test)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed")
    executable = find_chromium()
    if executable is None:
        _unavailable("no chromium executable found")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=list(BROWSER_ARGS))
        try:
            yield launched
        finally:
            launched.close()


def _tab(browser: Any, width: int) -> Any:
    # A page ``width`` px wide; console errors collected in ``tab.errors``.
    tab = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.errors = errors
    return tab


@pytest.fixture
def page(browser: Any) -> Any:
    """A Chromium page 1280 px wide; console errors collected in ``page.errors``."""
    return _tab(browser, 1280)


class Load:
    """Background request loops against the gateway (one keep-alive connection each)."""

    def __init__(self, port: int, keys: list[str], path: str = "/api/echo") -> None:
        self.port = port
        self.path = path  # read before each request: a test may change it under load
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in keys]

    def _loop(self, key: str) -> None:
        while not self.stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            try:
                while not self.stop.is_set():
                    conn.request("GET", self.path, headers={"X-API-Key": key})
                    conn.getresponse().read()
                    self.stop.wait(PACE)
            except (OSError, http.client.HTTPException):
                self.stop.wait(PACE)
            finally:
                conn.close()

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


def _count(page: Any, reason: str) -> int:
    cell = page.query_selector(f'[data-refusals="{reason}"]')
    return int(cell.inner_text().replace(",", "")) if cell is not None else 0


def _breaker(state: str) -> str:
    return f'[data-upstream="orders"][data-breaker="{state}"]'


def test_dashboard_shows_breaker_open_refusals_and_recovery(
    page: Any, upstream_factory: Factory, gateway_factory: Factory, tmp_path: Path
) -> None:
    """Upstream killed under load: open within 5 s, refusals rise, closed after it returns."""
    up = upstream_factory("orders")
    gw = gateway_factory(
        {
            "access_log": False,
            "clients": {"key": ["header:X-API-Key", "ip"]},
            "upstreams": {
                "orders": {
                    "url": up.url,
                    "timeout": {"connect": 0.5, "read": 2.0},
                    "breaker": {"failure_rate": 0.5, "min_calls": 5, "window": 2, "open_for": 1},
                    "bulkhead": {"limit": 20},
                }
            },
            "limits": {
                "per-client": {
                    "algorithm": "token_bucket",
                    "rate": 20,
                    "burst": 20,
                    "per": "client",
                }
            },
            "routes": [{"path": "/api", "upstream": "orders", "limits": ["per-client"]}],
        }
    )
    page.goto(f"http://127.0.0.1:{gw.admin_port}/dashboard")
    closed = page.wait_for_selector(_breaker("closed"), timeout=30_000)
    assert closed.inner_text() == "closed"
    with Load(gw.http_port, [GREEDY, CALM]):
        page.wait_for_selector('[data-refusals="limited:per-client"]', timeout=30_000)
        up.stop()
        opened = page.wait_for_selector(_breaker("open"), timeout=5_000)
        assert opened.inner_text() == "open"
        page.wait_for_function(
            "() => Number((document.querySelector('[data-refusals=\"breaker_open\"]') || "
            "{innerText: '0'}).innerText.replace(/,/g, '')) > 0",
            timeout=30_000,
        )
        first = _count(page, "breaker_open")
        page.wait_for_function(
            f"() => Number(document.querySelector('[data-refusals=\"breaker_open\"]')"
            f".innerText.replace(/,/g, '')) > {first}",
            timeout=30_000,
        )
        page.screenshot(path=str(tmp_path / "dashboard-outage.png"), full_page=True)
        up.start()
        reclosed = page.wait_for_selector(_breaker("closed"), timeout=60_000)
        assert reclosed.inner_text() == "closed"
    assert _count(page, "breaker_open") > first
    greedy = client_id(f"h:x-api-key:{GREEDY}")  # the key as header rules build it
    clients = page.inner_text("#clients")
    assert greedy in clients
    assert GREEDY not in page.content()
    assert page.query_selector_all(".history span.open")  # the outage stays in the history
    assert page.errors == []


def test_dashboard_shows_the_overload_limit(
    page: Any, upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """An upstream under overload control shows its limit and line; one without says off."""
    up = upstream_factory("orders")
    gw = gateway_factory(
        {
            "access_log": False,
            "upstreams": {
                "orders": {"url": up.url, "overload": {"limit": 7}, "admission": True},
                "plain": {"url": up.url},
            },
            "routes": [
                {"path": "/api", "upstream": "orders"},
                {"path": "/other", "upstream": "plain"},
            ],
        }
    )
    page.goto(f"http://127.0.0.1:{gw.admin_port}/dashboard")
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-stat=\"overload\"]')]"
        ".some((d) => d.innerText.startsWith('7,'))",
        timeout=30_000,
    )
    texts = sorted(d.inner_text() for d in page.query_selector_all('[data-stat="overload"]'))
    assert texts == ["7, 0 waiting, admission control", "off"]
    assert page.errors == []


# What the charts show, read from the drawing (the pinned data-chart hooks):
# a series' values and the height of its drawn line, and the breaker band's runs.
_CHART_STATE = """([answers, refusals, band]) => {
  const series = (chart, name) => {
    const path = document.querySelector(`[data-chart="${chart}"] path[data-series="${name}"]`);
    if (!path) return null;
    return { values: path.dataset.values.split(",").map((v) => (v === "" ? null : Number(v))),
             rise: path.getBBox().height };
  };
  const runs = [...document.querySelectorAll(`[data-chart="${band}"] rect[data-state]`)].map(
    (r) => ({ state: r.dataset.state, from: Number(r.dataset.from), to: Number(r.dataset.to),
              width: r.getBBox().width }));
  const t = document.querySelector(`[data-chart="${answers}"] svg.plot`)?.dataset.t;
  return { t: t ? t.split(",").map(Number) : [], fivexx: series(answers, "5xx"),
           twoxx: series(answers, "2xx"), refused: series(refusals, "breaker_open"), runs };
}"""
_CHARTS = ["answers:orders", "refusals", "breaker:orders"]
_OUTAGE_SHOWN = f"""() => {{
  const s = ({_CHART_STATE})({_CHARTS!r});
  return s.fivexx && s.fivexx.values.some((v) => v > 0) && s.runs.some((r) => r.state === "open");
}}"""

_REFUSALS_SHOWN = f"""() => (({_CHART_STATE})({_CHARTS!r}).refused?.values || []).some(
  (v) => v > 0)"""


def _assert_outage_drawn(tab: Any, width: int) -> None:
    state = tab.evaluate(_CHART_STATE, _CHARTS)
    values, t = state["fivexx"]["values"], state["t"]
    assert len(values) == len(t) > 0
    first_5xx = next(i for i, v in enumerate(values) if v and v > 0)
    assert state["fivexx"]["rise"] > 5  # drawn as a rise, not a flat line
    assert state["twoxx"]["rise"] > 5  # the answers before the outage
    assert any(v and v > 0 for v in state["refused"]["values"])  # breaker_open refusals
    runs = state["runs"]
    first_open = next(i for i, r in enumerate(runs) if r["state"] == "open")
    assert first_open > 0 and runs[0]["state"] == "closed"  # closed, then it turned open
    assert runs[first_open]["to"] >= t[first_5xx]  # the 5xx came first (or in the same bucket)
    assert runs[first_open]["width"] >= 1
    for name in ("requests", "refusals", "answers:orders", "latency:orders", "breaker:orders"):
        box = tab.locator(f'[data-chart="{name}"]').bounding_box()
        assert box is not None and box["width"] > 200, name
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, name  # inside the page
    assert tab.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scroll


def test_charts_show_the_outage_over_time_at_both_widths(
    browser: Any,
    upstream_factory: Factory,
    gateway_factory: Factory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Upstream answers 503 under load: the 5xx line rises, then the breaker band turns open;
    a page opened after the outage, 390 px wide, shows it too (the history is the gateway's)."""
    monkeypatch.setenv("STORMGUARD_HISTORY_BUCKET", "0.25")  # short buckets: a short test
    monkeypatch.setenv("STORMGUARD_HISTORY_SECONDS", "30")
    up = upstream_factory("orders")
    gw = gateway_factory(
        {
            "access_log": False,
            "upstreams": {
                "orders": {
                    "url": up.url,
                    "breaker": {"failure_rate": 0.5, "min_calls": 5, "window": 2, "open_for": 1},
                }
            },
            "routes": [{"path": "/", "upstream": "orders"}],
        }
    )
    wide = _tab(browser, 1280)
    wide.goto(f"http://127.0.0.1:{gw.admin_port}/dashboard")
    with Load(gw.http_port, [CALM], path="/echo") as load:
        wide.wait_for_function(
            f"() => (({_CHART_STATE})({_CHARTS!r}).twoxx?.values || []).some((v) => v > 0)",
            timeout=30_000,
        )
        load.path = "/status/503"
        wide.wait_for_function(_OUTAGE_SHOWN, timeout=30_000)
        load.path = "/echo"
        wide.wait_for_selector(_breaker("closed"), timeout=30_000)
    # the state pill follows /status, the charts their own poll of the history: the
    # open second's refusals may be drawn a poll after the pill says closed
    wide.wait_for_function(_REFUSALS_SHOWN, timeout=30_000)
    _assert_outage_drawn(wide, 1280)
    wide.screenshot(path=str(tmp_path / "charts-1280.png"), full_page=True)
    narrow = _tab(browser, 390)  # opened after the outage
    narrow.goto(f"http://127.0.0.1:{gw.admin_port}/dashboard")
    narrow.wait_for_function(_OUTAGE_SHOWN, timeout=30_000)
    _assert_outage_drawn(narrow, 390)
    narrow.screenshot(path=str(tmp_path / "charts-390.png"), full_page=True)
    wide.set_viewport_size({"width": 390, "height": 900})  # the same page, narrowed
    wide.wait_for_function("() => document.documentElement.scrollWidth <= 390", timeout=10_000)
    _assert_outage_drawn(wide, 390)
    assert wide.errors == [] and narrow.errors == []
