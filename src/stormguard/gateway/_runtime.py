# A validated configuration turned into live objects: the store, one UpstreamPool
# per upstream, and per route its match, its limits (a server-side RuleSet: every
# limit of a request in one store call) and its policies. A reload builds a new
# Runtime and swaps it in one assignment; requests in flight finish on the one
# they started with. Upstreams whose settings did not change are carried over, so
# a reload keeps their breaker state, bulkhead slots and connection pools.
#
# Limits: `sync` makes a limit approximate on a shared store (server/_decide.py),
# `shadow` (per limit, or top-level for all) decides and counts it without refusing
# -- the refusals it would have made go to the metrics and, through the request's
# scope (SHADOW_KEY), to its access log line. Two routes naming one limit share it:
# the store keys are the limit's name and the client, whatever the route.
# The memory store is bounded by `store_max_keys`; the keys it forgets before their
# limit is full again are counted (metrics) and logged at most once a minute.
#
# Time: one clock (`clock=`, the project's Clock protocol; the system clock unless a
# test passes a FakeClock) is handed to everything here that decides by time -- the
# memory store's limit windows, every upstream's breaker, bulkhead, retry budget and
# ejections, the shaping waits of the proxy leg (`Runtime.clock`) -- so a scenario
# that spans seconds (an open breaker's cooldown, a window refilling, a shaping
# delay) runs in virtual time. A shared store (Redis) decides on its own clock.
# Deadlines on real sockets (connect/read timeouts, the listener's head and
# keep-alive deadlines) stay on the event loop's clock.
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .._clock import SYSTEM_CLOCK, Clock
from ..core._limiters import (
    GCRA,
    Algorithm,
    Concurrency,
    FixedWindow,
    SlidingWindowCounter,
    SlidingWindowLog,
    TokenBucket,
)
from ..protection._permit import BreakerEvent
from ..server._decide import RuleSet
from ..server._priority import Classify, compile_priority
from ..server._rules import ClientAddress, Rule
from ..stores import MemoryStore, from_url
from ._accesslog import AccessLog
from ._clients import ClientIdentity
from ._config import GatewayConfig, Limit, Route, WebSocketSettings
from ._metrics import BREAKER_CODES, GatewayMetrics
from ._upstream import UpstreamPool

__all__ = ["CLIENT_KEY", "SHADOW_KEY", "CompiledRoute", "Runtime", "algorithm_of", "client_of"]

log = logging.getLogger("stormguard.gateway")
CLIENT_KEY = "stormguard.client"  # scope entry holding the request's client key
SHADOW_KEY = "stormguard.shadow"  # scope entry: the shadow refusals of the request
_MAX_MATCHED = 1024
_EVICTION_LOG_EVERY = 60.0  # seconds between two eviction warnings, at least


def algorithm_of(limit: Limit) -> Algorithm:
    """The limiter algorithm object of a configured limit."""
    a = limit.algorithm
    if a == "token_bucket":
        return TokenBucket(rate=limit.rate, burst=limit.burst)  # type: ignore[arg-type]
    if a == "gcra":
        return GCRA(rate=limit.rate, burst=limit.burst)  # type: ignore[arg-type]
    if a == "concurrency":
        return Concurrency(limit=limit.limit, lease=limit.lease)  # type: ignore[arg-type]
    window: Any = {
        "sliding_window": SlidingWindowCounter,
        "sliding_log": SlidingWindowLog,
        "fixed_window": FixedWindow,
    }[a]
    return window(limit=limit.limit, window=limit.window)  # type: ignore[no-any-return]


def client_of(scope: Any) -> str | None:
    """The client key the proxy leg stored in the scope."""
    return scope.get(CLIENT_KEY)  # type: ignore[no-any-return]


