# The gateway's configuration: pydantic models, `${ENV}` expansion, cross-references,
# and every error at once as `file:line:col: dotted.path: message`.
#
# Loading is three passes over one document so that a single run shows every
# mistake: (1) parse (YAML keeps node marks for line and column; TOML gets lines by
# a search of its source, column 1); (2) expand `${NAME}` / `${NAME:-default}` in
# string values (an unset name without a default is an error at that value);
# (3) pydantic validation with unknown keys forbidden, plus the references between
# sections (route -> upstream, route -> limit) checked on the raw document, so they
# are reported even when an unrelated field is invalid.
#
# The format is the one in the design document ("Gateway"); later issues extend it
# (the gRPC proxy reads `listen.grpc` and the `grpc:` routes validated here).
from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .._errors import ConfigError, StormguardError
from ..stores import _REDIS_SCHEMES

__all__ = [
    "ALGORITHMS",
    "GatewayConfig",
    "GatewayConfigError",
    "HttpListener",
    "Limit",
    "ListenTLS",
    "Route",
    "Upstream",
    "UpstreamTLS",
    "config_warnings",
    "load_config",
    "parse_config",
]

FieldPath = tuple[str | int, ...]
Position = tuple[int, int]

STORE_SCHEMES = ("memory", *_REDIS_SCHEMES)
ALGORITHMS = (
    "token_bucket",
    "gcra",
    "sliding_window",
    "sliding_log",
    "fixed_window",
    "concurrency",
)


class GatewayConfigError(ConfigError):
    """An invalid gateway configuration; ``errors`` holds one line per mistake."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        self.field = "config"
        StormguardError.__init__(self, "\n".join(errors))  # the lines name their fields


# --- models ---------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_HOSTPORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):(?P<port>\d{1,5})$")


def split_hostport(value: str) -> tuple[str, int]:
    """``"127.0.0.1:8080"`` -> ``("127.0.0.1", 8080)``; ``[::1]:80`` keeps the brackets off."""
    match = _HOSTPORT.match(value)
    if match is None or not 0 <= int(match["port"]) <= 65535:
        raise ValueError(f"must be host:port, got {value!r}")
    return match["host"].strip("[]"), int(match["port"])


class ListenTLS(_Model):
    """TLS on the HTTP listener: ``cert`` and ``key`` (PEM), ``client_ca`` to require
    client certificates signed by that CA (mutual TLS). Relative paths are taken from
    the config file's directory."""

    cert: str
    key: str
    client_ca: str | None = None

    @field_validator("cert", "key", "client_ca")
    @classmethod
    def _path(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _resolve(value, info)


class HttpListener(_Model):
    """The mapping form of ``listen.http``: ``{address: host:port, tls: {...}}``."""

    address: str = "127.0.0.1:8080"
    tls: ListenTLS | None = None

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        split_hostport(value)
        return value


class Listen(_Model):
    """Where the gateway listens: ``http`` (HTTP + WebSocket; ``host:port`` or
    ``{address, tls}``), ``grpc``, ``admin``.

    ``http`` reads as the address whichever form was written; ``http_tls`` holds
    the listener's TLS settings (None: plain HTTP)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)

    http_listener: HttpListener = Field(default_factory=HttpListener, alias="http")
    grpc: str | None = None
    admin: str | None = "127.0.0.1:9901"

    @field_validator("http_listener", mode="before")
    @classmethod
    def _http(cls, value: Any) -> Any:
        if isinstance(value, str):
            split_hostport(value)  # the error is at listen.http itself
            return {"address": value}
        return value

    @field_validator("grpc", "admin")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            split_hostport(value)
        return value

    @property
    def http(self) -> str:
        """The HTTP listener's ``host:port``."""
        return self.http_listener.address

    @property
    def http_tls(self) -> ListenTLS | None:
        """The HTTP listener's TLS settings (None: plain HTTP)."""
        return self.http_listener.tls

    @property
    def http_scheme(self) -> str:
        """``https`` when the listener has TLS, else ``http``."""
        return "https" if self.http_listener.tls is not None else "http"


_ANY = {"0.0.0.0", "::", ""}  # a wildcard address overlaps every address on its port


def _resolve(value: str | None, info: ValidationInfo) -> str | None:
    # Relative file names are relative to the config file (load_config passes its
    # directory in the validation context).
    if value is None:
        return None
    if not value:
        raise ValueError("must name a file")
    base = (info.context or {}).get("base")
    path = Path(value).expanduser()
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    return str(path)


class Clients(_Model):
    """How a request names its client: the first key present wins."""

    key: list[str] = Field(default_factory=lambda: ["ip"], min_length=1)
    trusted_proxies: list[str] = Field(default_factory=list)

    @field_validator("key")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        for item in value:
            if item != "ip" and not (item.startswith("header:") and len(item) > 7):
                raise ValueError(f"each key must be 'ip' or 'header:NAME', got {item!r}")
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"not an IP network: {item!r}") from None
        return value


