# Rules: what a limit is written as, whom it counts, which requests it covers.
#
# A limit string is "N/unit", "N/M units", "N per unit" or "N per M units"
# (unit: second, minute, hour, day and their short forms); it becomes a
# SlidingWindowCounter, so a client cannot spend a window's quota twice around a
# fixed window's edge. Any algorithm object is taken as it is.
#
# A key spec names the client a request counts against:
#   "ip"           the peer address; X-Forwarded-For / Forwarded are believed only
#                  when the peer is a configured trusted proxy (never by default),
#                  and then the right-most address that is not a trusted proxy wins;
#   "global"       everyone together;
#   "header:NAME"  a request header (gRPC: request metadata);
#   callable       f(raw) -> str | None with the ASGI scope (gRPC: the handler call
#                  details) as `raw`;
#   [spec, ...]    the first spec that resolves (e.g. ["header:X-API-Key", "ip"]).
# A key that resolves to None means "the rule does not apply to this request".
#
# Front ends (ASGI, gRPC, the gateway) describe a request through `RequestView`,
# so one compiled key function serves all of them.
from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from .._errors import ConfigError
from ..core._limiters import Algorithm

__all__ = [
    "ClientAddress",
    "KeyFunc",
    "KeySpec",
    "RequestView",
    "Rule",
    "compile_key",
    "parse_limit",
]

# Algorithms a `sync` (approximate) rule may use: those with one-string state.
# What a callable key's value is prefixed with in a store key ("fn:" + its value).
CALLABLE_PREFIX = "fn:"
_APPROXIMATE = ("fixed_window", "gcra", "sliding_window_counter", "token_bucket")
_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}
_LIMIT = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(?:/|per)\s*(\d+(?:\.\d+)?)?\s*([a-z]+?)s?\s*$", re.IGNORECASE
)


def parse_limit(limit: str | Algorithm, *, field_name: str = "limit") -> Algorithm:
    """``"10/minute"``, ``"1000/second"``, ``"5 per 30 seconds"`` -> a sliding window.

    An algorithm object (``TokenBucket(...)``, ``GCRA(...)`` ...) is returned as is.
    Raises :class:`ConfigError` naming ``field_name`` when the string is malformed.
    """
    if not isinstance(limit, str):
        if not callable(getattr(limit, "advance", None)):
            raise ConfigError(field_name, f"must be a string or an algorithm, got {limit!r}")
        return limit
    match = _LIMIT.match(limit)
    unit = _UNITS.get(match.group(3).lower()) if match else None
    if match is None or unit is None:
        raise ConfigError(
            field_name, f"expected 'N/unit' or 'N per M units' (second|minute|hour|day): {limit!r}"
        )
    count = float(match.group(1))
    window = float(match.group(2) or 1) * unit
    if count <= 0 or window <= 0:
        raise ConfigError(field_name, f"count and window must be > 0: {limit!r}")
    from .. import SlidingWindowCounter

    return SlidingWindowCounter(count, window)


class RequestView(Protocol):
    """A request as a key function sees it, whatever the protocol."""

    @property
    def raw(self) -> Any:
        """The front end's own object (ASGI scope, gRPC handler call details)."""
        ...

    def header(self, name: str) -> str | None:
        """A header (gRPC: metadata) value by lower-case name; repeated ones comma-joined."""
        ...

    def peer(self) -> str | None:
        """The transport peer's address, without port."""
        ...


KeyFunc: TypeAlias = Callable[[RequestView], "str | None"]
KeySpec: TypeAlias = (
    "str | Callable[[Any], str | None] | Sequence[str | Callable[[Any], str | None]]"
)

Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    if isinstance(cidrs, str):
        raise ConfigError("trusted_proxies", "must be a list of CIDRs, not one string")
    out = []
    for cidr in cidrs:
        try:
            out.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError as exc:
            raise ConfigError("trusted_proxies", f"not an address or CIDR: {cidr!r}") from exc
    return tuple(out)


