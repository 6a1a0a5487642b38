# What the gateway counts, as Prometheus metrics -- and /status built from them, so
# that both say the same thing and both stay right with --workers N: each worker
# writes prometheus-client's multiprocess files (PROMETHEUS_MULTIPROC_DIR, set by
# the supervisor before any worker starts) and the admin listener in the supervisor
# reads them all; with one process the in-process registry is read directly.
#
# Labels: route (path or gRPC service), outcome (`allowed` or a pinned refusal
# reason: limited:<limit>, breaker_open, bulkhead_full, idempotency_conflict,
# too_large, upstream_timeout; plus upstream_error and not_found), upstream, and
# client -- always the 8-hex-digit SHA-256 prefix of the key, never the key.
from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

__all__ = ["BREAKER_CODES", "GatewayMetrics", "StatusBuilder", "multiprocess_dir"]

BREAKER_CODES = {"closed": 0.0, "half_open": 1.0, "open": 2.0}
_STATES = {v: k for k, v in BREAKER_CODES.items()}
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


def multiprocess_dir() -> str | None:
    """The multiprocess directory when running several workers (else None)."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class GatewayMetrics:
    """The gateway's metrics in one registry; children cached per label set."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "stormguard_gateway_requests",
            "Requests by route and outcome (allowed or the refusal reason).",
            ("route", "outcome"),
            registry=r,
        )
        self.refused_clients = Counter(
            "stormguard_gateway_client_refusals",
            "Refusals by client (SHA-256 prefix of the key) and reason.",
            ("client", "reason"),
            registry=r,
        )
        self.in_flight = Gauge(
            "stormguard_gateway_upstream_in_flight",
            "Requests holding an upstream now.",
            ("upstream",),
            registry=r,
            multiprocess_mode="livesum",
        )
        self.bulkhead_limit = Gauge(
            "stormguard_gateway_bulkhead_limit",
            "Bulkhead limit of an upstream (per process).",
            ("upstream",),
            registry=r,
            multiprocess_mode="livesum",
        )
        self.breaker = Gauge(
            "stormguard_gateway_breaker_state",
            "Breaker state: 0 closed, 1 half-open, 2 open.",
            ("upstream",),
            registry=r,
            multiprocess_mode="livemax",
        )
        self.latency = Histogram(
            "stormguard_gateway_upstream_latency_seconds",
            "Time to the upstream's response headers.",
            ("upstream",),
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.websockets = Gauge(
            "stormguard_gateway_websocket_connections",
            "Open WebSocket connections by route.",
            ("route",),
            registry=r,
            multiprocess_mode="livesum",
        )
        self.ws_messages = Counter(
            "stormguard_gateway_websocket_messages",
            "WebSocket messages passed by route and direction.",
            ("route", "direction"),
            registry=r,
        )
        self.store_down = Gauge(
            "stormguard_gateway_store_unavailable",
            "1 while the shared store is unreachable (decisions follow on_store_error).",
            registry=r,
            multiprocess_mode="livemax",
        )
        self._outcomes: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}

    def count(self, route: str, outcome: str) -> None:
        """One request of ``route`` ended with ``outcome``."""
        child = self._outcomes.get((route, outcome))
        if child is None:
            child = self._outcomes[(route, outcome)] = self.requests.labels(route, outcome)
        child.inc()

    def observe_latency(self, upstream: str, seconds: float) -> None:
        """Time to an upstream's response headers."""
        child = self._latency.get(upstream)
        if child is None:
            child = self._latency[upstream] = self.latency.labels(upstream)
        child.observe(seconds)


_RATE_WINDOW = 10.0  # seconds of /status history behind requests_per_second


