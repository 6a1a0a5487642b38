# A request's priority class, from the first source that names one:
#
#   1. a callable of the front end's raw request (ASGI scope, gRPC call details)
#      returning a class name (or None: ask the next source);
#   2. the header named by `priority: {header: NAME, trust: proxies | always}`,
#      believed only from a peer in `trusted_proxies` unless trust is "always"
#      (a client that could name its own class would call itself critical);
#   3. the route: the longest path prefix in `routes` (gRPC: the method
#      "/pkg.Service/Method" as the path) naming a class;
#   4. `default` (the class `default` unless configured).
# A header value that names no class is ignored, never an error.
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from .._errors import ConfigError
from ..core._priority import Priority
from ._rules import ClientAddress, RequestView

__all__ = ["Classify", "PrioritySpec", "compile_priority"]

PrioritySpec: TypeAlias = "Mapping[str, str] | Callable[[Any], object] | None"
Classify: TypeAlias = Callable[[RequestView, str], Priority]
_TRUST = ("proxies", "always")


def _routes(routes: Mapping[str, object] | None) -> list[tuple[str, Priority]]:
    if routes is None:
        return []
    if not isinstance(routes, Mapping):
        raise ConfigError("routes", "must map path prefixes to priority classes")
    table = []
    for prefix, name in routes.items():
        if not isinstance(prefix, str) or not prefix.startswith("/"):
            raise ConfigError("routes", f"prefixes must start with '/': {prefix!r}")
        table.append((prefix, Priority.of(name, f"routes[{prefix!r}]")))
    return sorted(table, key=lambda item: -len(item[0]))


def _header(spec: Mapping[str, str]) -> tuple[str, bool]:
    unknown = sorted(set(spec) - {"header", "trust"})
    if unknown:
        raise ConfigError(f"priority.{unknown[0]}", "unknown key (expected header, trust)")
    name = spec.get("header")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("priority.header", f"must be a header name, got {name!r}")
    trust = spec.get("trust", "proxies")
    if trust not in _TRUST:
        raise ConfigError("priority.trust", f"must be one of {_TRUST}, got {trust!r}")
    return name.strip().lower(), trust == "always"


def compile_priority(
    priority: PrioritySpec = None,
    *,
    routes: Mapping[str, object] | None = None,
    address: ClientAddress | None = None,
    default: object = Priority.DEFAULT,
) -> Classify:
    """A function ``(view, path) -> Priority`` (see the module notes for the order).

    ``priority``: None, ``{"header": NAME, "trust": "proxies" | "always"}`` or a
    callable of the raw request. ``routes``: path prefix -> class name. ``address``
    holds the trusted proxies. Raises ConfigError naming the field at construction.
    """
    fallback = Priority.of(default, "default")
    table = _routes(routes)
    custom: Callable[[Any], object] | None = None
    header: str | None = None
    always = False
    if callable(priority):
        custom = priority
    elif isinstance(priority, Mapping):
        header, always = _header(priority)
    elif priority is not None:
        raise ConfigError("priority", "a {header, trust} mapping or a callable of the request")
    trusts = (address or ClientAddress())._trusted

    def classify(view: RequestView, path: str) -> Priority:
        if custom is not None:
            found = Priority.parse(custom(view.raw))
            if found is not None:
                return found
        if header is not None:
            value = view.header(header)
            if value is not None:
                peer = view.peer()
                if always or (peer is not None and trusts(peer)):
                    found = Priority.parse(value)
                    if found is not None:
                        return found
        for prefix, named in table:
            if path.startswith(prefix):
                return named
        return fallback

    return classify
