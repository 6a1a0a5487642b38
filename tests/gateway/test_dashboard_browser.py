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
def page() -> Iterator[Any]:
    """A Chromium page (system browser); console errors collected in ``page.errors``."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed")
    executable = find_chromium()
    if executable is None:
        _unavailable("no chromium executable found")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=list(BROWSER_ARGS))
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.errors = errors
        try:
            yield tab
        finally:
            browser.close()


class Load:
    """Background request loops against the gateway (one keep-alive connection each)."""

    def __init__(self, port: int, keys: list[str]) -> None:
        self.port = port
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in keys]

    def _loop(self, key: str) -> None:
        while not self.stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            try:
                while not self.stop.is_set():
                    conn.request("GET", "/api/echo", headers={"X-API-Key": key})
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