@dataclass(slots=True)
class CompiledRoute:
    """One HTTP/WebSocket route ready to serve."""

    config: Route
    name: str
    prefix: str
    methods: frozenset[str] | None
    host: str | None
    upstream: UpstreamPool
    rules: RuleSet | None
    delay: float | None
    max_body: int
    websocket: WebSocketSettings | None
    leased: dict[str, Any]  # limit name -> limiter, for Concurrency limits
    classify: Classify | None = None  # the request's priority class (overload control)
    idempotency: Any = None  # the IdempotencyMiddleware of the route, built on first use
    stages: tuple[Any, ...] = ()  # the request chain's stages for it (chain.stages_of), once
    direct: tuple[Any, ...] = ()  # those of them a direct exchange runs (chain.stages_of)
    # RuleSet.client_hitter(client_of): the limits of a request by its client key, in
    # one call, for a client not kept per connection (None: decided the general way)
    client_limits: Any = None

    def matches(self, path: str, method: str, host: str | None) -> bool:
        """Prefix (segment-aware), methods and host match."""
        prefix = self.prefix
        if path != prefix and not path.startswith(prefix if prefix.endswith("/") else prefix + "/"):
            return False
        if self.methods is not None and method not in self.methods:
            return False
        return self.host is None or (host is not None and host == self.host)


