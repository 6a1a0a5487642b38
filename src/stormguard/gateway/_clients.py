# Who is the client? The first of `clients.key` present names it: `header:NAME`
# reads a request header, `ip` the peer address -- or, when the peer is one of
# `clients.trusted_proxies`, the right-most untrusted address of X-Forwarded-For.
# Logs and dashboards never show a raw key: `client_id()` is the first 8 hex digits
# of its SHA-256 (pinned), with the rule that chose it.
from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

__all__ = ["ClientIdentity", "client_id"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=4096)
def client_id(key: str) -> str:
    """The loggable name of a client key: the first 8 hex digits of its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


class ClientIdentity:
    """Extracts ``(rule, key)`` and the client's IP from an ASGI scope."""

    __slots__ = ("_headers", "_proxies", "rules")

    def __init__(self, rules: Sequence[str], trusted_proxies: Sequence[str]) -> None:
        self.rules = tuple(rules)
        # (rule, lower-cased header name as bytes) per header rule; None for "ip".
        self._headers = tuple(
            (rule, rule[7:].strip().lower().encode("latin-1") if rule != "ip" else None)
            for rule in self.rules
        )
        self._proxies: tuple[Network, ...] = tuple(
            ipaddress.ip_network(p, strict=False) for p in trusted_proxies
        )

    def _trusted(self, address: str) -> bool:
        if not self._proxies:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self._proxies)

    def ip(self, scope: dict[str, Any]) -> str:
        """The client address, believing X-Forwarded-For only from trusted proxies."""
        peer = scope.get("client")
        address = str(peer[0]) if peer else "unknown"
        if not self._proxies or not self._trusted(address):
            return address
        forwarded = [
            v.decode("latin-1") for k, v in scope["headers"] if k == b"x-forwarded-for"
        ]
        hops = [h.strip() for line in forwarded for h in line.split(",") if h.strip()]
        for hop in reversed(hops):  # right-most first: the nearest hop we can check
            if not self._trusted(hop):
                return hop
        return hops[0] if hops else address

    def identify(self, scope: dict[str, Any]) -> tuple[str, str]:
        """``(rule, key)``: the first configured rule present names the client."""
        headers = scope["headers"]
        for rule, name in self._headers:
            if name is None:
                return rule, self.ip(scope)
            for k, v in headers:
                if k == name and v:
                    return rule, v.decode("latin-1")
        return "ip", self.ip(scope)
