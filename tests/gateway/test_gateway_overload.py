"""The gateway's priority and overload stage (docs/overload.md): per-upstream
overload control (a fixed or adaptive limit, admission control), the line's
shedding order on the wire (class first, then first attempts before retries),
refusals 503 + Retry-After (gRPC: see test_grpc_guard), /status and /metrics."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from stormguard import AdaptiveLimit
from stormguard.gateway._config import GatewayConfigError, parse_config
from stormguard.gateway._upstream import overload_of

Factory = Callable[..., Any]

_BASE = """
upstreams:
  app:
    url: http://127.0.0.1:9
    {extra}
routes:
  - path: /
    upstream: app
"""


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ("adaptive: {max_limit: 0}", "upstreams.app.adaptive", "max_limit"),
        ("adaptive: {bogus: 1}", "upstreams.app.adaptive", "unknown key 'bogus'"),
        ("adaptive: 7", "upstreams.app.adaptive", "true or a mapping"),
        ("admission: {min_rps: -1}", "upstreams.app.admission", "min_rps"),
        ("overload: {max_wait: 0.1}", "upstreams.app", "needs a 'limit'"),
        ("overload: {limit: 5}\n    adaptive: true", "upstreams.app", "not both"),
        ("overload: {limit: 0}", "upstreams.app.overload.limit", ""),
        ("overload: {limit: 2, standing_wait: -1}", "upstreams.app.overload.standing_wait", ""),
    ],
)
def test_bad_overload_settings_name_the_field(extra: str, field: str, words: str) -> None:
    """Each mistake fails at load, naming the field (and the inner key)."""
    with pytest.raises(GatewayConfigError) as raised:
        parse_config(_BASE.format(extra=extra), fmt="yaml")
    text = str(raised.value)
    assert f"{field}:" in text and words in text


def test_priority_settings_are_checked() -> None:
    """A route's class must be one of the three; the priority header needs a name."""
    bad_route = _BASE.format(extra="overload: {limit: 2}") + "    priority: urgent\n"
    with pytest.raises(GatewayConfigError, match=r"routes\.0\.priority"):
        parse_config(bad_route, fmt="yaml")
    bad_header = _BASE.format(extra="") + "priority: {header: 'x y', trust: always}\n"
    with pytest.raises(GatewayConfigError, match=r"priority\.header"):
        parse_config(bad_header, fmt="yaml")
    bad_trust = _BASE.format(extra="") + "priority: {header: x-priority, trust: anyone}\n"
    with pytest.raises(GatewayConfigError, match=r"priority\.trust"):
        parse_config(bad_trust, fmt="yaml")


def test_the_control_follows_the_settings() -> None:
    """An adaptive limit's bounds are divided by the processes sharing them; a fixed
    limit and the line's settings are passed through; no settings, no control."""
    config = parse_config(
        _BASE.format(extra="adaptive: {min_limit: 4, max_limit: 100, initial_limit: 20}"),
        fmt="yaml",
    )
    control = overload_of(config.upstreams["app"], "app", instances=2)
    assert control is not None
    adaptive = control.status()["adaptive"]
    assert (adaptive["min_limit"], adaptive["max_limit"], adaptive["instances"]) == (2, 50, 2)
    fixed = parse_config(
        _BASE.format(extra="overload: {limit: 3, max_wait: 0.5, standing_wait: null}"),
        fmt="yaml",
    )
    control = overload_of(fixed.upstreams["app"], "app", instances=4)
    assert control is not None
    assert (control.limit, control.max_wait, control.standing_wait) == (3, 0.5, None)
    plain = parse_config(_BASE.format(extra=""), fmt="yaml")
    assert overload_of(plain.upstreams["app"], "app", instances=1) is None
    admission_only = parse_config(_BASE.format(extra="admission: true"), fmt="yaml")
    control = overload_of(admission_only.upstreams["app"], "app", instances=1)
    assert control is not None and control.admission is not None and control.limit > 10**6
    assert isinstance(AdaptiveLimit(instances=2).status()["max_limit"], int)


def _until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.02)