class Timeout(_Model):
    """Upstream timeouts in seconds; ``total`` bounds the whole exchange."""

    connect: Seconds = 1.0
    read: Seconds = 10.0
    total: Seconds | None = None


class BreakerSettings(_Model):
    """A :class:`stormguard.CircuitBreaker` per upstream (shared through the store)."""

    failure_rate: Annotated[float, Field(gt=0, le=1)] = 0.5
    min_calls: Annotated[int, Field(ge=1)] = 20
    window: Seconds = 30.0
    open_for: Seconds = 5.0
    open_for_max: Seconds = 300.0
    half_open_probes: Annotated[int, Field(ge=1)] = 1


class BulkheadSettings(_Model):
    """At most ``limit`` requests in flight to the upstream, ``per_client`` of them each."""

    limit: Annotated[int, Field(ge=1)] = 100
    per_client: Annotated[int, Field(ge=1)] | None = None
    max_wait: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0


class RetrySettings(_Model):
    """Retries of safe failures (total ``attempts``) within a budget ``ratio``."""

    attempts: Annotated[int, Field(ge=1, le=10)] = 2
    budget: Annotated[float, Field(ge=0, le=1)] = 0.1


def _keywords(build: Any, what: str) -> Any:
    # A setting that is True (the defaults) or a mapping of `build`'s keywords,
    # checked by building it once, so that the object's own checks name the key.
    def check(value: Any) -> Any:
        if value is None or value is False:
            return None
        if value is True:
            value = {}
        if not isinstance(value, Mapping):
            raise ValueError(f"must be true or a mapping of {what} settings, got {value!r}")
        try:
            build(**value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None  # "key: what is wrong"
        except TypeError:
            unknown = sorted(str(k) for k in value if k not in _parameters(build))
            raise ValueError(f"unknown key {unknown[0]!r} ({what} settings)") from None
        return dict(value)

    return check


def _parameters(build: Any) -> set[str]:
    import inspect

    return set(inspect.signature(build).parameters)


def _adaptive(**settings: Any) -> Any:
    from ..protection._adaptive import AdaptiveLimit

    return AdaptiveLimit(**settings)


def _admission(**settings: Any) -> Any:
    from ..protection._admission_control import AdmissionControl

    return AdmissionControl(**settings)


class OverloadSettings(_Model):
    """The upstream's overload control (server/_overload.OverloadControl): a
    concurrency ``limit`` (fixed; or ``adaptive``'s), a line of at most ``max_queue``
    waiters in shedding order waiting ``max_wait`` (``standing_wait`` once the line
    has not drained for ``standing_after``), refusals 503 + ``Retry-After``."""

    limit: Annotated[int, Field(ge=1)] | None = None
    max_wait: Annotated[float, Field(ge=0, le=60, allow_inf_nan=False)] = 0.05
    max_queue: Annotated[int, Field(ge=0)] | None = None
    standing_wait: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = 0.005
    standing_after: Seconds = 0.1
    retry_after: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = 1.0
    # A request whose client hangs up while its attempt is out keeps its slot until
    # the upstream answers (as nginx's proxy_ignore_client_abort): the upstream works
    # on it anyway, and the limit learns its real latency. False: the slot is given
    # back at the hang-up and the attempt cut.
    hold_abandoned: bool = True


class EjectSettings(_Model):
    """Passive ejection: a target failing ``failures`` times in a row rests ``duration`` s."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    failures: Annotated[int, Field(ge=1)] = 3
    duration: Seconds = Field(10.0, alias="for")


class UpstreamTLS(_Model):
    """TLS to an upstream's ``https://``/``wss://`` targets: ``ca`` (PEM bundle; default
    the system CAs), a client certificate ``cert`` + ``key``, the ``server_name`` to send
    and check (default the target's host), ``verify: false`` to check nothing (``gateway
    check`` warns). Relative paths are taken from the config file's directory."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None
    verify: bool = True

    @field_validator("ca", "cert", "key")
    @classmethod
    def _path(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _resolve(value, info)

    @field_validator("server_name")
    @classmethod
    def _server_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_.\-]+", value):
            raise ValueError(f"must be a host name, got {value!r}")
        return value

    @model_validator(mode="after")
    def _pair(self) -> UpstreamTLS:
        if self.key is not None and self.cert is None:
            raise ValueError("'key' needs 'cert' (the client certificate)")
        return self


