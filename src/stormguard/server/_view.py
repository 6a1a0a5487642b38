# The ASGI scope as a RequestView (see _rules.py): headers looked up by lower-case
# name, repeated ones comma-joined, the peer address from scope["client"].
from __future__ import annotations

from typing import Any

from ._types import Scope

__all__ = ["ScopeView"]


class ScopeView:
    """A :class:`~stormguard.server._rules.RequestView` over an ASGI scope."""

    __slots__ = ("_headers", "raw")

    def __init__(self, scope: Scope) -> None:
        self.raw: Any = scope
        self._headers: dict[str, str] | None = None

    def header(self, name: str) -> str | None:
        """A request header by lower-case name (repeated values comma-joined)."""
        headers = self._headers
        if headers is None:
            headers = {}
            for key, value in self.raw.get("headers", ()):
                k = key.decode("latin-1").lower()
                v = value.decode("latin-1")
                headers[k] = f"{headers[k]}, {v}" if k in headers else v
            self._headers = headers
        return headers.get(name)

    def peer(self) -> str | None:
        """The peer address (``scope["client"][0]``), if the server gave one."""
        client = self.raw.get("client")
        return str(client[0]) if client else None
