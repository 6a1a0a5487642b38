"""The admin listener: /status and /metrics per domain and descriptor (allowed,
refused, shadow-refused, top limited values hashed), /healthz, /readyz, and the
dashboard's data-* attributes."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from rls_process import Service, ServiceFactory
from rls_support import request
from stormguard.gateway._clients import client_id

CONFIG = """\
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: idle
    rate_limit: {unit: day, requests_per_unit: 5}
"""


@pytest.fixture(scope="module")
def shop(module_services: ServiceFactory) -> Service:
    """A service that has seen: user alice 5 calls, bob 1, trial t1 3, one unknown."""
    service = module_services(CONFIG)
    for value, n in (("alice", 5), ("bob", 1)):
        for _ in range(n):
            service.call(request("shop", [("user", value)]))
    for _ in range(3):
        service.call(request("shop", [("trial", "t1")]))
    service.call(request("shop", [("nothing", "x")]))
    service.call(request("elsewhere", [("user", "alice")]))
    return service


def test_status_counts_per_domain_and_descriptor(shop: Service) -> None:
    """/status: allowed, refused and shadow_refused per descriptor; answers per code."""
    domain = shop.status()["domains"]["shop"]
    user = domain["descriptors"]["shop.user"]
    assert (user["allowed"], user["refused"], user["shadow_refused"]) == (3, 3, 0)
    trial = domain["descriptors"]["shop.trial"]
    assert (trial["allowed"], trial["refused"], trial["shadow_refused"]) == (1, 0, 2)
    assert domain["descriptors"]["shop.idle"]["allowed"] == 0  # configured, never asked
    assert domain["requests"] == {"ok": 7, "over_limit": 3}
    assert domain["unmatched"] == 1


def test_top_limited_values_are_hashed_as_the_gateway_hashes_clients(shop: Service) -> None:
    """The refused values show as the gateway's client_id of the counter key, never raw."""
    status = shop.status()
    top = status["domains"]["shop"]["descriptors"]["shop.user"]["top_limited"]
    assert top == [{"value": client_id("shop|user=alice"), "refused": 3, "shadow_refused": 0}]
    shadow_top = status["domains"]["shop"]["descriptors"]["shop.trial"]["top_limited"]
    assert shadow_top == [{"value": client_id("shop|trial=t1"), "refused": 0, "shadow_refused": 2}]
    assert "alice" not in json.dumps(status)


def test_unknown_domains_share_one_label(shop: Service) -> None:
    """A domain nobody configured is counted as "(unknown)", never by its own name."""
    status = shop.status()
    assert "elsewhere" not in status["domains"]
    assert status["domains"]["(unknown)"]["requests"]["ok"] == 1


def test_metrics_exposition(shop: Service) -> None:
    """/metrics has the per-descriptor counters with outcome labels."""
    code, body = shop.admin("/metrics")
    text = body.decode()
    assert code == 200
    assert (
        'stormguard_rls_descriptors_total{descriptor="shop.trial",domain="shop",'
        'outcome="shadow_refused"} 2.0' in text
    )
    assert 'stormguard_rls_requests_total{code="over_limit",domain="shop"} 3.0' in text
    assert "stormguard_rls_store_unavailable 0.0" in text


@pytest.mark.parametrize(("path", "code"), [("/healthz", 200), ("/readyz", 200), ("/nope", 404)])
def test_health_paths(shop: Service, path: str, code: int) -> None:
    """/healthz and /readyz answer 200 while serving; unknown paths 404."""
    assert shop.admin(path)[0] == code


class _Rows(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if any(name.startswith("data-") for name in found):
            self.rows.append({"tag": tag, **found})


def test_dashboard_marks_each_descriptor_with_data_attributes(shop: Service) -> None:
    """The dashboard has one element per descriptor with its counts in data-*."""
    code, body = shop.admin("/dashboard")
    assert code == 200
    parser = _Rows()
    parser.feed(body.decode())
    rows = {r["data-descriptor"]: r for r in parser.rows if "data-descriptor" in r}
    user = rows["shop.user"]
    assert (user["data-domain"], user["data-allowed"], user["data-refused"]) == ("shop", "3", "3")
    assert rows["shop.trial"]["data-shadow-refused"] == "2"
    assert rows["shop.idle"]["data-allowed"] == "0"
    values = [r["data-value"] for r in parser.rows if "data-value" in r]
    assert client_id("shop|user=alice") in values
    assert any(r.get("data-store") == "ok" for r in parser.rows)