_SCHEMES = ("http", "https", "ws", "wss", "grpc")


def _target_url(value: str) -> str:
    scheme = _scheme(value)
    if not scheme:
        raise ValueError(
            f"{value!r} has no scheme; write it as http://{value} (or https://, grpc://)"
        )
    if scheme not in _SCHEMES:
        raise ValueError(f"unsupported scheme {scheme + '://'!r} in {value!r} (http, https, grpc)")
    return value


TargetURL = Annotated[str, AfterValidator(_target_url)]


class Upstream(_Model):
    """One upstream service: ``url`` or ``targets`` (round-robin), and its protection."""

    url: TargetURL | None = None
    targets: list[TargetURL] | None = None
    timeout: Timeout = Timeout()
    breaker: BreakerSettings | None = None
    bulkhead: BulkheadSettings | None = None
    retries: RetrySettings | None = None
    eject: EjectSettings = Field(default_factory=lambda: EjectSettings.model_validate({}))
    tls: UpstreamTLS | None = None
    # Overload control (docs/overload.md): an AdaptiveLimit's and an
    # AdmissionControl's keywords (or true), and the line's settings.
    adaptive: dict[str, Any] | None = None
    admission: dict[str, Any] | None = None
    overload: OverloadSettings | None = None

    @field_validator("adaptive", mode="before")
    @classmethod
    def _check_adaptive(cls, value: Any) -> Any:
        return _keywords(_adaptive, "adaptive limit")(value)

    @field_validator("admission", mode="before")
    @classmethod
    def _check_admission(cls, value: Any) -> Any:
        return _keywords(_admission, "admission control")(value)

    @model_validator(mode="after")
    def _one_address(self) -> Upstream:
        if (self.url is None) == (self.targets is None):
            raise ValueError("give exactly one of 'url' or 'targets'")
        if self.targets is not None and not self.targets:
            raise ValueError("'targets' must list at least one URL")
        schemes = {_scheme(t) for t in self.all_targets}
        if len(schemes) != 1:
            raise ValueError(f"targets must share one scheme, got {', '.join(sorted(schemes))}")
        if self.tls is not None and not schemes <= {"https", "wss"}:
            raise ValueError("'tls' applies to https:// (or wss://) targets only")
        overload = self.overload
        if overload is not None and overload.limit is not None and self.adaptive is not None:
            raise ValueError("give 'overload.limit' (fixed) or 'adaptive', not both")
        if (
            overload is not None
            and overload.limit is None
            and self.adaptive is None
            and self.admission is None
        ):
            raise ValueError("'overload' needs a 'limit', or 'adaptive' or 'admission' beside it")
        return self

    @property
    def overloaded(self) -> bool:
        """Whether the upstream has overload control (a limit, adaptive or admission)."""
        return self.overload is not None or self.adaptive is not None or self.admission is not None

    @property
    def all_targets(self) -> list[str]:
        """Every target URL (``url`` alone is one target)."""
        return [self.url] if self.url is not None else list(self.targets or ())

    @property
    def is_grpc(self) -> bool:
        """Whether the upstream speaks gRPC (served by the gRPC proxy)."""
        return _scheme(self.all_targets[0]) == "grpc"

    @property
    def secure(self) -> bool:
        """Whether the targets are reached over TLS (``https://`` / ``wss://``)."""
        return _scheme(self.all_targets[0]) in ("https", "wss")


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