def _strip_port(value: str) -> str:
    value = value.strip().strip('"')
    if value.startswith("["):  # [v6]:port
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:  # v4:port
        return value.partition(":")[0]
    return value


def _forwarded_for(header: str) -> list[str]:
    # RFC 7239: `Forwarded: for=192.0.2.60;proto=http, for="[2001:db8::1]:4711"`.
    found = []
    for element in header.split(","):
        for pair in element.split(";"):
            name, _, value = pair.strip().partition("=")
            if name.lower() == "for" and value:
                found.append(_strip_port(value))
    return found


@dataclass(frozen=True, slots=True)
class ClientAddress:
    """The client's address: the peer, or (behind trusted proxies) the forwarded one.

    ``trusted_proxies`` are CIDRs (or single addresses) whose ``Forwarded`` /
    ``X-Forwarded-For`` headers are believed. Empty (the default) believes none.
    """

    trusted_proxies: tuple[Network, ...] = ()

    @classmethod
    def of(cls, trusted_proxies: Iterable[str] = ()) -> ClientAddress:
        """Build from CIDR strings (``ConfigError`` on a malformed one)."""
        return cls(_networks(trusted_proxies))

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.trusted_proxies)

    def resolve(self, view: RequestView) -> str | None:
        """The client address of ``view`` (None when the server gave no peer)."""
        peer = view.peer()
        if not self.trusted_proxies or peer is None or not self._trusted(peer):
            return peer
        forwarded = view.header("forwarded")
        chain = _forwarded_for(forwarded) if forwarded else []
        if not chain:
            xff = view.header("x-forwarded-for")
            chain = [_strip_port(part) for part in xff.split(",")] if xff else []
        # Right to left: the first hop not run by us is the client as far as we know.
        for hop in reversed(chain):
            if hop and not self._trusted(hop):
                return hop
        return chain[0] if chain and chain[0] else peer


def compile_key(spec: KeySpec, address: ClientAddress | None = None) -> KeyFunc:
    """A function ``view -> key | None`` for a key spec (see the module notes).

    Keys carry their kind (``ip:``, ``h:NAME:``) so different specs never collide.
    """
    if isinstance(spec, list | tuple):
        # Several specs: the first one present names the client (the gateway's
        # `clients.key: [header:X-API-Key, ip]`).
        chain = [compile_key(one, address) for one in spec]
        if not chain:
            raise ConfigError("key", "an empty list of key specs names nobody")

        def first_present(view: RequestView) -> str | None:
            for key_of in chain:
                value = key_of(view)
                if value is not None:
                    return value
            return None

        return first_present
    if callable(spec):
        custom = spec

        def by_callable(view: RequestView) -> str | None:
            value = custom(view.raw)
            return None if value is None else f"{CALLABLE_PREFIX}{value}"

        return by_callable
    if not isinstance(spec, str):
        raise ConfigError("key", f"must be 'ip', 'global', 'header:NAME' or a callable: {spec!r}")
    if spec == "global":
        return lambda view: "global"
    if spec == "ip":
        resolve = (address or ClientAddress()).resolve

        def by_ip(view: RequestView) -> str | None:
            ip = resolve(view)
            return None if ip is None else f"ip:{ip}"

        return by_ip
    kind, _, name = spec.partition(":")
    if kind.lower() != "header" or not name.strip():
        raise ConfigError("key", f"must be 'ip', 'global', 'header:NAME' or a callable: {spec!r}")
    header = name.strip().lower()
    prefix = f"h:{header}:"

    def by_header(view: RequestView) -> str | None:
        value = view.header(header)
        return None if not value else prefix + value

    return by_header


def _upper(methods: Iterable[str] | None) -> frozenset[str] | None:
    if methods is None:
        return None
    if isinstance(methods, str):
        methods = (methods,)
    return frozenset(m.upper() for m in methods)


