"""TLS through a real gateway, with certificates the tests make (trustme).

The listener serves https and wss (`listen.http.tls`), asks for client certificates
when `client_ca` is given, and reaches https upstreams with `upstreams.NAME.tls`
(`ca`, `server_name`, `verify`). Mistakes in the TLS settings are configuration
errors naming the field.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from click.testing import CliRunner

from stormguard.cli import _build
from stormguard.gateway._config import GatewayConfigError, load_config
from stormguard.gateway._tls import client_context, server_context

trustme = pytest.importorskip("trustme")

Factory = Callable[..., Any]


@dataclass
class Files:
    """A CA and a certificate it signed, written as PEM files."""

    ca: trustme.CA
    ca_pem: str
    cert: str
    key: str


def _issue(directory: Path, name: str, *identities: str, ca: trustme.CA | None = None) -> Files:
    ca = ca or trustme.CA()
    issued = ca.issue_cert(*identities)
    ca_pem, cert, key = (directory / f"{name}-{part}.pem" for part in ("ca", "cert", "key"))
    ca.cert_pem.write_to_path(str(ca_pem))
    for i, blob in enumerate(issued.cert_chain_pems):
        blob.write_to_path(str(cert), append=i > 0)
    issued.private_key_pem.write_to_path(str(key))
    return Files(ca, str(ca_pem), str(cert), str(key))


@pytest.fixture
def server(tmp_path: Path) -> Files:
    """The gateway's certificate (for 127.0.0.1 and localhost)."""
    return _issue(tmp_path, "server", "127.0.0.1", "localhost")