class Sync(_Model):
    """Approximate mode of a shared limit: decided from this process's reservations,
    settled with the store ``every`` seconds (see docs/gateway/fleet.md for the bound)."""

    every: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)]


# The algorithms a `sync` limit may use (one-string state in Redis).
SYNC_ALGORITHMS = ("token_bucket", "gcra", "fixed_window", "sliding_window")


class Limit(_Model):
    """A named limit: an algorithm with its parameters, counted ``per`` client or globally.

    ``sync: {every: S}`` makes it approximate on a shared store (absent: exact);
    ``shadow: true`` decides and counts it but never refuses with it.
    """

    algorithm: Literal[
        "token_bucket", "gcra", "sliding_window", "sliding_log", "fixed_window", "concurrency"
    ]
    rate: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    burst: Annotated[float, Field(ge=1, allow_inf_nan=False)] | None = None
    limit: Annotated[float, Field(ge=1, allow_inf_nan=False)] | None = None
    window: Seconds | None = None
    lease: Seconds = 60.0
    per: Literal["client", "global"] = "client"
    sync: Sync | None = None
    shadow: bool = False

    @model_validator(mode="after")
    def _parameters(self) -> Limit:
        need: tuple[str, ...]
        forbid: tuple[str, ...]
        if self.algorithm in ("token_bucket", "gcra"):
            need, forbid = ("rate", "burst"), ("limit", "window")
        elif self.algorithm == "concurrency":
            need, forbid = ("limit",), ("rate", "burst", "window")
        else:
            need, forbid = ("limit", "window"), ("rate", "burst")
        missing = [name for name in need if getattr(self, name) is None]
        extra = [name for name in forbid if getattr(self, name) is not None]
        if missing:
            raise ValueError(f"{self.algorithm} needs {', '.join(missing)}")
        if extra:
            raise ValueError(f"{self.algorithm} takes no {', '.join(extra)}")
        if self.sync is not None and self.algorithm not in SYNC_ALGORITHMS:
            raise ValueError(
                f"sync (approximate mode) takes {', '.join(SYNC_ALGORITHMS)}, not {self.algorithm}"
            )
        return self


class Delay(_Model):
    """Shape instead of refusing: hold a request at most ``delay`` seconds."""

    delay: Annotated[float, Field(gt=0, le=60, allow_inf_nan=False)]


class WebSocketSettings(_Model):
    """Limits of a WebSocket route (per client, per connection)."""

    connections_per_client: Annotated[int, Field(ge=1)] | None = None
    connections_per_second: Annotated[float, Field(gt=0)] | None = None
    messages_per_second: Annotated[float, Field(gt=0)] | None = None
    burst: Annotated[float, Field(ge=1)] | None = None
    client_messages_per_second: Annotated[float, Field(gt=0)] | None = None
    max_message: Annotated[int, Field(ge=1)] = 1 << 20


class PriorityHeader(_Model):
    """The header naming a request's priority class, believed from ``trusted_proxies``
    only (``clients.trusted_proxies``) unless ``trust: always``."""

    header: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")]
    trust: Literal["proxies", "always"] = "proxies"


