"""Credentials in an upstream URL: ``Authorization: Basic`` on every upstream request,
``Host`` without them, and the password nowhere the gateway shows anything."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rawupstream import RawUpstream, Request, Step, exchange

from net_support import refused_port
from stormguard.gateway._urls import shown_url, split_userinfo

PASSWORD = "s3cr%40t-pw"  # as written in the URL; "s3cr@t-pw" once decoded
SECRETS = (b"s3cr", b"alice:", base64.b64encode(b"alice:s3cr@t-pw"))
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def _ok(request: Request) -> tuple[Step, ...]:
    return (OK,)


@pytest.fixture(scope="module")
def upstream(gateway_driver: str) -> Iterator[RawUpstream]:
    """One upstream per chain driver (its record of requests is per gateway)."""
    with RawUpstream(_ok) as up:
        yield up


def _config(upstream: RawUpstream) -> dict[str, Any]:
    dead = refused_port()  # nothing listens there: the connect error path
    return {
        "upstreams": {
            "u": {"url": f"http://alice:{PASSWORD}@127.0.0.1:{upstream.port}"},
            "dead": {"url": f"http://alice:{PASSWORD}@127.0.0.1:{dead}"},
        },
        "routes": [
            {"path": "/cb", "upstream": "u"},
            {"path": "/asgi", "upstream": "u", "idempotency": "honor"},
            {"path": "/dead", "upstream": "dead"},
            {"path": "/ws", "upstream": "u", "websocket": {}},
        ],
    }


@pytest.fixture(scope="module")
def gateway(upstream: RawUpstream, start_gateway: Callable[[dict[str, Any]], Any]) -> Any:
    return start_gateway(_config(upstream))


def _get(gateway: Any, target: str, extra: str = "") -> Any:
    data = f"GET {target} HTTP/1.1\r\nHost: example.test\r\n{extra}\r\n".encode()
    return exchange(gateway.http_port, data)


@pytest.mark.parametrize("route", ["cb", "asgi"])
@pytest.mark.parametrize("sent", ["", "Authorization: Bearer the-clients\r\n"])
def test_credentials_become_basic_authorization(
    route: str, sent: str, gateway: Any, upstream: RawUpstream
) -> None:
    """Every upstream request carries the URL's credentials as Basic, in place of the
    client's Authorization, and Host is host:port alone."""
    expected = "Basic " + base64.b64encode(b"alice:s3cr@t-pw").decode()
    for i in range(3):  # (the first may take the ASGI path: no idle connection yet)
        target = f"/{route}/x?sent={len(sent)}&i={i}"
        answer = _get(gateway, target, sent)
        assert (answer.status, answer.body) == (200, b"ok")
        (request,) = upstream.seen(target)
        assert request.header("Authorization") == [expected]
        assert request.header("Host") == [f"127.0.0.1:{upstream.port}"]
        assert b"the-clients" not in request.raw and b"alice:" not in request.raw


def test_websocket_upgrade_carries_the_credentials(gateway: Any, upstream: RawUpstream) -> None:
    """The WebSocket leg's upgrade request carries the same Basic Authorization, in
    place of the client's, and a Host without the userinfo."""
    upgrade = (
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer the-clients\r\n"
    )
    answer = _get(gateway, "/ws/chat", upgrade)
    assert answer.status == 502  # the raw upstream answers 200, not 101
    (request,) = upstream.seen("/ws/chat")
    assert request.header("Authorization") == [
        "Basic " + base64.b64encode(b"alice:s3cr@t-pw").decode()
    ]
    assert request.header("Host") == [f"127.0.0.1:{upstream.port}"]
    assert b"the-clients" not in request.raw


def test_the_password_is_shown_nowhere(gateway: Any, upstream: RawUpstream) -> None:
    """/status, /metrics, the dashboard, the log and an upstream error never show the
    password; /status shows the URL with ``***`` for the userinfo."""
    assert _get(gateway, "/cb/x").status == 200
    dead = _get(gateway, "/dead/x")
    assert dead.status == 502
    status = gateway.admin("/status")
    assert f"http://***@127.0.0.1:{upstream.port}".encode() in status
    shown = [
        status,
        gateway.admin("/metrics"),
        gateway.admin("/dashboard"),
        dead.raw,
        gateway.output().encode(),
    ]
    for text in shown:
        for secret in SECRETS:
            assert secret not in text


def test_gateway_check_shows_no_password(tmp_path: Path, upstream: RawUpstream) -> None:
    """``stormguard gateway check`` says nothing of the password, valid file or not."""
    config = _config(upstream)
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump(config))
    config["upstreams"]["u"]["timeout"] = {"read": -1}
    bad.write_text(yaml.safe_dump(config))
    for path, code in ((good, 0), (bad, 1)):
        cmd = [sys.executable, "-c", "from stormguard.cli import main; main()"]
        done = subprocess.run(
            [*cmd, "gateway", "check", str(path)], capture_output=True, timeout=60
        )
        assert done.returncode == code, done.stderr
        for secret in SECRETS:
            assert secret not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("url", "plain", "shown", "authorization"),
    [
        ("http://h:1/p", "http://h:1/p", "http://h:1/p", None),
        ("http://u:p%40w@h:1/p", "http://h:1/p", "http://***@h:1/p", b"Basic dTpwQHc="),
        ("https://u@h", "https://h", "https://***@h", b"Basic dTo="),
        ("http://u:p@[::1]:8/", "http://[::1]:8/", "http://***@[::1]:8/", b"Basic dTpw"),
    ],
)
def test_userinfo_is_split_and_hidden(
    url: str, plain: str, shown: str, authorization: bytes | None
) -> None:
    """split_userinfo gives the URL without userinfo and its Basic value; shown_url
    replaces the userinfo by ***."""
    assert split_userinfo(url) == (plain, authorization)
    assert shown_url(url) == shown
