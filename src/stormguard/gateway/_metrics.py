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

import math
import os
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from ._urls import shown_url

__all__ = ["BREAKER_CODES", "GatewayMetrics", "StatusBuilder", "multiprocess_dir"]

BREAKER_CODES = {"closed": 0.0, "half_open": 1.0, "open": 2.0}
_STATES = {v: k for k, v in BREAKER_CODES.items()}
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


def multiprocess_dir() -> str | None:
    """The multiprocess directory when running several workers (else None)."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


# attribute -> (metric name after "stormguard_gateway_", help, labels, multiprocess mode)
_COUNTERS = {
    "requests": (
        "requests",
        "Requests by route and outcome (allowed or the refusal reason).",
        ("route", "outcome"),
    ),
    "refused_clients": (
        "client_refusals",
        "Refusals by client (SHA-256 prefix of the key) and reason.",
        ("client", "reason"),
    ),
    "ws_messages": (
        "websocket_messages",
        "WebSocket messages passed by route and direction.",
        ("route", "direction"),
    ),
    # fleet (issue 25): shadow limits and the memory store's bound.
    "shadow_refusals": (
        "shadow_refusals",
        "Requests a shadow limit would have refused (let through), by route and reason "
        "(shadow:<limit>).",
        ("route", "reason"),
    ),
    "store_evictions": (
        "store_evictions",
        "Keys whose limit was not yet back to full that the memory store forgot to stay "
        "within store_max_keys (their clients start afresh).",
        (),
    ),
}
_GAUGES = {
    "in_flight": (
        "upstream_in_flight",
        "Requests holding an upstream now.",
        ("upstream",),
        "livesum",
    ),
    "bulkhead_limit": (
        "bulkhead_limit",
        "Bulkhead limit of an upstream (per process).",
        ("upstream",),
        "livesum",
    ),
    "breaker": (
        "breaker_state",
        "Breaker state: 0 closed, 1 half-open, 2 open.",
        ("upstream",),
        "livemax",
    ),
    "websockets": (
        "websocket_connections",
        "Open WebSocket connections by route.",
        ("route",),
        "livesum",
    ),
    "store_down": (
        "store_unavailable",
        "1 while the shared store is unreachable (decisions follow on_store_error).",
        (),
        "livemax",
    ),
}


class GatewayMetrics:
    """The gateway's metrics in one registry; children cached per label set."""

    requests: Counter
    refused_clients: Counter
    ws_messages: Counter
    shadow_refusals: Counter
    store_evictions: Counter
    in_flight: Gauge
    bulkhead_limit: Gauge
    breaker: Gauge
    websockets: Gauge
    store_down: Gauge

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        counters: Mapping[str, tuple[str, str, tuple[str, ...]]] = _COUNTERS
        for attr, (name, doc, labels) in counters.items():
            setattr(self, attr, Counter(f"stormguard_gateway_{name}", doc, labels, registry=r))
        gauges: Mapping[str, tuple[str, str, tuple[str, ...], Any]] = _GAUGES
        for attr, (name, doc, labels, mode) in gauges.items():
            gauge = Gauge(
                f"stormguard_gateway_{name}", doc, labels, registry=r, multiprocess_mode=mode
            )
            setattr(self, attr, gauge)
        self.latency = Histogram(
            "stormguard_gateway_upstream_latency_seconds",
            "Time to the upstream's response headers.",
            ("upstream",),
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        # Per-request counts are kept here and handed to prometheus-client in
        # batches (flush): a labelled inc() or observe() takes a lock and, for the
        # histogram, walks the buckets in Python -- per request, a visible share of
        # the proxy leg's cost. Readers of this registry flush first. With several
        # workers each count goes to the shared files at once, as before.
        self._counts: dict[tuple[str, str], int] = {}
        self._latencies: dict[str, list[float]] = {}  # upstream -> bucket counts + [sum]
        self._bounds = [*_LATENCY_BUCKETS, math.inf]
        # With --workers N the admin listener reads other processes' files: no batch.
        self._batch = multiprocess_dir() is None

    def count(self, route: str, outcome: str) -> None:
        """One request of ``route`` ended with ``outcome``."""
        key = (route, outcome)
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1
        if not self._batch:
            self.flush()

    def shadow(self, route: str, reasons: tuple[str, ...]) -> None:
        """A request of ``route`` that shadow limits would have refused (``reasons``:
        ``shadow:<limit>`` each); it was let through."""
        for reason in reasons:
            self.shadow_refusals.labels(route, reason).inc()

    def observe_latency(self, upstream: str, seconds: float) -> None:
        """Time to an upstream's response headers."""
        row = self._latencies.get(upstream)
        if row is None:
            row = self._latencies[upstream] = [0.0] * (len(self._bounds) + 1)
        row[bisect_left(self._bounds, seconds)] += 1
        row[-1] += seconds
        if not self._batch:
            self.flush()

    def flush(self) -> None:
        """Hand the counts gathered since the last flush to the registry."""
        counts, self._counts = self._counts, {}
        for (route, outcome), n in counts.items():
            self.requests.labels(route, outcome).inc(n)
        latencies, self._latencies = self._latencies, {}
        for upstream, row in latencies.items():
            child: Any = self.latency.labels(upstream)
            # The histogram's own cells (bucket i counts values <= bound i, as
            # observe() would put them; the exposition accumulates).
            for i, count in enumerate(row[:-1]):
                if count:
                    child._buckets[i].inc(count)
            child._sum.inc(row[-1])


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

    @property
    def upstreams(self) -> dict[str, dict[str, Any]]:
        """Each upstream's static facts, its target URLs as they may be shown."""
        return self._upstreams

    @upstreams.setter
    def upstreams(self, facts: dict[str, dict[str, Any]]) -> None:
        # (set anew on a reload) credentials in a URL never reach /status or the page
        self._upstreams = {
            name: {**row, "targets": [shown_url(t) for t in row["targets"]]}
            if "targets" in row
            else row
            for name, row in facts.items()
        }

    def registry(self) -> Any:
        """The registry to read: merged multiprocess files, or the process's own."""
        directory = multiprocess_dir()
        if directory is not None:
            merged = CollectorRegistry()
            MultiProcessCollector(merged, path=directory)  # type: ignore[no-untyped-call]
            return merged
        assert self._metrics is not None
        self._metrics.flush()
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
        shadow: dict[str, dict[str, int]] = {}
        for s in samples.get("stormguard_gateway_shadow_refusals_total", []):
            row = shadow.setdefault(s.labels["route"], {})
            row[s.labels["reason"]] = row.get(s.labels["reason"], 0) + int(s.value)
        evictions = sum(
            int(s.value) for s in samples.get("stormguard_gateway_store_evictions_total", [])
        )
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
            "shadow_refusals": shadow,  # route -> {"shadow:<limit>": requests let through}
            "store_evictions": evictions,
        }