class Route(_Model):
    """One route: an HTTP ``path`` prefix (+ methods, + host) or a ``grpc`` service."""

    path: str | None = None
    grpc: str | None = None
    methods: list[str] | None = None
    host: str | None = None
    upstream: str
    limits: list[str] = Field(default_factory=list)
    on_limit: Literal["reject"] | Delay = "reject"
    idempotency: Literal["require", "honor", "off"] = "off"
    websocket: WebSocketSettings | None = None
    refuse_with: Literal["unavailable", "resource_exhausted"] = "unavailable"
    max_body: Annotated[int, Field(ge=0)] | None = None
    # The route's priority class under overload (the top-level `priority` header,
    # when believed, names another).
    priority: Literal["critical", "default", "sheddable"] = "default"

    @field_validator("on_limit", mode="before")
    @classmethod
    def _on_limit(cls, value: Any) -> Any:
        # One message for each mistake, not one per branch of the union.
        usage = "'reject' or {delay: SECONDS} (0 < SECONDS <= 60)"
        if isinstance(value, Mapping):
            unknown = sorted(str(k) for k in value if k != "delay")
            if unknown:
                raise ValueError(f"unknown key {unknown[0]!r}; on_limit is {usage}")
            delay = value.get("delay")
            if isinstance(delay, bool) or not isinstance(delay, int | float):
                raise ValueError(f"delay must be a number of seconds, got {delay!r}")
            if not 0 < delay <= 60:
                raise ValueError(f"delay must be more than 0 and at most 60 seconds, got {delay!r}")
            return value
        if value != "reject" and not isinstance(value, Delay):
            raise ValueError(f"must be {usage}, got {value!r}")
        return value

    @field_validator("methods")
    @classmethod
    def _methods(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            value = [m.upper() for m in value]
            for method in value:
                if not method.isalpha():
                    raise ValueError(f"not an HTTP method: {method!r}")
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"must start with '/', got {value!r}")
        return value

    @model_validator(mode="after")
    def _kind(self) -> Route:
        if (self.path is None) == (self.grpc is None):
            raise ValueError("give exactly one of 'path' (HTTP/WebSocket) or 'grpc'")
        if self.grpc is not None and self.websocket is not None:
            raise ValueError("a gRPC route takes no 'websocket'")
        return self

    @property
    def name(self) -> str:
        """The route's name in /status and metrics: its path or gRPC service."""
        return self.path if self.path is not None else str(self.grpc)


class GatewayConfig(_Model):
    """The whole gateway configuration (see the README's "Gateway" section)."""

    listen: Listen = Listen()
    store: str = "memory"
    on_store_error: Literal["open", "closed", "local"] = "local"
    instances: Annotated[int, Field(ge=1)] | None = None
    clients: Clients = Clients()
    upstreams: dict[str, Upstream] = Field(default_factory=dict)
    limits: dict[str, Limit] = Field(default_factory=dict)
    routes: list[Route] = Field(default_factory=list)
    max_body: Annotated[int, Field(ge=0)] = 10 << 20
    header_timeout: Seconds = 10.0
    # Request head caps, enforced by the listener's parser before any stage runs:
    # over them 431 (414 for the target) and the connection closed.
    max_header_bytes: Annotated[int, Field(ge=256)] = 32768
    max_headers: Annotated[int, Field(ge=1)] = 100
    max_target_bytes: Annotated[int, Field(ge=16)] = 8192
    body_timeout: Seconds = 30.0
    drain: Annotated[float, Field(ge=0)] = 10.0
    access_log: bool = True
    shadow: bool = False
    store_max_keys: Annotated[int, Field(ge=1)] | None = None
    # Where a request's priority class comes from besides its route:
    # {header: NAME, trust: proxies | always} (server/_priority.py).
    priority: PriorityHeader | None = None

    @field_validator("store")
    @classmethod
    def _store(cls, value: str) -> str:
        scheme = value.partition("://")[0].lower()
        if value != "memory" and scheme not in STORE_SCHEMES:
            raise ValueError(
                f"must be 'memory' or a {', '.join(s + '://' for s in STORE_SCHEMES[1:])} URL, "
                f"got {value!r}"
            )
        if scheme in ("redis+sentinel", "rediss+sentinel"):
            from ..stores._sentinel import parse_sentinel_url

            try:
                parse_sentinel_url(value)
            except ConfigError as exc:
                raise ValueError(str(exc).removeprefix("url: ")) from None
        return value

    @property
    def max_keys(self) -> int:
        """The memory store's bound: ``store_max_keys``, else room for a million
        clients on every per-client limit (plus the global ones)."""
        if self.store_max_keys is not None:
            return self.store_max_keys
        per_client = sum(1 for limit in self.limits.values() if limit.per == "client")
        return max(1, per_client) * 1_000_000 + len(self.limits)

    @property
    def shared_store(self) -> bool:
        """Whether state lives in a store other processes can see (Redis)."""
        return self.store != "memory" and not self.store.startswith("memory:")


