"""`stormguard gateway check` catches what would make the gateway fail at start
(issue 29, item 5): each mistake is one plain line naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stormguard.cli import _build

UPSTREAM = "upstreams:\n  a:\n    url: http://127.0.0.1:9000\n"
ROUTE = "routes:\n  - path: /\n    upstream: a\n"


def _check(tmp_path: Path, text: str) -> tuple[int, list[str]]:
    path = tmp_path / "gw.yaml"
    path.write_text(text)
    result = CliRunner().invoke(_build(), ["gateway", "check", str(path)])
    prefix = f"{path}:"
    lines = [line.removeprefix(prefix) for line in result.output.splitlines()]
    return result.exit_code, lines


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        (
            "listen:\n  http: 127.0.0.1:9901\n",  # admin's default address
            "2:3: listen.admin: 127.0.0.1:9901 is listen.http's address too; "
            "give each listener its own port",
        ),
        (
            "listen:\n  http: 0.0.0.0:8080\n  grpc: 127.0.0.1:8080\n",
            "3:3: listen.grpc: 127.0.0.1:8080 overlaps listen.http (0.0.0.0:8080); "
            "give each listener its own port",
        ),
        (
            "listen:\n  http: {address: '127.0.0.1:7000'}\n  admin: 127.0.0.1:7000\n",
            "3:3: listen.admin: 127.0.0.1:7000 is listen.http's address too; "
            "give each listener its own port",
        ),
    ],
)
def test_two_listeners_on_one_address(tmp_path: Path, listen: str, expected: str) -> None:
    """Two listeners on one address (or a wildcard and an address on one port)."""
    code, lines = _check(tmp_path, listen + UPSTREAM + ROUTE)
    assert code == 1
    assert lines == [expected, " 1 error(s)"]


def test_distinct_listeners_pass(tmp_path: Path) -> None:
    """The same port on two different addresses is fine."""
    text = "listen:\n  http: 127.0.0.1:8080\n  grpc: 127.0.0.2:8080\n  admin: 127.0.0.1:9901\n"
    code, lines = _check(tmp_path, text + UPSTREAM + ROUTE)
    assert code == 0, lines


@pytest.mark.parametrize(
    ("upstream", "expected"),
    [
        (
            "upstreams:\n  a:\n    url: 127.0.0.1:9000\n",
            "3:5: upstreams.a.url: '127.0.0.1:9000' has no scheme; "
            "write it as http://127.0.0.1:9000 (or https://, grpc://)",
        ),
        (
            "upstreams:\n  a:\n    targets: [http://127.0.0.1:9000, 127.0.0.1:9001]\n",
            "3:38: upstreams.a.targets.1: '127.0.0.1:9001' has no scheme; "
            "write it as http://127.0.0.1:9001 (or https://, grpc://)",
        ),
        (
            "upstreams:\n  a:\n    url: ftp://127.0.0.1:9000\n",
            "3:5: upstreams.a.url: unsupported scheme 'ftp://' in 'ftp://127.0.0.1:9000' "
            "(http, https, grpc)",
        ),
        (
            "upstreams:\n  a:\n    targets: [http://127.0.0.1:9000, https://127.0.0.1:9001]\n",
            "2:3: upstreams.a: targets must share one scheme, got http, https",
        ),
    ],
)
def test_an_upstream_url_without_a_scheme(tmp_path: Path, upstream: str, expected: str) -> None:
    """A URL without a scheme is named in a plain message (not "{''}")."""
    code, lines = _check(tmp_path, upstream + ROUTE)
    assert code == 1
    assert lines == [expected, " 1 error(s)"]
    assert "{''}" not in "\n".join(lines)


@pytest.mark.parametrize(
    ("on_limit", "expected"),
    [
        ("{delay: -1}", "delay must be more than 0 and at most 60 seconds, got -1"),
        ("{delay: 0}", "delay must be more than 0 and at most 60 seconds, got 0"),
        ("{delay: 61}", "delay must be more than 0 and at most 60 seconds, got 61"),
        ("{delay: soon}", "delay must be a number of seconds, got 'soon'"),
        (
            "{dealy: 1}",
            "unknown key 'dealy'; on_limit is 'reject' or {delay: SECONDS} (0 < SECONDS <= 60)",
        ),
        ("refuse", "must be 'reject' or {delay: SECONDS} (0 < SECONDS <= 60), got 'refuse'"),
    ],
)
def test_a_bad_delay_is_one_message(tmp_path: Path, on_limit: str, expected: str) -> None:
    """A negative (or zero, or too long) delay: one line, not one per union branch."""
    route = f"routes:\n  - path: /\n    upstream: a\n    on_limit: {on_limit}\n"
    code, lines = _check(tmp_path, UPSTREAM + route)
    assert code == 1
    assert lines == [f"7:5: routes.0.on_limit: {expected}", " 1 error(s)"]


def test_a_good_delay_passes(tmp_path: Path) -> None:
    """A delay within (0, 60] is accepted."""
    route = "routes:\n  - path: /\n    upstream: a\n    on_limit: {delay: 0.5}\n"
    code, lines = _check(tmp_path, UPSTREAM + route)
    assert code == 0, lines


def test_tls_files_are_checked(tmp_path: Path) -> None:
    """The listener's certificate files are loaded by `check`: a missing one is named."""
    listen = (
        "listen:\n  http:\n    address: 127.0.0.1:8443\n"
        "    tls: {cert: gone.pem, key: gone-key.pem}\n"
    )
    code, lines = _check(tmp_path, listen + UPSTREAM + ROUTE)
    assert code == 1
    assert lines == [
        f"4:11: listen.http.tls.cert: no such file: '{tmp_path / 'gone.pem'}'",
        " 1 error(s)",
    ]
