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

import glob
import math
import os
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ._h1client import UpstreamConnectError
from ._history import History, Snapshot, UpstreamSnapshot, history_settings, quantile
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


class WorkersCollector(Collector):
    """The workers' metrics files merged, as ``MultiProcessCollector`` merges them,
    leaving out what a worker is still making or has just left.

    A worker creates its file before it sizes it, so for a moment the file is
    empty, and merging an empty file raises (prometheus/client_python#1199): one
    such read made /status answer 500 while a new worker was starting. An empty
    file holds nothing recorded yet and is skipped; a file removed between the
    listing and the read (a worker marked dead) makes the merge list again.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def _files(self) -> list[str]:
        files = []
        for name in glob.glob(os.path.join(self.path, "*.db")):
            try:
                if os.path.getsize(name) > 0:
                    files.append(name)
            except OSError:  # gone since the listing
                continue
        return files

    def collect(self) -> Any:
        for tries_left in reversed(range(3)):
            try:
                return MultiProcessCollector.merge(self._files(), accumulate=True)  # type: ignore[no-untyped-call]
            except FileNotFoundError:
                if not tries_left:
                    raise


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
    # issue 29: what each upstream answered (or that it did not), per attempt.
    "answers": (
        "upstream_answers",
        "Upstream answers by status class (2xx, 3xx, 4xx, 5xx), or timeout / connect_error "
        "when none came, per attempt.",
        ("upstream", "answer"),
    ),
    "store_evictions": (
        "store_evictions",
        "Keys whose limit was not yet back to full that the memory store forgot to stay "
        "within store_max_keys (their clients start afresh).",
        (),
    ),
    # issue 24: the access log is written in batches; over its bound lines are dropped.
    "access_log_dropped": (
        "access_log_dropped",
        "Access log lines dropped because the writer could not keep up (over its bound).",
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
    "overload_limit": (
        "overload_limit",
        "Overload control: requests that may be in flight to an upstream now (the "
        "adaptive limit follows latency; summed over workers).",
        ("upstream",),
        "livesum",
    ),
    "overload_waiting": (
        "overload_waiting",
        "Overload control: requests waiting in an upstream's line now.",
        ("upstream",),
        "livesum",
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
    answers: Counter
    store_evictions: Counter
    access_log_dropped: Counter
    in_flight: Gauge
    bulkhead_limit: Gauge
    breaker: Gauge
    overload_limit: Gauge
    overload_waiting: Gauge
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
        # upstream -> latency bucket counts, their sum, then answers (see _ROW_ANSWERS)
        self._latencies: dict[str, list[float]] = {}
        self._bounds = [*_LATENCY_BUCKETS, math.inf]
        self._sum_at = len(self._bounds)
        self._answers_at = self._sum_at + 1
        self._row_size = self._answers_at + len(_ROW_ANSWERS)
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

    def observe_latency(self, upstream: str, seconds: float, status: int | None = None) -> None:
        """Time to an upstream's response headers (and its ``status``, counted by class)."""
        row = self._latencies.get(upstream)
        if row is None:
            row = self._latencies[upstream] = [0.0] * self._row_size
        row[bisect_left(self._bounds, seconds)] += 1
        row[self._sum_at] += seconds
        if status is not None:  # 100..999: one cell per hundred
            row[self._answers_at + status // 100] += 1
        if not self._batch:
            self.flush()

    def upstream_failed(self, upstream: str, exc: BaseException) -> None:
        """An attempt at ``upstream`` got no answer: ``timeout`` (it went silent) or
        ``connect_error`` (no connection, or it closed before the status line)."""
        silent = isinstance(exc, TimeoutError) and not isinstance(exc, UpstreamConnectError)
        row = self._latencies.get(upstream)
        if row is None:
            row = self._latencies[upstream] = [0.0] * self._row_size
        row[self._answers_at + (10 if silent else 11)] += 1
        if not self._batch:
            self.flush()

    def flush(self) -> None:
        """Hand the counts gathered since the last flush to the registry."""
        counts, self._counts = self._counts, {}
        for (route, outcome), n in counts.items():
            self.requests.labels(route, outcome).inc(n)
        latencies, self._latencies = self._latencies, {}
        at = self._sum_at
        for upstream, row in latencies.items():
            for i, name in enumerate(_ROW_ANSWERS, start=at + 1):
                if row[i]:
                    self.answers.labels(upstream, name).inc(row[i])
            if not any(row[:at]):
                continue  # failed attempts only: no latency observed
            child: Any = self.latency.labels(upstream)
            # The histogram's own cells (bucket i counts values <= bound i, as
            # observe() would put them; the exposition accumulates).
            for i, count in enumerate(row[:at]):
                if count:
                    child._buckets[i].inc(count)
            child._sum.inc(row[at])


# A row's cells after the latency sum: statuses by hundred (0xx never happens), then
# the attempts that got no answer.
_ROW_ANSWERS = (
    *("other", "1xx", "2xx", "3xx", "4xx", "5xx", "other", "other", "other", "other"),
    *("timeout", "connect_error"),
)
ANSWERS = ("2xx", "3xx", "4xx", "5xx", "timeout", "connect_error")
_RATE_WINDOW = 10.0  # seconds of /status history behind requests_per_second


class _Collected:
    # A few collectors read as one registry (what _samples needs: collect()).
    def __init__(self, collectors: tuple[Any, ...]) -> None:
        self._collectors = collectors

    def collect(self) -> Any:
        for collector in self._collectors:
            yield from collector.collect()


def _samples(registry: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for family in registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


class StatusBuilder:
    """Builds /status and /metrics from one registry (the worker's or the merged one)."""

    def __init__(
        self,
        metrics: GatewayMetrics | None,
        upstreams: dict[str, dict[str, Any]],
        listener: dict[str, Any] | None = None,
        history: History | None = None,
    ) -> None:
        self._metrics = metrics
        self.upstreams = upstreams  # name -> static facts (targets, limits) from the config
        self.listener = listener or {}  # the proxy listener: url, tls, client certificates
        self._history: deque[tuple[float, float]] = deque()
        self.history = History(*history_settings()) if history is None else history

    def snapshot(self) -> Snapshot:
        """The counters since start and the breakers now, for :class:`History`."""
        samples = _samples(self._snapshot_source())
        outcomes: dict[str, float] = {}
        for s in samples.get("stormguard_gateway_requests_total", []):
            outcomes[s.labels["outcome"]] = outcomes.get(s.labels["outcome"], 0.0) + s.value
        answers: dict[str, dict[str, float]] = {name: {} for name in self.upstreams}
        for s in samples.get("stormguard_gateway_upstream_answers_total", []):
            row = answers.setdefault(s.labels["upstream"], {})
            row[s.labels["answer"]] = row.get(s.labels["answer"], 0.0) + s.value
        latency: dict[str, dict[float, float]] = {}
        for s in samples.get("stormguard_gateway_upstream_latency_seconds_bucket", []):
            row2 = latency.setdefault(s.labels["upstream"], {})
            bound = float(s.labels["le"])
            row2[bound] = row2.get(bound, 0.0) + s.value
        breaker: dict[str, str] = {}
        for s in samples.get("stormguard_gateway_breaker_state", []):
            name = s.labels.get("upstream", "")
            state = _STATES.get(s.value, "closed")
            if BREAKER_CODES[state] >= BREAKER_CODES[breaker.get(name, "closed")]:
                breaker[name] = state
        names = [n for n in self.upstreams] or sorted(answers)
        return Snapshot(
            outcomes=outcomes,
            upstreams={
                name: UpstreamSnapshot(
                    answers=answers.get(name, {}),
                    latency=latency.get(name, {}),
                    breaker=breaker.get(name, "closed"),
                )
                for name in names
            },
        )

    def _snapshot_source(self) -> Any:
        # In one process, only the four metrics a snapshot reads (not the per-client
        # refusals, which grow with the clients); with workers, the merged files.
        metrics = self._metrics
        if multiprocess_dir() is not None or not isinstance(metrics, GatewayMetrics):
            return self.registry()
        metrics.flush()
        return _Collected((metrics.requests, metrics.answers, metrics.latency, metrics.breaker))

    def sample(self, now: float) -> None:
        """Close the history's bucket ending at ``now`` (Unix seconds)."""
        self.history.record(now, self.snapshot())

    def history_document(self) -> dict[str, Any]:
        """The /history JSON document."""
        return self.history.document(ANSWERS)

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
            merged.register(WorkersCollector(directory))
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
            name: {
                "breaker": "closed",
                "in_flight": 0,
                "answers": dict.fromkeys(ANSWERS, 0),
                **facts,
            }
            for name, facts in self.upstreams.items()
        }
        for s in samples.get("stormguard_gateway_upstream_answers_total", []):
            if s.labels.get("upstream") in upstreams:
                row = upstreams[s.labels["upstream"]]["answers"]
                row[s.labels["answer"]] = row.get(s.labels["answer"], 0) + int(s.value)
        for s in samples.get("stormguard_gateway_breaker_state", []):
            if s.labels.get("upstream") in upstreams:
                upstreams[s.labels["upstream"]]["breaker"] = _STATES.get(s.value, "closed")
        for s in samples.get("stormguard_gateway_upstream_in_flight", []):
            if s.labels.get("upstream") in upstreams:
                upstreams[s.labels["upstream"]]["in_flight"] = int(s.value)
        for field in ("limit", "waiting"):
            for s in samples.get(f"stormguard_gateway_overload_{field}", []):
                facts = upstreams.get(s.labels.get("upstream", ""))
                if facts is not None and "overload" in facts:
                    facts["overload"] = {**facts["overload"], field: int(s.value)}
        buckets: dict[str, list[tuple[float, float]]] = {}
        for s in samples.get("stormguard_gateway_upstream_latency_seconds_bucket", []):
            buckets.setdefault(s.labels["upstream"], []).append((float(s.labels["le"]), s.value))
        for name, rows in buckets.items():
            if name in upstreams:
                rows.sort()
                p50, p99 = quantile(rows, 0.5), quantile(rows, 0.99)
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
            "listener": self.listener,
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
