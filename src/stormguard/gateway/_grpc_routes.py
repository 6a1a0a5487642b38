# The gRPC leg's configuration objects: upstreams, limits, routes, client keys.
#
# These are what the gateway's config model is turned into (or what a program
# builds by hand). They hold live protection objects — the same CircuitBreaker,
# Bulkhead, RetryBudget and AsyncRateLimiter the HTTP leg uses — and no I/O.
#
# Routes: `pkg.Service/Method` beats `pkg.Service`; a method no route names is
# answered UNIMPLEMENTED by grpc itself. Client keys follow the gateway's
# `clients.key` list: the first one present names the client; the key specs are
# the server side's (compile_key): `header:NAME` reads request metadata (names
# are lower case on the wire), `ip` the peer address without its port.
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._errors import ConfigError
from .._limiter import AsyncRateLimiter
from ..protection import Bulkhead, CircuitBreaker, RetryBudget
from ..server._rules import ClientAddress, KeyFunc, RequestView, compile_key

__all__ = [
    "GrpcLimit",
    "GrpcRoute",
    "GrpcUpstream",
    "RefuseWith",
    "RouteTable",
    "ClientKeys",
    "MetadataView",
    "peer_ip",
    "target_of",
]

RefuseWith = Literal["unavailable", "resource_exhausted"]
Per = Literal["client", "global"]
_REFUSE_WITH = ("unavailable", "resource_exhausted")


def target_of(url: str) -> str:
    """``host:port`` from ``grpc://host:port`` (a bare ``host:port`` is kept)."""
    target = url.removeprefix("grpc://").rstrip("/")
    if not target or "://" in target or "/" in target:
        raise ConfigError("url", f"must be grpc://HOST:PORT, got {url!r}")
    return target


@dataclass(frozen=True, slots=True)
class GrpcLimit:
    """A named limit on a route, decided per client or for everyone together."""

    name: str
    limiter: AsyncRateLimiter
    per: Per = "client"

    def __post_init__(self) -> None:
        if self.per not in ("client", "global"):
            raise ConfigError("per", f"must be 'client' or 'global', got {self.per!r}")


@dataclass(frozen=True, slots=True)
class GrpcUpstream:
    """One upstream gRPC server and the protection around it.

    ``attempts`` bounds the tries of a call that never reached the upstream
    (1: no retry); each retry is withdrawn from ``budget`` and waits at most
    ``connect_timeout`` seconds for the upstream to become reachable.
    """

    name: str
    url: str
    breaker: CircuitBreaker | None = None
    bulkhead: Bulkhead | None = None
    budget: RetryBudget | None = None
    attempts: int = 1
    connect_timeout: float = 1.0
    target: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", target_of(self.url))
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ConfigError("attempts", f"must be an integer >= 1, got {self.attempts!r}")
        if self.attempts < 1:
            raise ConfigError("attempts", f"must be an integer >= 1, got {self.attempts!r}")
        if not 0 < self.connect_timeout < math.inf:
            raise ConfigError("connect_timeout", f"must be > 0, got {self.connect_timeout!r}")


@dataclass(frozen=True, slots=True)
class GrpcRoute:
    """``grpc: pkg.Service`` or ``grpc: pkg.Service/Method`` sent to ``upstream``."""

    grpc: str
    upstream: str
    limits: tuple[GrpcLimit, ...] = ()
    refuse_with: RefuseWith = "unavailable"

    def __post_init__(self) -> None:
        service, _, method = self.grpc.partition("/")
        if not service or self.grpc.startswith("/") or "/" in method or self.grpc.endswith("/"):
            raise ConfigError("grpc", f"must be SERVICE or SERVICE/METHOD, got {self.grpc!r}")
        if self.refuse_with not in _REFUSE_WITH:
            raise ConfigError(
                "refuse_with", f"must be one of {_REFUSE_WITH}, got {self.refuse_with!r}"
            )
        object.__setattr__(self, "limits", tuple(self.limits))

    @property
    def service(self) -> str:
        """The service part of the match (the key of the route in status and metrics)."""
        return self.grpc.partition("/")[0]


class RouteTable:
    """Finds the route of a full method name ``/pkg.Service/Method`` in two lookups."""

    __slots__ = ("_routes",)

    def __init__(self, routes: Iterable[GrpcRoute], upstreams: Mapping[str, object]) -> None:
        self._routes: dict[str, GrpcRoute] = {}
        for index, route in enumerate(routes):
            if route.upstream not in upstreams:
                raise ConfigError(
                    f"routes.{index}.upstream", f"unknown upstream {route.upstream!r}"
                )
            if route.grpc in self._routes:
                raise ConfigError(f"routes.{index}.grpc", f"{route.grpc!r} is routed twice")
            self._routes[route.grpc] = route

    def __iter__(self) -> Iterator[GrpcRoute]:
        return iter(self._routes.values())

    def resolve(self, method: str) -> GrpcRoute | None:
        """The route for ``/pkg.Service/Method``, or None."""
        name = method[1:] if method.startswith("/") else method
        route = self._routes.get(name)
        if route is None:
            route = self._routes.get(name.partition("/")[0])
        return route


def peer_ip(peer: str) -> str | None:
    """The address of a grpc peer string without its port (``ipv4:1.2.3.4:5`` -> ``1.2.3.4``)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or None
    return None


class MetadataView:
    """A gRPC call as a key function sees it (``RequestView`` of stormguard.server)."""

    __slots__ = ("_headers", "_peer", "raw")

    def __init__(self, metadata: Iterable[tuple[str, str | bytes]] | None, peer: str) -> None:
        self.raw: Any = metadata
        self._peer = peer
        self._headers: dict[str, str] | None = None

    def header(self, name: str) -> str | None:
        """A text metadata value by lower-case name (repeated ones comma-joined)."""
        headers = self._headers
        if headers is None:
            headers = {}
            for key, value in self.raw or ():
                if isinstance(value, str):
                    headers[key] = f"{headers[key]}, {value}" if key in headers else value
            self._headers = headers
        return headers.get(name)

    def peer(self) -> str | None:
        """The peer's address without its port."""
        return peer_ip(self._peer)


class ClientKeys:
    """The gateway's ``clients.key`` list: the first key present names the client.

    Each entry is a key spec of :func:`stormguard.server._rules.compile_key`
    (``header:NAME``, ``ip``); ``trusted_proxies`` are believed for ``ip``.
    """

    __slots__ = ("_keys",)

    def __init__(self, specs: Sequence[str], trusted_proxies: Sequence[str] = ()) -> None:
        if isinstance(specs, str):
            specs = (specs,)
        address = ClientAddress.of(trusted_proxies)
        self._keys: tuple[KeyFunc, ...] = tuple(compile_key(spec, address) for spec in specs)

    def __call__(self, view: RequestView) -> str | None:
        """The client's key for ``view`` (None: no key present)."""
        for key_of in self._keys:
            key = key_of(view)
            if key is not None:
                return key
        return None
