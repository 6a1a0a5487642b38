# TLS for the gateway: the listener's server context (`listen.http.tls`) and an
# upstream's client context (`upstreams.NAME.tls`), built from the validated settings.
#
# Every failure names the setting it comes from: a file that is missing or
# unreadable names its own field; a certificate that is not PEM names `cert`; a key
# that does not fit the certificate names `key`; a CA bundle that holds no
# certificate names `ca` / `client_ca`. The configuration loader builds both
# contexts once at load (so `gateway check` reports them with file:line:col); the
# public functions raise GatewayConfigError with the dotted path.
from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._config import ListenTLS, UpstreamTLS

__all__ = ["TLSSettingError", "client_context", "server_context"]


class TLSSettingError(ValueError):
    """One TLS setting is wrong; ``field`` is its key (``cert``, ``key``, ``ca``...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _readable(field: str, path: str) -> None:
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except FileNotFoundError:
        raise TLSSettingError(field, f"no such file: {path!r}") from None
    except IsADirectoryError:
        raise TLSSettingError(field, f"is a directory, not a PEM file: {path!r}") from None
    except OSError as exc:
        raise TLSSettingError(field, f"cannot read {path!r}: {exc.strerror}") from None


def _load_pair(ctx: ssl.SSLContext, cert: str, key: str | None) -> None:
    _readable("cert", cert)
    if key is not None:
        _readable("key", key)
    try:
        ctx.load_cert_chain(cert, key)
        return
    except ssl.SSLError as exc:
        failure = exc
    # Which half is wrong: a certificate that loads as a CA file is a certificate.
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        probe.load_verify_locations(cafile=cert)
    except ssl.SSLError:
        raise TLSSettingError("cert", f"not a PEM certificate: {cert!r}") from None
    if key is None:
        raise TLSSettingError(
            "key", f"{cert!r} holds no private key; give the key file in 'key'"
        ) from None
    reason = getattr(failure, "reason", None) or str(failure)
    if reason == "KEY_VALUES_MISMATCH":
        raise TLSSettingError("key", f"{key!r} does not match the certificate {cert!r}") from None
    raise TLSSettingError("key", f"not a PEM private key for {cert!r}: {key!r}") from None


def _load_ca(ctx: ssl.SSLContext, field: str, path: str) -> None:
    _readable(field, path)
    try:
        ctx.load_verify_locations(cafile=path)
    except ssl.SSLError:
        raise TLSSettingError(field, f"no PEM certificate in {path!r}") from None


def build_server_context(tls: ListenTLS) -> ssl.SSLContext:
    """The listener's context (raises :class:`TLSSettingError`)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_pair(ctx, tls.cert, tls.key)
    if tls.client_ca is not None:
        _load_ca(ctx, "client_ca", tls.client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED  # client_ca given: a client certificate is required
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def build_client_context(tls: UpstreamTLS | None) -> ssl.SSLContext:
    """An upstream's context (raises :class:`TLSSettingError`); ``None``: the system CAs."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if tls is None:
        return ctx
    if tls.ca is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # only the given CA is trusted
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_ca(ctx, "ca", tls.ca)
    if tls.cert is not None:
        _load_pair(ctx, tls.cert, tls.key)
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _named(where: str, exc: TLSSettingError) -> Exception:
    from ._config import GatewayConfigError

    return GatewayConfigError([f"{where}.{exc.field}: {exc.message}"])


def server_context(tls: ListenTLS, where: str = "listen.http.tls") -> ssl.SSLContext:
    """The listener's :class:`ssl.SSLContext` from ``listen.http.tls``.

    ``client_ca`` makes client certificates required (signed by that CA). Raises
    :class:`~stormguard.gateway.GatewayConfigError` naming the field.
    """
    try:
        return build_server_context(tls)
    except TLSSettingError as exc:
        raise _named(where, exc) from None


def client_context(tls: UpstreamTLS | None, where: str = "upstreams.tls") -> ssl.SSLContext:
    """An upstream's :class:`ssl.SSLContext` from ``upstreams.NAME.tls``.

    ``ca`` replaces the system CAs, ``cert``/``key`` is the client certificate,
    ``verify: false`` checks neither the chain nor the name. Raises
    :class:`~stormguard.gateway.GatewayConfigError` naming the field.
    """
    try:
        return build_client_context(tls)
    except TLSSettingError as exc:
        raise _named(where, exc) from None