class Runtime:
    """Everything a configuration builds; immutable once built (reload replaces it).

    ``clock`` (default: the system clock) is the one clock of every time-dependent
    part; a reload's runtime takes the clock of the one it replaces.
    """

    def __init__(
        self,
        config: GatewayConfig,
        metrics: GatewayMetrics,
        *,
        workers: int = 1,
        previous: Runtime | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        if clock is None:
            clock = previous.clock if previous is not None else SYSTEM_CLOCK
        self.clock: Clock = clock
        given = None if clock is SYSTEM_CLOCK else clock  # (the parts' own default)
        instances = config.instances or workers
        if previous is not None and previous.config.store == config.store:
            self.store: Any = previous.store
            if isinstance(self.store, MemoryStore):
                self.store.max_keys = config.max_keys
        elif config.shared_store:
            self.store = from_url(config.store, asyncio=True, instances=instances)
        else:
            self.store = MemoryStore(max_keys=config.max_keys, clock=given)
        # (evictions counted so far, the last warning's time): carried over a reload
        self._evictions: list[float] = [0, -1e9] if previous is None else previous._evictions
        # the access log outlives reloads (its pending lines and writer thread)
        self.access: AccessLog = (
            previous.access
            if previous is not None
            else AccessLog(
                logging.getLogger("stormguard.gateway.access"),
                on_drop=metrics.access_log_dropped.inc,
            )
        )
        shared = self.store if config.shared_store else None
        self.identity = ClientIdentity(config.clients.key, config.clients.trusted_proxies)
        self.upstreams: dict[str, UpstreamPool] = {}
        for name, settings in config.upstreams.items():
            old = previous.upstreams.get(name) if previous is not None else None
            if (
                old is not None
                and old.settings == settings
                and previous is not None
                and (previous.config.store == config.store)
            ):
                self.upstreams[name] = old
            else:
                self.upstreams[name] = UpstreamPool(
                    name,
                    settings,
                    store=shared,
                    on_breaker_event=self._breaker_event,
                    instances=instances,
                    clock=given,
                )
            h = settings.bulkhead
            metrics.bulkhead_limit.labels(name).set(h.limit if h else 0)
        self.retired = [
            pool
            for name, pool in (previous.upstreams.items() if previous is not None else ())
            if self.upstreams.get(name) is not pool
        ]
        routes = [
            self._compile(route, config, instances)
            for route in config.routes
            if route.path is not None
        ]
        # Longest prefix first; equal prefixes keep the file's order.
        self.routes = sorted(routes, key=lambda r: -len(r.prefix))
        self.grpc_routes = [route for route in config.routes if route.grpc is not None]
        # (path, method, host) -> the route serving it: a few arrive again and again.
        # Bounded: cleared when full; a reload builds a new Runtime (and table).
        self._matched: dict[tuple[str, str, str | None], CompiledRoute | None] = {}

    def _compile(self, route: Route, config: GatewayConfig, instances: int) -> CompiledRoute:
        rules = []
        for name in route.limits:
            limit = config.limits[name]
            key: Any = "global" if limit.per == "global" else client_of
            sync = limit.sync.every if limit.sync is not None and config.shared_store else None
            rules.append(
                Rule(algorithm_of(limit), key=key, name=name, shadow=limit.shadow, sync=sync)
            )
        ruleset = None
        leased: dict[str, Any] = {}
        if rules:
            ruleset = RuleSet(
                rules,
                store=self.store,
                on_store_error=config.on_store_error,
                instances=instances,
                shadow=config.shadow,
                on_shadow=self._shadow_hook(route.name),
            )
            leased = {
                rule.name: limiter
                for rule, _, limiter in ruleset._entries
                if isinstance(rule.algorithm, Concurrency)
            }
        on_limit = route.on_limit
        pool = self.upstreams[route.upstream]
        classify = None
        if pool.overload is not None:  # the priority and overload stage runs for it
            header = config.priority
            classify = compile_priority(
                None if header is None else header.model_dump(),
                address=ClientAddress.of(config.clients.trusted_proxies),
                default=route.priority,
            )
        return CompiledRoute(
            config=route,
            name=route.name,
            prefix=str(route.path),
            methods=frozenset(route.methods) if route.methods else None,
            host=route.host.lower() if route.host else None,
            upstream=self.upstreams[route.upstream],
            rules=ruleset,
            delay=None if isinstance(on_limit, str) else on_limit.delay,
            max_body=route.max_body if route.max_body is not None else config.max_body,
            websocket=route.websocket,
            leased=leased,
            classify=classify,
            client_limits=None if ruleset is None else ruleset.client_hitter(client_of),
        )

    def _shadow_hook(self, route: str) -> Any:
        metrics = self.metrics

        def would_refuse(view: Any, refused: tuple[Any, ...]) -> None:
            reasons = tuple(f"shadow:{decision.name}" for decision in refused)
            metrics.shadow(route, reasons)
            scope = getattr(view, "raw", None)
            if isinstance(scope, dict):
                scope[SHADOW_KEY] = reasons

        return would_refuse

    def _breaker_event(self, event: BreakerEvent) -> None:
        name = (event.name or "").removeprefix("gateway:")
        if event.kind == "state_change":
            self.metrics.breaker.labels(name).set(BREAKER_CODES.get(event.new_state, 0.0))
            log.warning("upstream %s: breaker %s -> %s", name, event.old_state, event.new_state)

    def match(self, path: str, method: str, host: str | None) -> CompiledRoute | None:
        """The route serving a request, or None."""
        key = (path, method, host)
        try:
            return self._matched[key]
        except KeyError:
            pass
        found = None
        for route in self.routes:
            if route.matches(path, method, host):
                found = route
                break
        matched = self._matched
        if len(matched) >= _MAX_MATCHED:
            matched.clear()
        matched[key] = found
        return found

    async def refresh_gauges(self) -> None:
        """Publish breaker states and in-flight counts (the breaker may change lazily)."""
        m = self.metrics
        for name, pool in self.upstreams.items():
            m.breaker.labels(name).set(BREAKER_CODES.get(await pool.breaker_state(), 0.0))
            m.in_flight.labels(name).set(pool.in_flight)
            control = pool.overload
            if control is not None:
                m.overload_limit.labels(name).set(control.limit)
                m.overload_waiting.labels(name).set(control.waiting)
        if self.routes and self.routes[0].rules is not None:
            m.store_down.set(1.0 if self.routes[0].rules.store_down else 0.0)
        self._count_evictions()

    def _count_evictions(self) -> None:
        # The memory store's live evictions since the last look: counted, and logged
        # at most once a minute (a busy bound would otherwise flood the log).
        store = self.store
        if not isinstance(store, MemoryStore):
            return
        seen, logged_at = self._evictions
        total = store.evictions
        if total <= seen:
            return
        self.metrics.store_evictions.inc(total - seen)
        self._evictions[0] = total
        now = self.clock.monotonic()
        if now - logged_at >= _EVICTION_LOG_EVERY:
            self._evictions[1] = now
            log.warning(
                "memory store full (store_max_keys=%d): %d keys forgotten before their limit "
                "was full again (those clients start afresh); raise store_max_keys or use a "
                "shared store",
                store.max_keys,
                total,
            )

    async def close_retired(self) -> None:
        """Close the connection pools of upstreams a reload dropped or replaced."""
        for pool in self.retired:
            await pool.close()
        self.retired = []

    async def aclose(self) -> None:
        """Write the pending access lines; close every connection pool and the store's
        connections."""
        self.access.close()
        for pool in self.upstreams.values():
            await pool.close()
        closer = getattr(self.store, "aclose", None)
        if closer is not None:
            await closer()