def _samples(registry: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for family in registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    # Linear interpolation inside the bucket holding the q-th observation.
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            span = count - prev_count
            share = (rank - prev_count) / span if span else 0.0
            return prev_bound + (bound - prev_bound) * share
        prev_bound, prev_count = bound, count
    return prev_bound


class StatusBuilder:
    """Builds /status and /metrics from one registry (the worker's or the merged one)."""

    def __init__(
        self, metrics: GatewayMetrics | None, upstreams: dict[str, dict[str, Any]]
    ) -> None:
        self._metrics = metrics
        self.upstreams = upstreams  # name -> static facts (targets, limits) from the config
        self._history: deque[tuple[float, float]] = deque()

    def registry(self) -> Any:
        """The registry to read: merged multiprocess files, or the process's own."""
        directory = multiprocess_dir()
        if directory is not None:
            merged = CollectorRegistry()
            MultiProcessCollector(merged, path=directory)  # type: ignore[no-untyped-call]
            return merged
        assert self._metrics is not None
        return self._metrics.registry

    def metrics_text(self) -> bytes:
        """The Prometheus exposition text."""
        return bytes(generate_latest(self.registry()))

    def status(self) -> dict[str, Any]:
        """The /status document (see the design document, "Gateway")."""
        samples = _samples(self.registry())
        upstreams: dict[str, dict[str, Any]] = {
            name: {"breaker": "closed", "in_flight": 0, **facts}
            for name, facts in self.upstreams.items()
        }
        for s in samples.get("stormguard_gateway_breaker_state", []):
            if s.labels.get("upstream") in upstreams:
                upstreams[s.labels["upstream"]]["breaker"] = _STATES.get(s.value, "closed")
        for s in samples.get("stormguard_gateway_upstream_in_flight", []):
            if s.labels.get("upstream") in upstreams:
                upstreams[s.labels["upstream"]]["in_flight"] = int(s.value)
        buckets: dict[str, list[tuple[float, float]]] = {}
        for s in samples.get("stormguard_gateway_upstream_latency_seconds_bucket", []):
            buckets.setdefault(s.labels["upstream"], []).append((float(s.labels["le"]), s.value))
        for name, rows in buckets.items():
            if name in upstreams:
                rows.sort()
                p50, p99 = _quantile(rows, 0.5), _quantile(rows, 0.99)
                upstreams[name]["latency_ms"] = {
                    "p50": None if p50 is None else round(p50 * 1000, 3),
                    "p99": None if p99 is None else round(p99 * 1000, 3),
                }
        for s in samples.get("stormguard_gateway_upstream_latency_seconds_count", []):
            if s.labels.get("upstream") in upstreams:  # answers the upstream gave
                row = upstreams[s.labels["upstream"]]
                row["requests"] = row.get("requests", 0) + int(s.value)
        routes: dict[str, dict[str, int]] = {}
        total = 0.0
        for s in samples.get("stormguard_gateway_requests_total", []):
            row = routes.setdefault(s.labels["route"], {"allowed": 0})
            row[s.labels["outcome"]] = row.get(s.labels["outcome"], 0) + int(s.value)
            total += s.value
        clients: dict[tuple[str, str], int] = {}
        for s in samples.get("stormguard_gateway_client_refusals_total", []):
            key = (s.labels["client"], s.labels["reason"])
            clients[key] = clients.get(key, 0) + int(s.value)
        top = sorted(clients.items(), key=lambda kv: -kv[1])[:10]
        websockets = {
            s.labels["route"]: int(s.value)
            for s in samples.get("stormguard_gateway_websocket_connections", [])
        }
        ws_messages: dict[str, dict[str, int]] = {}
        for s in samples.get("stormguard_gateway_websocket_messages_total", []):
            row = ws_messages.setdefault(s.labels["route"], {"in": 0, "out": 0})
            row[s.labels["direction"]] = row.get(s.labels["direction"], 0) + int(s.value)
        store_down = any(s.value for s in samples.get("stormguard_gateway_store_unavailable", []))
        now = time.monotonic()
        history = self._history
        history.append((now, total))
        while len(history) > 2 and now - history[1][0] >= _RATE_WINDOW:
            history.popleft()
        first_t, first_total = history[0]
        rate = (total - first_total) / (now - first_t) if now - first_t > 0 else 0.0
        return {
            "upstreams": upstreams,
            "routes": routes,
            "requests_total": int(total),
            "requests_per_second": round(rate, 3),
            "top_limited_clients": [
                {"client": client, "reason": reason, "refusals": n} for (client, reason), n in top
            ],
            "websockets": websockets,
            "websocket_messages": ws_messages,
            "store": "unavailable" if store_down else "ok",
        }