# --- references between sections ---------------------------------------------------


def _references(data: Any) -> list[tuple[FieldPath, str]]:
    # Checked on the raw document so that they are reported alongside field errors.
    problems: list[tuple[FieldPath, str]] = []
    if not isinstance(data, Mapping):
        return problems
    upstreams: Mapping[Any, Any] = _get(data, "upstreams", Mapping, {})
    limits: Mapping[Any, Any] = _get(data, "limits", Mapping, {})
    routes: list[Any] = _get(data, "routes", list, [])
    seen: dict[str, int] = {}
    for i, route in enumerate(routes):
        if not isinstance(route, Mapping):
            continue
        name = route.get("upstream")
        if isinstance(name, str) and name not in upstreams:
            known = ", ".join(sorted(map(str, upstreams))) or "none defined"
            problems.append((("routes", i, "upstream"), f"unknown upstream {name!r} ({known})"))
        target = upstreams.get(name) if isinstance(name, str) else None
        if isinstance(target, Mapping):
            url = target.get("url") or (target.get("targets") or [""])[0]
            grpc_up = isinstance(url, str) and url.startswith("grpc://")
            if "grpc" in route and not grpc_up:
                problems.append((("routes", i, "upstream"), f"{name!r} is not a grpc:// upstream"))
            if "path" in route and grpc_up:
                problems.append((("routes", i, "upstream"), f"{name!r} is a gRPC upstream"))
        names = route.get("limits")
        if isinstance(names, list):
            for j, limit in enumerate(names):
                if isinstance(limit, str) and limit not in limits:
                    known = ", ".join(sorted(map(str, limits))) or "none defined"
                    problems.append(
                        (("routes", i, "limits", j), f"unknown limit {limit!r} ({known})")
                    )
        key = str(route.get("path") or route.get("grpc")) + "|" + str(route.get("host"))
        methods = route.get("methods")
        key += "|" + ",".join(sorted(map(str, methods))) if isinstance(methods, list) else "|*"
        if key in seen:
            problems.append(((("routes", i)), f"same match as routes[{seen[key]}]; never reached"))
        seen.setdefault(key, i)
    return problems


def _get(data: Mapping[Any, Any], key: str, kind: Any, default: Any) -> Any:
    value = data.get(key)
    return value if isinstance(value, kind) else default


# --- sources: text -> data + positions -----------------------------------------------


def _yaml_source(text: str) -> tuple[Any, dict[FieldPath, Position]]:
    import yaml

    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is None:
        return {}, {}
    positions: dict[FieldPath, Position] = {}
    constructor = yaml.constructor.SafeConstructor()

    def walk(n: Any, path: FieldPath) -> Any:
        positions.setdefault(path, (n.start_mark.line + 1, n.start_mark.column + 1))
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in n.value:
                key = constructor.construct_object(key_node, deep=True)
                child = (*path, str(key))
                if key in out:
                    raise _Duplicate(
                        child, key_node.start_mark.line + 1, key_node.start_mark.column + 1
                    )
                # An unknown or missing key points at the key itself.
                positions[(*child, "<key>")] = (
                    key_node.start_mark.line + 1,
                    key_node.start_mark.column + 1,
                )
                out[key] = walk(value_node, child)
            return out
        if isinstance(n, yaml.SequenceNode):
            return [walk(item, (*path, i)) for i, item in enumerate(n.value)]
        return constructor.construct_object(n, deep=True)

    return walk(node, ()), positions


class _Duplicate(Exception):
    def __init__(self, path: FieldPath, line: int, col: int) -> None:
        super().__init__("duplicate key")
        self.path, self.line, self.col = path, line, col