def _prefixes(paths: Iterable[str] | None) -> tuple[str, ...] | None:
    if paths is None:
        return None
    if isinstance(paths, str):
        paths = (paths,)
    out = tuple(paths)
    if any(not p.startswith("/") for p in out):
        raise ConfigError("paths", f"every path prefix must start with '/': {out!r}")
    return out


@dataclass(frozen=True, slots=True, init=False)
class Rule:
    """One limit: how much (``limit``), for whom (``key``), on which requests.

    ``limit`` is ``"N/second|minute|hour|day"``, ``"N per M seconds"`` (a sliding
    window) or an algorithm object. ``key`` is ``"ip"``, ``"global"``,
    ``"header:NAME"`` or a callable of the ASGI scope returning a string or None
    (None: the rule does not apply). ``paths`` are path prefixes and ``methods``
    HTTP methods (None: all). ``cost`` is what one request takes. ``name`` names the
    policy in headers and store keys (default: derived from key and limit).

    ``shadow=True`` decides and counts the rule but never refuses with it (a
    refusal it would have made is reported as ``shadow:<name>``). ``sync=S``
    (seconds) makes a shared limit approximate on Redis: each process admits from
    units it reserved in Redis and gives back what it did not use after ``S``
    seconds. The bound: a fixed or sliding window still admits at most ``limit``
    per window; a token bucket or GCRA admits at most ``burst + rate * (T + S)``
    in any ``T`` seconds (over-admission at most ``rate * S``, and at most
    ``instances * lease`` with ``lease <= limit / (4 * instances)``).
    """

    algorithm: Algorithm
    key: KeySpec
    paths: tuple[str, ...] | None
    methods: frozenset[str] | None
    cost: float
    name: str
    limit: str | Algorithm = field(repr=False)
    shadow: bool = False
    sync: float | None = None

    def __init__(
        self,
        limit: str | Algorithm,
        *,
        key: KeySpec = "ip",
        paths: str | Sequence[str] | None = None,
        methods: str | Sequence[str] | None = None,
        cost: float = 1,
        name: str | None = None,
        shadow: bool = False,
        sync: float | None = None,
    ) -> None:
        algorithm = parse_limit(limit)
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost < 1e18:
            raise ConfigError("cost", f"must be a number >= 0, got {cost!r}")
        if not isinstance(shadow, bool):
            raise ConfigError("shadow", f"must be True or False, got {shadow!r}")
        if sync is not None:
            if isinstance(sync, bool) or not isinstance(sync, int | float) or not 0 < sync < 1e6:
                raise ConfigError("sync", f"must be a number of seconds > 0, got {sync!r}")
            if algorithm.kind not in _APPROXIMATE:
                raise ConfigError(
                    "sync",
                    f"approximate mode takes {', '.join(sorted(_APPROXIMATE))}, "
                    f"not {algorithm.kind}",
                )
        compile_key(key)  # validates the spec
        if name is None:
            label = _key_label(key)
            name = f"{label}-{_limit_label(limit, algorithm)}"
        setter = object.__setattr__
        setter(self, "limit", limit)
        setter(self, "algorithm", algorithm)
        setter(self, "key", key)
        setter(self, "paths", _prefixes(paths))
        setter(self, "methods", _upper(methods))
        setter(self, "cost", float(cost))
        setter(self, "name", name)
        setter(self, "shadow", shadow)
        setter(self, "sync", None if sync is None else float(sync))

    def matches(self, method: str, path: str) -> bool:
        """Whether the rule covers a request with ``method`` and ``path``."""
        if self.methods is not None and method.upper() not in self.methods:
            return False
        return self.paths is None or any(path.startswith(p) for p in self.paths)


def _key_label(key: KeySpec) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, list | tuple):
        return "|".join(_key_label(k) for k in key)
    return str(getattr(key, "__name__", "fn"))


def _limit_label(limit: str | Algorithm, algorithm: Algorithm) -> str:
    if isinstance(limit, str):
        return "".join(limit.split())
    first, second = algorithm.params()
    return f"{algorithm.kind}:{first:g}:{second:g}"
