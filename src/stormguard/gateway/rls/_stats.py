# What the rate-limit service counts, as Prometheus metrics -- and /status built from
# them, so that both agree, with one process or with --workers N (each worker writes
# prometheus-client's multiprocess files; the supervisor's admin listener reads them
# all, as the gateway's does).
#
#   stormguard_rls_requests_total{domain, code}                  code: ok | over_limit
#   stormguard_rls_descriptors_total{domain, descriptor, outcome}
#       outcome: allowed | refused | shadow_refused | unmatched (descriptor "")
#   stormguard_rls_limited_values_total{domain, descriptor, value, outcome}
#       value: the first 8 hex digits of the SHA-256 of the descriptor's counter key
#       (the gateway's client_id), never the values themselves; at most
#       MAX_VALUES distinct ones per process, the rest counted as "other"
#   stormguard_rls_in_flight, stormguard_rls_store_unavailable   (gauges)
#
# Counts are gathered in a dict per call and handed to prometheus-client in batches
# (flush: every half second and before every read): a labelled inc() per descriptor
# would cost more than the decision.
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from .._clients import client_id
from .._metrics import StatusBuilder, _samples
from ._decide import Outcome

__all__ = ["MAX_VALUES", "RlsMetrics", "RlsStatus"]

MAX_VALUES = 10_000
_TOP = 10


class RlsMetrics:
    """The service's counters; :meth:`record` and :meth:`answered` are the hot path."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "stormguard_rls_requests",
            "Answers by domain and overall code.",
            ("domain", "code"),
            registry=r,
        )
        self.descriptors = Counter(
            "stormguard_rls_descriptors",
            "Descriptors by domain, configured descriptor and outcome.",
            ("domain", "descriptor", "outcome"),
            registry=r,
        )
        self.limited = Counter(
            "stormguard_rls_limited_values",
            "Refusals by descriptor value (SHA-256 prefix of the counter key).",
            ("domain", "descriptor", "value", "outcome"),
            registry=r,
        )
        self.in_flight_gauge = Gauge(
            "stormguard_rls_in_flight",
            "Calls being decided now.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.store_down = Gauge(
            "stormguard_rls_store_unavailable",
            "1 while the store is unreachable (answers follow on_store_error).",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.in_flight = 0
        self.store_state: Callable[[], bool] | None = None  # () -> store down?
        self._answers: dict[tuple[str, str], int] = {}
        self._outcomes: dict[tuple[str, str, str], int] = {}
        self._values: dict[tuple[str, str, str, str], int] = {}
        self._seen: set[str] = set()

    def answered(self, domain: str, code: str) -> None:
        """One call of ``domain`` was answered with ``code`` (``ok``/``over_limit``)."""
        key = (domain, code)
        self._answers[key] = self._answers.get(key, 0) + 1

    def record(self, outcome: Outcome) -> None:
        """One descriptor's :class:`Outcome`."""
        key = (outcome.domain, outcome.label, outcome.result)
        outcomes = self._outcomes
        outcomes[key] = outcomes.get(key, 0) + 1
        if outcome.result in ("refused", "shadow_refused"):
            value = client_id(outcome.value)
            if value not in self._seen:
                if len(self._seen) >= MAX_VALUES:
                    value = "other"
                else:
                    self._seen.add(value)
            vkey = (outcome.domain, outcome.label, value, outcome.result)
            self._values[vkey] = self._values.get(vkey, 0) + 1

    def flush(self) -> None:
        """Hand the counts gathered since the last flush to the registry."""
        answers, self._answers = self._answers, {}
        for labels, n in answers.items():
            self.requests.labels(*labels).inc(n)
        outcomes, self._outcomes = self._outcomes, {}
        for labels3, n in outcomes.items():
            self.descriptors.labels(*labels3).inc(n)
        values, self._values = self._values, {}
        for labels4, n in values.items():
            self.limited.labels(*labels4).inc(n)
        self.in_flight_gauge.set(self.in_flight)
        if self.store_state is not None:
            self.store_down.set(1.0 if self.store_state() else 0.0)


def _empty() -> dict[str, Any]:
    return {"allowed": 0, "refused": 0, "shadow_refused": 0, "top_limited": []}


class RlsStatus(StatusBuilder):
    """Builds /status and /metrics from the process's registry or every worker's files.

    The gateway's builder reads the registry (its own or the merged multiprocess one)
    and renders /metrics; this one renders /status per domain and descriptor.
    ``descriptors`` maps each domain to its configured descriptors' labels, so that a
    descriptor nobody has asked for yet shows with zero counts.
    """

    def __init__(
        self, metrics: RlsMetrics | None, descriptors: Mapping[str, Iterable[str]]
    ) -> None:
        # StatusBuilder reads only `flush()` and `registry` of its metrics object.
        super().__init__(metrics, {})  # type: ignore[arg-type]
        self.descriptors = {domain: list(labels) for domain, labels in descriptors.items()}

    def status(self) -> dict[str, Any]:
        """The /status document: per domain and descriptor, and the service's state."""
        samples = _samples(self.registry())
        domains: dict[str, dict[str, Any]] = {}

        def domain_row(name: str) -> dict[str, Any]:
            row = domains.get(name)
            if row is None:
                row = domains[name] = {
                    "requests": {"ok": 0, "over_limit": 0},
                    "unmatched": 0,
                    "descriptors": {},
                }
            return row

        for name, labels in self.descriptors.items():
            for label in labels:
                domain_row(name)["descriptors"][label] = _empty()
        for s in samples.get("stormguard_rls_requests_total", []):
            row = domain_row(s.labels["domain"])["requests"]
            row[s.labels["code"]] = row.get(s.labels["code"], 0) + int(s.value)
        for s in samples.get("stormguard_rls_descriptors_total", []):
            row = domain_row(s.labels["domain"])
            if s.labels["outcome"] == "unmatched":
                row["unmatched"] += int(s.value)
                continue
            cell = row["descriptors"].setdefault(s.labels["descriptor"], _empty())
            cell[s.labels["outcome"]] = cell.get(s.labels["outcome"], 0) + int(s.value)
        top: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
        for s in samples.get("stormguard_rls_limited_values_total", []):
            where = (s.labels["domain"], s.labels["descriptor"])
            cell = top.setdefault(where, {}).setdefault(
                s.labels["value"], {"refused": 0, "shadow_refused": 0}
            )
            cell[s.labels["outcome"]] = cell.get(s.labels["outcome"], 0) + int(s.value)
        for (name, label), values in top.items():
            ranked = sorted(values.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
            cell = domain_row(name)["descriptors"].setdefault(label, _empty())
            cell["top_limited"] = [{"value": v, **counts} for v, counts in ranked[:_TOP]]
        gauges = {
            name: sum(s.value for s in samples.get(name, []))
            for name in ("stormguard_rls_in_flight", "stormguard_rls_store_unavailable")
        }
        return {
            "domains": domains,
            "requests_total": sum(
                int(s.value) for s in samples.get("stormguard_rls_requests_total", [])
            ),
            "in_flight": int(gauges["stormguard_rls_in_flight"]),
            "store": "unavailable" if gauges["stormguard_rls_store_unavailable"] else "ok",
        }
