# Who is the client? The first of `clients.key` present names it (`header:NAME`, or
# `ip`: the peer, or behind `clients.trusted_proxies` the forwarded address). The
# key functions and the trusted-proxy rule are the server side's (server/_rules.py);
# this only tries them in order. Logs and dashboards never show a raw key:
# `client_id()` is the first 8 hex digits of its SHA-256 (pinned).
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from ..server._rules import ClientAddress, KeyFunc, RequestView, compile_key
from ..server._view import ScopeView

__all__ = ["ClientIdentity", "client_id"]


@lru_cache(maxsize=4096)
def client_id(key: str) -> str:
    """The loggable name of a client key: the first 8 hex digits of its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


class ClientIdentity:
    """Names the client of a request: ``(rule, key)`` from the first rule present."""

    __slots__ = ("_address", "_by_token", "_keys", "header_names", "per_connection")

    def __init__(self, rules: Sequence[str], trusted_proxies: Sequence[str]) -> None:
        self._address = ClientAddress.of(trusted_proxies)
        self._keys: tuple[tuple[str, KeyFunc], ...] = tuple(
            (rule, compile_key(rule, self._address)) for rule in rules
        )
        # Whether a connection's requests all name the same client: every rule is
        # `ip` and no proxy is trusted, so the key is the peer's address.
        self.per_connection = not self._address.trusted_proxies and all(
            rule == "ip" for rule in rules
        )
        # Otherwise, with no proxy trusted and only `header:NAME` and `ip` rules, the
        # key on one connection follows from those headers alone (`token`): a
        # connection whose requests send the same ones names the same client.
        # Per rule, in order: the header it reads (None for `ip`) and its keys' prefix,
        # as compile_key's `header:NAME` reads and names them (see from_token).
        self._by_token: tuple[tuple[str, bytes | None, str], ...] = tuple(
            (rule, None, "") if rule == "ip" else (rule, name.encode("latin-1"), f"h:{name}:")
            for rule, name in ((r, r.partition(":")[2].strip().lower()) for r in rules)
        )
        self.header_names: frozenset[bytes] | None = None
        only_headers = all(rule == "ip" or rule.lower().startswith("header:") for rule in rules)
        if not self.per_connection and not self._address.trusted_proxies and only_headers:
            self.header_names = frozenset(h for _, h, _ in self._by_token if h is not None)

    def token(self, headers: Sequence[tuple[bytes, bytes]]) -> tuple[tuple[bytes, bytes], ...]:
        """The headers the key of a request on one connection follows from (only with
        :attr:`header_names`): equal tokens, the same ``(rule, key)``."""
        names = self.header_names
        assert names is not None
        token = []
        for pair in headers:
            if pair[0].lower() in names:
                token.append(pair)
        return tuple(token)

    def from_token(self, token: tuple[tuple[bytes, bytes], ...]) -> tuple[str, str] | None:
        """:meth:`identify`'s ``(rule, key)`` read off a :meth:`token` alone (no view, no
        key function) when a header rule names the client before any `ip` rule;
        None when `ip` would be asked first: call :meth:`identify` then."""
        for rule, wanted, prefix in self._by_token:
            if wanted is None:
                return None  # the address: the general path resolves it
            found = _joined(token, wanted)
            if found:
                return rule, prefix + found
        return None

    def view(self, scope: Any, token: tuple[tuple[bytes, bytes], ...] | None) -> ScopeView:
        """The request of ``scope`` as the rules read it; with the ``token`` of
        :meth:`token` its naming headers are read from the token (no dict of all the
        request's headers is built)."""
        if token is None or self.header_names is None:
            return ScopeView(scope)
        return _NamingView(scope, token, self.header_names)

    def ip(self, view: RequestView) -> str:
        """The client address (forwarded headers believed only from trusted proxies)."""
        return self._address.resolve(view) or "unknown"

    def trusted_peer(self, view: RequestView) -> bool:
        """Whether the transport peer is a trusted proxy."""
        if not self._address.trusted_proxies:
            return False
        peer = view.peer()
        return peer is not None and self._address._trusted(peer)

    def identify(self, view: RequestView) -> tuple[str, str]:
        """``(rule, key)``: the first configured rule that resolves names the client."""
        for rule, key_of in self._keys:
            key = key_of(view)
            if key is not None:
                return rule, key
        return "ip", f"ip:{self.ip(view)}"


class _NamingView(ScopeView):
    """A ScopeView whose naming headers come from a token: every occurrence of them,
    in order, comma-joined as ScopeView joins repeated headers."""

    __slots__ = ("_names", "_token")

    def __init__(
        self, scope: Any, token: tuple[tuple[bytes, bytes], ...], names: frozenset[bytes]
    ) -> None:
        # ScopeView.__init__'s two fields, set here (a frame less per new client)
        self.raw: Any = scope
        self._headers: dict[str, str] | None = None
        self._token = token
        self._names = names

    def header(self, name: str) -> str | None:
        wanted = name.encode("latin-1")
        if wanted not in self._names:
            return super().header(name)
        return _joined(self._token, wanted)


def _joined(token: tuple[tuple[bytes, bytes], ...], wanted: bytes) -> str | None:
    # Every value of header `wanted` in the token, comma-joined as ScopeView joins
    # repeated headers (None: not there).
    found = None
    for key, value in token:
        if key.lower() == wanted:
            text = value.decode("latin-1")
            found = text if found is None else f"{found}, {text}"
    return found