def test_the_line_sheds_in_priority_order_on_the_wire(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """One slot, a line of one: a retry waiting is pushed out by a first attempt, that
    one by a critical request (the trusted priority header); each refusal is 503 +
    Retry-After with its reason; the critical request is served when the slot frees."""
    upstream = upstream_factory("app")
    gw = gateway_factory(
        {
            "upstreams": {
                "app": {
                    "url": upstream.url,
                    "overload": {
                        "limit": 1,
                        "max_queue": 1,
                        "max_wait": 30,
                        "standing_wait": None,
                        "retry_after": 2,
                    },
                }
            },
            "routes": [{"path": "/", "upstream": "app"}],
            "priority": {"header": "x-priority", "trust": "always"},
        }
    )
    answers: dict[str, httpx.Response] = {}

    def call(name: str, path: str, headers: dict[str, str]) -> threading.Thread:
        def run() -> None:
            answers[name] = httpx.get(f"{gw.url}{path}", headers=headers, timeout=60)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    def waiting() -> int:
        return int(gw.status()["upstreams"]["app"]["overload"]["waiting"])

    threads = [call("holder", "/slow?s=3", {})]
    _until(lambda: upstream.seen()["in_flight"] == 1, "the holder upstream")
    threads.append(call("retry", "/echo", {"Retry-Attempt": "2"}))
    _until(lambda: waiting() == 1, "the retry waiting")
    threads.append(call("first", "/echo", {}))
    threads[1].join(20)
    _until(lambda: waiting() == 1, "the first attempt waiting")
    threads.append(call("critical", "/echo", {"X-Priority": "critical"}))
    threads[2].join(20)
    for thread in threads:
        thread.join(30)
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {"holder": 200, "retry": 503, "first": 503, "critical": 200}
    for name in ("retry", "first"):
        assert answers[name].headers["retry-after"] == "2"
        assert answers[name].json()["status"] == 503
    assert upstream.seen()["n"] == 2  # the holder and the critical request only
    status = gw.status()
    assert status["routes"]["/"].get("shed:default") == 2
    assert status["upstreams"]["app"]["overload"]["limit"] == 1
    code, metrics = gw.admin("/metrics")
    assert code == 200 and b'stormguard_gateway_overload_limit{upstream="app"} 1.0' in metrics
    gw.logged('"policy":"shed:default"')


def test_without_a_believed_header_the_route_class_decides(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """trust: proxies and a client outside trusted_proxies: its X-Priority: critical is
    not believed, so its route's class (sheddable) ranks it below the default request
    waiting, and the full line refuses it (believed, it would have pushed that one out)."""
    upstream = upstream_factory("app")
    gw = gateway_factory(
        {
            "upstreams": {
                "app": {
                    "url": upstream.url,
                    "overload": {"limit": 1, "max_queue": 1, "max_wait": 30, "standing_wait": None},
                },
            },
            "routes": [
                {"path": "/bulk", "upstream": "app", "priority": "sheddable"},
                {"path": "/", "upstream": "app"},
            ],
            "priority": {"header": "x-priority"},
        }
    )
    answers: dict[str, httpx.Response] = {}

    def call(name: str, path: str) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: answers.__setitem__(name, httpx.get(f"{gw.url}{path}", timeout=60))
        )
        thread.start()
        return thread

    threads = [call("holder", "/slow?s=3")]
    _until(lambda: upstream.seen()["in_flight"] == 1, "the holder upstream")
    threads.append(call("waiter", "/echo"))
    _until(
        lambda: gw.status()["upstreams"]["app"]["overload"]["waiting"] == 1, "the waiter waiting"
    )
    refused = httpx.get(f"{gw.url}/bulk/echo", headers={"X-Priority": "critical"}, timeout=30)
    for thread in threads:
        thread.join(30)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert answers["holder"].status_code == answers["waiter"].status_code == 200
    assert gw.status()["routes"]["/bulk"].get("shed:sheddable") == 1


@pytest.mark.parametrize(
    ("extra", "top", "warned"),
    [
        ("overload: {limit: 2}", "priority: {header: x-priority, trust: always}", "trust: always"),
        ("", "priority: {header: x-priority}", "no upstream has overload control"),
        ("overload: {limit: 2}", "priority: {header: x-priority}", None),
    ],
)
def test_check_warns_about_a_priority_anyone_can_claim(
    extra: str, top: str, warned: str | None
) -> None:
    """`gateway check`'s warnings: a header believed from anyone, a class never used."""
    from stormguard.gateway._config import config_warnings

    config = parse_config(_BASE.format(extra=extra) + top + "\n", fmt="yaml")
    found = [line for line in config_warnings(config) if line.startswith("priority")]
    if warned is None:
        assert found == []
    else:
        assert len(found) == 1 and warned in found[0]


@pytest.mark.parametrize("hold", [True, False])
def test_a_client_that_hangs_up_keeps_its_slot_until_the_upstream_answers(
    upstream_factory: Factory, gateway_factory: Factory, hold: bool
) -> None:
    """One slot. A client hangs up while its request is at the upstream (which goes on
    working on it). With ``hold_abandoned`` (the default) the slot stays taken until
    the upstream answers: others are refused 503 meanwhile, served once it has; the
    request is logged 499. Without it the slot is given back at the hang-up."""
    upstream = upstream_factory("app")
    overload = {"limit": 1, "max_wait": 0, "standing_wait": None, "hold_abandoned": hold}
    gw = gateway_factory(
        {
            "upstreams": {"app": {"url": upstream.url, "overload": overload}},
            "routes": [{"path": "/", "upstream": "app"}],
        }
    )
    with socket.create_connection(("127.0.0.1", gw.http_port), timeout=10) as raw:
        raw.sendall(b"GET /hold?key=h HTTP/1.1\r\nHost: gw\r\n\r\n")
        _until(lambda: upstream.seen()["in_flight"] == 1, "held at the upstream")
    # (the client has hung up; the upstream still holds its request)

    def echo() -> int:
        return httpx.get(f"{gw.url}/echo", timeout=10).status_code

    if hold:
        codes = [echo() for _ in range(20)]
        assert codes == [503] * 20
        assert upstream.seen()["in_flight"] == 1
        upstream.release("h")
        _until(lambda: echo() == 200, "served once the upstream answered")
        gw.logged('"status":499,"policy":"client_gone"')
    else:
        # served without the upstream's answer: the attempt was cut at the hang-up
        _until(lambda: echo() == 200, "served after the hang-up")


@pytest.mark.parametrize(
    "upstream_settings",
    [
        {"bulkhead": {"limit": 1}},
        {"overload": {"limit": 1, "max_wait": 0, "standing_wait": None}},
    ],
    ids=["bulkhead", "overload"],
)
def test_a_client_trickling_its_body_holds_no_upstream_slot(
    upstream_factory: Factory, gateway_factory: Factory, upstream_settings: dict[str, Any]
) -> None:
    """One slot at the upstream (a bulkhead of one, or an overload limit of one). A
    client that sends its head and part of a small body does not take it: the body is
    read whole before the upstream guard and the overload stage (as nginx reads it
    before it connects upstream), so another client is served meanwhile, and the slow
    one is answered with its whole body once it has sent it."""
    upstream = upstream_factory("app")
    gw = gateway_factory(
        {
            "upstreams": {"app": {"url": upstream.url, **upstream_settings}},
            "routes": [{"path": "/", "upstream": "app"}],
        }
    )
    with socket.create_connection(("127.0.0.1", gw.http_port), timeout=10) as slow:
        slow.sendall(b"POST /echo HTTP/1.1\r\nHost: gw\r\nContent-Length: 10\r\n\r\nabc")
        for _ in range(5):  # (the gateway has the head and three bytes by now, or soon)
            assert httpx.get(f"{gw.url}/echo", timeout=10).status_code == 200
        assert upstream.seen()["n"] == 5  # the slow request has not gone upstream yet
        slow.sendall(b"defghij")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            chunk = slow.recv(65536)
            assert chunk, f"closed before the answer: {answer!r}"
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b'"size": 10' in answer