def _toml_source(text: str) -> tuple[Any, dict[FieldPath, Position]]:
    import tomllib

    from ..mock._sources import _toml_lines  # one TOML line finder for the project

    data = tomllib.loads(text)
    return data, {path: (line, 1) for path, line in _toml_lines(text).items()}


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(
    data: Any, path: FieldPath, env: Mapping[str, str], errors: list[tuple[FieldPath, str]]
) -> Any:
    if isinstance(data, dict):
        return {k: _expand(v, (*path, str(k)), env, errors) for k, v in data.items()}
    if isinstance(data, list):
        return [_expand(v, (*path, i), env, errors) for i, v in enumerate(data)]
    if isinstance(data, str) and "${" in data:

        def one(match: re.Match[str]) -> str:
            name, default = match[1], match[2]
            if name in env:
                return env[name]
            if default is not None:
                return default
            errors.append(
                (path, f"environment variable {name} is not set (use ${{{name}:-default}})")
            )
            return ""

        return _ENV.sub(one, data)
    return data


def dotted(path: FieldPath) -> str:
    """``("routes", 0, "upstream")`` -> ``"routes.0.upstream"``."""
    return ".".join(str(part) for part in path) or "<top>"


def parse_config(
    text: str,
    source: str = "<config>",
    *,
    fmt: str | None = None,
    env: Mapping[str, str] | None = None,
    base: str | Path | None = None,
) -> GatewayConfig:
    """Validate a configuration document (YAML by default; ``fmt="toml"`` for TOML).

    Relative TLS file names are taken from ``base`` (load_config: the file's
    directory; else the working directory). The TLS files are loaded here, so a
    missing file, a key that does not match its certificate or an unreadable CA is
    reported at its field.

    Raises :class:`GatewayConfigError` listing every mistake as
    ``source:line:col: dotted.path: message``.
    """
    fmt = fmt or ("toml" if source.endswith(".toml") else "yaml")
    try:
        data, positions = _toml_source(text) if fmt == "toml" else _yaml_source(text)
    except _Duplicate as dup:
        raise GatewayConfigError(
            [f"{source}:{dup.line}:{dup.col}: {dotted(dup.path)}: duplicate key"]
        ) from None
    except Exception as exc:  # yaml.MarkedYAMLError / tomllib.TOMLDecodeError
        mark = getattr(exc, "problem_mark", None)
        where = f"{mark.line + 1}:{mark.column + 1}" if mark is not None else _toml_where(exc)
        problem = getattr(exc, "problem", None) or str(exc)
        raise GatewayConfigError(
            [f"{source}:{where}: <top>: invalid {fmt.upper()}: {problem}"]
        ) from None
    problems: list[tuple[FieldPath, str]] = []
    data = _expand(data, (), os.environ if env is None else env, problems)
    config: GatewayConfig | None = None
    if not isinstance(data, dict):
        problems.append(((), f"the document must be a mapping, got {type(data).__name__}"))
    else:
        try:
            config = GatewayConfig.model_validate(data, context={"base": base})
        except ValidationError as exc:
            for error in exc.errors():
                loc = _model_path(error["loc"])
                message = error["msg"]
                if error["type"] == "extra_forbidden":
                    message = "unknown key"
                problems.append((loc, message.removeprefix("Value error, ")))
        problems.extend(_references(data))
        if config is not None:
            problems.extend(_listener_problems(config))
            problems.extend(_tls_problems(config))
    if problems:
        raise GatewayConfigError(
            [
                f"{source}:{_where(positions, path)}: {dotted(path)}: {msg}"
                for path, msg in _sorted(problems, positions)
            ]
        )
    assert config is not None
    return config


def _model_path(loc: tuple[Any, ...]) -> FieldPath:
    # pydantic adds union-branch names ("literal['reject']", "Delay") to locations.
    out: list[str | int] = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or part[:1].isupper()):
            continue
        out.append(part)
    return tuple(out)


