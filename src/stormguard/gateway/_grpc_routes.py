# The gRPC leg's routes and client keys, and the channel target of an upstream.
#
# Nothing here is gRPC-specific protection: a route holds the server side's
# RuleSet (its limits, decided in one store call) and names an upstream whose
# UpstreamPool (breaker, bulkhead with per-client share, retry budget) is the one
# the HTTP leg uses too. No I/O here.
#
# Routes: `pkg.Service/Method` beats `pkg.Service`; a method no route names is
# answered UNIMPLEMENTED by grpc itself. The client is named by the gateway's
# ClientIdentity (the server side's key specs) over the server side's gRPC call
# view: `header:NAME` reads request metadata, `ip` the peer address without port.
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._errors import ConfigError
from ..core._limiters import Concurrency, Decision
from ..server._decide import RuleSet
from ..server._rules import RequestView

__all__ = [
    "CLIENT_KEY",
    "GrpcRoute",
    "RefuseWith",
    "RouteTable",
    "target_of",
]

RefuseWith = Literal["unavailable", "resource_exhausted"]
_REFUSE_WITH = ("unavailable", "resource_exhausted")
CLIENT_KEY = "stormguard.client"  # the view's raw entry holding the client's key


def target_of(urls: Sequence[str]) -> str:
    """The grpc channel target of ``grpc://HOST:PORT`` URLs.

    One URL gives ``HOST:PORT``; several IPv4 ones give ``ipv4:A:P,B:Q`` (the channel
    balances them round-robin).
    """
    hosts = []
    for url in urls:
        target = url.removeprefix("grpc://").rstrip("/")
        if not target or "://" in target or "/" in target or ":" not in target:
            raise ConfigError("url", f"must be grpc://HOST:PORT, got {url!r}")
        hosts.append(target)
    if len(hosts) == 1:
        return hosts[0]
    try:
        for host in hosts:
            ipaddress.IPv4Address(host.rpartition(":")[0])
    except ValueError:
        raise ConfigError(
            "targets", f"several gRPC targets must be IPv4 addresses: {list(urls)!r}"
        ) from None
    return "ipv4:" + ",".join(hosts)


@dataclass(frozen=True, slots=True)
class GrpcRoute:
    """``grpc: pkg.Service`` or ``grpc: pkg.Service/Method`` sent to ``upstream``.

    ``rules`` (a server-side ``RuleSet``) are the route's limits, keyed by the
    request view: ``header:NAME`` reads metadata, ``ip`` the peer, and a callable
    gets ``{"stormguard.client": key}`` (the key the gateway's ``clients.key``
    chose). ``refuse_with`` is the status of a refusal over a limit.
    """

    grpc: str
    upstream: str
    rules: RuleSet | None = None
    refuse_with: RefuseWith = "unavailable"
    # The call's priority class (view, method) -> Priority, when the upstream has
    # overload control (the HTTP routes' classify: route class, priority header).
    classify: Any = field(default=None, compare=False)
    # Concurrency limits by name: their slots are given back when the call ends.
    leased: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        entries = self.rules._entries if self.rules is not None else ()
        leased = {rule.name: (key_of, limiter) for rule, key_of, limiter in entries}
        object.__setattr__(
            self,
            "leased",
            {
                name: pair
                for name, pair in leased.items()
                if isinstance(pair[1].algorithm, Concurrency)
            },
        )
        service, _, method = self.grpc.partition("/")
        if not service or self.grpc.startswith("/") or "/" in method or self.grpc.endswith("/"):
            raise ConfigError("grpc", f"must be SERVICE or SERVICE/METHOD, got {self.grpc!r}")
        if self.refuse_with not in _REFUSE_WITH:
            raise ConfigError(
                "refuse_with", f"must be one of {_REFUSE_WITH}, got {self.refuse_with!r}"
            )

    @property
    def name(self) -> str:
        """The route's name in status and metrics: what it matches (as the config has it)."""
        return self.grpc

    async def release(self, decision: Decision, view: RequestView) -> None:
        """Give back the Concurrency slots ``decision`` holds for the call of ``view``."""
        for part in decision.parts or (decision,):
            pair = self.leased.get(part.name)
            if pair is not None and part.lease:
                key_of, limiter = pair
                await limiter.release(str(key_of(view)), part.lease)


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