def _trusting(files: Files, client: Files | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    files.ca.configure_trust(ctx)
    if client is not None:
        ctx.load_cert_chain(client.cert, client.key)
    return ctx


def _proxy(up: Any, **upstream: Any) -> dict[str, Any]:
    return {
        "upstreams": {"a": {"url": up.url, **upstream}},
        "routes": [
            {"path": "/ws", "upstream": "a", "websocket": {}},
            {"path": "/", "upstream": "a"},
        ],
    }


def test_https_client_to_an_http_upstream(
    upstream_factory: Factory, gateway_factory: Factory, server: Files
) -> None:
    """The listener ends TLS: the upstream sees X-Forwarded-Proto https; /status says https."""
    up = upstream_factory()
    gw = gateway_factory(_proxy(up), tls={"cert": server.cert, "key": server.key})
    with httpx.Client(verify=_trusting(server)) as client:
        got = client.get(f"{gw.url}/echo")  # the callback path
        posted = client.post(f"{gw.url}/echo", content=b"x" * 10)  # the ASGI path
    assert got.status_code == posted.status_code == 200
    for answer in (got, posted):
        seen = {k.lower(): v for k, v in answer.json()["headers"].items()}
        assert seen["x-forwarded-proto"] == "https"
    listener = gw.status()["listener"]
    assert listener == {
        "url": f"https://127.0.0.1:{gw.http_port}",
        "tls": True,
        "client_certificates": "none",
    }
    with pytest.raises(httpx.TransportError):  # plain HTTP is not spoken there
        httpx.get(f"http://127.0.0.1:{gw.http_port}/echo", timeout=5)
    older = _trusting(server)  # a TLS 1.2 client is served too, with an AEAD suite
    older.maximum_version = ssl.TLSVersion.TLSv1_2
    with (
        socket.create_connection(("127.0.0.1", gw.http_port), timeout=5) as raw,
        older.wrap_socket(raw, server_hostname="127.0.0.1") as secure,
    ):
        cipher, version, _ = secure.cipher()
        assert version == "TLSv1.2"
        assert "GCM" in cipher or "CHACHA20" in cipher


def test_client_certificates_are_required_with_client_ca(
    upstream_factory: Factory, gateway_factory: Factory, server: Files, tmp_path: Path
) -> None:
    """client_ca: no client certificate, or one another CA signed, is refused at the
    handshake; one the client CA signed gets through."""
    clients = _issue(tmp_path, "client", "client@example.org")
    stranger = _issue(tmp_path, "stranger", "client@example.org")
    up = upstream_factory()
    tls = {"cert": server.cert, "key": server.key, "client_ca": clients.ca_pem}
    gw = gateway_factory(_proxy(up), tls=tls)
    for who in (None, stranger):
        with (
            httpx.Client(verify=_trusting(server, who), timeout=5) as client,
            pytest.raises(httpx.TransportError),
        ):
            client.get(f"{gw.url}/echo")
    with httpx.Client(verify=_trusting(server, clients), timeout=5) as client:
        assert client.get(f"{gw.url}/echo").status_code == 200
    assert gw.status()["listener"]["client_certificates"] == "required"


@pytest.fixture
def secure_upstream(upstream_factory: Factory, tmp_path: Path) -> tuple[Any, Files]:
    """An https upstream whose certificate names only `upstream.internal`."""
    files = _issue(tmp_path, "upstream", "upstream.internal")
    return upstream_factory(tls=(files.cert, files.key)), files


def test_an_https_upstream_with_its_ca_and_server_name(
    secure_upstream: tuple[Any, Files], gateway_factory: Factory
) -> None:
    """`ca` + `server_name`: the upstream's certificate is checked for that name."""
    up, files = secure_upstream
    gw = gateway_factory(_proxy(up, tls={"ca": files.ca_pem, "server_name": "upstream.internal"}))
    assert httpx.get(f"{gw.url}/echo", timeout=10).status_code == 200
    assert httpx.post(f"{gw.url}/echo", content=b"abc", timeout=10).json()["size"] == 3


def test_a_wrong_ca_is_a_502_with_the_reason_in_the_log(
    secure_upstream: tuple[Any, Files], gateway_factory: Factory, tmp_path: Path
) -> None:
    """An upstream certificate the given CA did not sign: 502, and the log says why
    (certificate verify failed), without a traceback."""
    up, _ = secure_upstream
    other = _issue(tmp_path, "other", "upstream.internal")
    gw = gateway_factory(_proxy(up, tls={"ca": other.ca_pem, "server_name": "upstream.internal"}))
    assert httpx.get(f"{gw.url}/echo", timeout=10).status_code == 502
    assert httpx.post(f"{gw.url}/echo", content=b"abc", timeout=10).status_code == 502
    log = gw.output()
    assert "TLS to upstream 127.0.0.1" in log
    assert "CERTIFICATE_VERIFY_FAILED" in log
    assert "Traceback" not in log


def test_a_wrong_server_name_is_refused_too(
    secure_upstream: tuple[Any, Files], gateway_factory: Factory
) -> None:
    """Without server_name the target's host (127.0.0.1) is checked, and the
    certificate does not name it: 502."""
    up, files = secure_upstream
    gw = gateway_factory(_proxy(up, tls={"ca": files.ca_pem}))
    assert httpx.get(f"{gw.url}/echo", timeout=10).status_code == 502
    assert "CERTIFICATE_VERIFY_FAILED" in gw.output()


def test_verify_false_accepts_any_certificate_and_check_warns(
    secure_upstream: tuple[Any, Files], gateway_factory: Factory
) -> None:
    """`verify: false` reaches the upstream whatever its certificate; `gateway check`
    accepts the file with a warning."""
    up, _ = secure_upstream
    gw = gateway_factory(_proxy(up, tls={"verify": False}))
    assert httpx.get(f"{gw.url}/echo", timeout=10).status_code == 200
    result = CliRunner().invoke(_build(), ["gateway", "check", str(gw.path)])
    assert result.exit_code == 0, result.output
    assert "warning: upstreams.a.tls.verify: false" in result.output


def test_wss_through_the_gateway_to_a_wss_upstream(
    secure_upstream: tuple[Any, Files], gateway_factory: Factory, server: Files
) -> None:
    """A wss:// client, the gateway ending TLS, a wss:// upstream behind it."""
    up, files = secure_upstream
    gw = gateway_factory(
        _proxy(up, tls={"ca": files.ca_pem, "server_name": "upstream.internal"}),
        tls={"cert": server.cert, "key": server.key},
    )
    assert gw.ws_url.startswith("wss://")

    async def talk() -> tuple[Any, Any]:
        async with websockets.connect(f"{gw.ws_url}/ws", ssl=_trusting(server)) as ws:
            await ws.send("hello")
            text = await ws.recv()
            await ws.send(b"\x00\x01")
            return text, await ws.recv()

    assert asyncio.run(talk()) == ("hello", b"\x00\x01")


# --- the settings: errors name the field ----------------------------------------------


def _write(tmp_path: Path, http: Any, upstream_tls: Any = None) -> Path:
    import yaml

    upstream: dict[str, Any] = {"url": "https://127.0.0.1:9443"}
    if upstream_tls is not None:
        upstream["tls"] = upstream_tls
    doc = {
        "listen": {"http": http, "admin": "127.0.0.1:9901"},
        "upstreams": {"a": upstream},
        "routes": [{"path": "/", "upstream": "a"}],
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _errors(path: Path) -> list[str]:
    with pytest.raises(GatewayConfigError) as info:
        load_config(path)
    return [line.split(": ", 1)[1] for line in info.value.errors]


def test_listener_tls_errors_name_the_field(server: Files, tmp_path: Path) -> None:
    """A missing file, a key of another certificate, a CA file that is no PEM."""
    other = _issue(tmp_path, "other", "127.0.0.1")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    address = "127.0.0.1:8443"
    cases = [
        ({"cert": "nope.pem", "key": server.key}, "listen.http.tls.cert: no such file"),
        ({"cert": server.cert, "key": "nope.pem"}, "listen.http.tls.key: no such file"),
        ({"cert": server.cert, "key": other.key}, "listen.http.tls.key: "),
        ({"cert": str(garbage), "key": server.key}, "listen.http.tls.cert: not a PEM certificate"),
        (
            {"cert": server.cert, "key": server.key, "client_ca": str(garbage)},
            "listen.http.tls.client_ca: no PEM certificate",
        ),
        ({"cert": server.cert}, "listen.http.tls.key: Field required"),
    ]
    for tls, expected in cases:
        errors = _errors(_write(tmp_path, {"address": address, "tls": tls}))
        assert len(errors) == 1 and errors[0].startswith(expected), (tls, errors)
    assert (
        "does not match"
        in _errors(
            _write(tmp_path, {"address": address, "tls": {"cert": server.cert, "key": other.key}})
        )[0]
    )


def test_upstream_tls_errors_name_the_field(server: Files, tmp_path: Path) -> None:
    """The upstream's ca, cert and key, and `tls` on a plain http:// upstream."""
    cases = [
        ({"ca": "missing-ca.pem"}, "upstreams.a.tls.ca: no such file"),
        ({"cert": server.cert, "key": "k.pem"}, "upstreams.a.tls.key: no such file"),
        ({"key": server.key}, "upstreams.a.tls: 'key' needs 'cert'"),
        ({"server_name": "bad name"}, "upstreams.a.tls.server_name: must be a host name"),
        ({"verify": "maybe"}, "upstreams.a.tls.verify:"),
    ]
    for tls, expected in cases:
        errors = _errors(_write(tmp_path, "127.0.0.1:8080", tls))
        assert len(errors) == 1 and errors[0].startswith(expected), (tls, errors)
    path = _write(tmp_path, "127.0.0.1:8080", {"verify": True})
    path.write_text(path.read_text().replace("https://", "http://"))
    assert _errors(path) == ["upstreams.a: 'tls' applies to https:// (or wss://) targets only"]


def test_relative_files_are_read_from_the_config_directory(
    server: Files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cert: server-cert.pem` beside the config file, whatever the working directory."""
    monkeypatch.chdir("/")
    tls = {"cert": Path(server.cert).name, "key": Path(server.key).name}
    config = load_config(_write(tmp_path, {"address": "127.0.0.1:8443", "tls": tls}))
    assert config.listen.http == "127.0.0.1:8443"  # the address, whichever form
    assert config.listen.http_scheme == "https"
    assert config.listen.http_tls is not None
    assert config.listen.http_tls.cert == server.cert
    assert server_context(config.listen.http_tls).verify_mode == ssl.CERT_NONE


def test_the_contexts_follow_the_settings(server: Files, tmp_path: Path) -> None:
    """client_ca -> CERT_REQUIRED; verify: false -> no check; a later missing file is a
    GatewayConfigError naming the field."""
    tls = {"cert": server.cert, "key": server.key, "client_ca": server.ca_pem}
    config = load_config(_write(tmp_path, {"address": "127.0.0.1:8443", "tls": tls}))
    assert config.listen.http_tls is not None
    assert server_context(config.listen.http_tls).verify_mode == ssl.CERT_REQUIRED
    config = load_config(_write(tmp_path, "127.0.0.1:8080", {"verify": False}))
    upstream_tls = config.upstreams["a"].tls
    ctx = client_context(upstream_tls)
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname
    assert client_context(None).verify_mode == ssl.CERT_REQUIRED
    config = load_config(_write(tmp_path, "127.0.0.1:8080", {"ca": server.ca_pem}))
    Path(server.ca_pem).unlink()
    with pytest.raises(GatewayConfigError, match=r"upstreams\.a\.tls\.ca: no such file"):
        client_context(config.upstreams["a"].tls, "upstreams.a.tls")