def _where(positions: Mapping[FieldPath, Position], path: FieldPath) -> str:
    if (*path, "<key>") in positions:
        line, col = positions[(*path, "<key>")]
        return f"{line}:{col}"
    probe = path
    while probe and probe not in positions:
        probe = probe[:-1]
    line, col = positions.get(probe, (1, 1))
    return f"{line}:{col}"


def _sorted(
    problems: list[tuple[FieldPath, str]], positions: Mapping[FieldPath, Position]
) -> list[tuple[FieldPath, str]]:
    def key(item: tuple[FieldPath, str]) -> tuple[int, int]:
        line, _, col = _where(positions, item[0]).partition(":")
        return int(line), int(col)

    unique = list(dict.fromkeys(problems))
    return sorted(unique, key=key)


def _toml_where(exc: Exception) -> str:
    match = re.search(r"line (\d+), column (\d+)", str(exc))
    return f"{match[1]}:{match[2]}" if match else "1:1"


def load_config(path: str | Path, *, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read and validate a configuration file (``.toml`` is TOML, anything else YAML)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GatewayConfigError([f"{path}:1:1: <top>: cannot read: {exc.strerror}"]) from None
    return parse_config(text, str(path), env=env, base=path.parent)


def _listener_problems(config: GatewayConfig) -> list[tuple[FieldPath, str]]:
    # Two listeners on one address: the second bind would fail at start.
    problems: list[tuple[FieldPath, str]] = []
    seen: list[tuple[str, int, str]] = []
    for name in ("http", "grpc", "admin"):
        address = getattr(config.listen, name)
        if address is None:
            continue
        host, port = split_hostport(address)
        for other_host, other_port, other in seen:
            if port == other_port and (host == other_host or _ANY & {host, other_host}):
                clash = (
                    f"is listen.{other}'s address too"
                    if (host, port) == (other_host, other_port)
                    else f"overlaps listen.{other} ({getattr(config.listen, other)})"
                )
                problems.append(
                    (("listen", name), f"{address} {clash}; give each listener its own port")
                )
                break
        seen.append((host, port, name))
    return problems


def _tls_problems(config: GatewayConfig) -> list[tuple[FieldPath, str]]:
    # Build every TLS context once, so that what would fail at start fails here.
    from ._tls import TLSSettingError, build_client_context, build_server_context

    problems: list[tuple[FieldPath, str]] = []
    tls = config.listen.http_tls
    if tls is not None:
        try:
            build_server_context(tls)
        except TLSSettingError as exc:
            problems.append((("listen", "http", "tls", exc.field), exc.message))
    for name, upstream in config.upstreams.items():
        if upstream.tls is not None:
            try:
                build_client_context(upstream.tls)
            except TLSSettingError as exc:
                problems.append((("upstreams", name, "tls", exc.field), exc.message))
    return problems


def config_warnings(config: GatewayConfig) -> list[str]:
    """What is valid but unsafe (``gateway check`` prints these): an upstream whose
    TLS certificate is not verified; a priority header believed from anyone."""
    warnings = [
        f"upstreams.{name}.tls.verify: false: the upstream's certificate and name are "
        "not checked (anyone on the path can answer for it)"
        for name, upstream in config.upstreams.items()
        if upstream.tls is not None and not upstream.tls.verify
    ]
    priority = config.priority
    if priority is not None and priority.trust == "always":
        warnings.append(
            f"priority.trust: always: any client can send {priority.header}: critical "
            "and be served before everyone else under overload (trust: proxies believes "
            "clients.trusted_proxies only)"
        )
    if priority is not None and not any(u.overloaded for u in config.upstreams.values()):
        warnings.append(
            "priority: no upstream has overload control (adaptive, admission or "
            "overload.limit), so the class is never used"
        )
    return warnings


def check_workers(config: GatewayConfig, workers: int, source: str = "<config>") -> None:
    """Refuse ``workers > 1`` with a process-local store (limits would not be shared)."""
    if workers > 1 and not config.shared_store:
        raise GatewayConfigError(
            [
                f"{source}:1:1: store: 'memory' cannot be shared by {workers} workers; "
                "use a redis:// store or --workers 1"
            ]
        )
