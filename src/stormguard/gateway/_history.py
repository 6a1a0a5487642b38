# The last few minutes of the gateway, kept by the gateway (so that a page opened
# late still shows the outage): a ring of fixed-width buckets, each holding what
# happened between two snapshots of the counters -- requests by outcome, and per
# upstream its answers by class, the latency quantiles of those answers and the
# breaker state at the bucket's end.
#
# A snapshot is read from the same registry /status reads (the process's own, or
# every worker's multiprocess files merged), so with --workers N the history is the
# whole gateway's. This module takes snapshots and times and returns values: the
# admin app's sampler owns the clock (see _app.AdminApp) and tests pass times.
#
# Memory is bounded: at most `span / bucket` buckets, each a few small dicts of the
# keys that moved in it.
from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["History", "Snapshot", "UpstreamSnapshot", "history_settings", "quantile"]

BUCKET_ENV = "STORMGUARD_HISTORY_BUCKET"
SPAN_ENV = "STORMGUARD_HISTORY_SECONDS"
DEFAULT_BUCKET = 1.0
DEFAULT_SPAN = 300.0


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of a histogram given as sorted ``(upper bound, cumulative
    count)`` rows, interpolated linearly inside the bucket holding it (None: empty)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == math.inf:
                return prev_bound
            span = count - prev_count
            share = (rank - prev_count) / span if span else 0.0
            return prev_bound + (bound - prev_bound) * share
        prev_bound, prev_count = bound, count
    return prev_bound


@dataclass(frozen=True, slots=True)
class UpstreamSnapshot:
    """One upstream's counters since start, and its breaker now."""

    answers: dict[str, float] = field(default_factory=dict)  # class -> count
    latency: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative
    breaker: str = "closed"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The gateway's counters since start, as /status reads them."""

    outcomes: dict[str, float] = field(default_factory=dict)  # outcome -> requests
    upstreams: dict[str, UpstreamSnapshot] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Bucket:
    t: float  # end of the bucket (Unix seconds)
    seconds: float  # its actual length
    outcomes: dict[str, float]
    answers: dict[str, dict[str, float]]  # upstream -> class -> count
    latency_ms: dict[str, tuple[float | None, float | None]]  # upstream -> (p50, p99)
    breaker: dict[str, str]


def history_settings(env: Any = None) -> tuple[float, float]:
    """``(bucket seconds, span seconds)`` from ``STORMGUARD_HISTORY_BUCKET`` and
    ``STORMGUARD_HISTORY_SECONDS`` (defaults 1 and 300)."""
    env = os.environ if env is None else env
    out = []
    for name, default in ((BUCKET_ENV, DEFAULT_BUCKET), (SPAN_ENV, DEFAULT_SPAN)):
        raw = env.get(name)
        try:
            value = default if raw in (None, "") else float(raw)
        except ValueError:
            raise ValueError(f"{name} must be a number of seconds, not {raw!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a positive number of seconds, not {raw!r}")
        out.append(value)
    bucket, span = out
    if span < bucket:
        raise ValueError(f"{SPAN_ENV} ({span:g}) must be at least {BUCKET_ENV} ({bucket:g})")
    return bucket, span


def _delta(new: dict[Any, float], old: dict[Any, float]) -> dict[Any, float]:
    # What moved; a counter that went back (a restarted process) counts from zero.
    out = {}
    for key, value in new.items():
        moved = value - old.get(key, 0.0)
        if moved < 0:
            moved = value
        if moved:
            out[key] = moved
    return out


class History:
    """A ring of buckets over the last ``span`` seconds, ``bucket`` seconds each.

    ``record(now, snapshot)`` closes a bucket at ``now`` (the first call only sets
    the baseline); ``document()`` is the /history JSON, per-second rates per bucket.
    """

    def __init__(self, bucket: float = DEFAULT_BUCKET, span: float = DEFAULT_SPAN) -> None:
        self.bucket = bucket
        self.span = span
        self._ring: deque[_Bucket] = deque(maxlen=max(1, math.ceil(span / bucket)))
        self._last: tuple[float, Snapshot] | None = None

    def __len__(self) -> int:
        return len(self._ring)

    def start(self, now: float) -> None:
        """Count from zero at ``now`` (the gateway's counters start at zero), so the
        first bucket holds what happened before the first sample -- a late or
        failed first sample loses nothing."""
        if self._last is None:
            self._last = (now, Snapshot())

    def record(self, now: float, snapshot: Snapshot) -> None:
        """Close the bucket ending at ``now`` with what moved since the last call."""
        last, self._last = self._last, (now, snapshot)
        if last is None:
            return
        then, old = last
        seconds = now - then
        if seconds <= 0:  # the clock went back: a new baseline, no bucket
            return
        answers: dict[str, dict[str, float]] = {}
        latency: dict[str, tuple[float | None, float | None]] = {}
        breaker: dict[str, str] = {}
        for name, up in snapshot.upstreams.items():
            before = old.upstreams.get(name, UpstreamSnapshot())
            answers[name] = _delta(up.answers, before.answers)
            rows = sorted(_delta(up.latency, before.latency).items())
            p50, p99 = quantile(rows, 0.5), quantile(rows, 0.99)
            latency[name] = (
                None if p50 is None else round(p50 * 1000, 3),
                None if p99 is None else round(p99 * 1000, 3),
            )
            breaker[name] = up.breaker
        self._ring.append(
            _Bucket(
                t=now,
                seconds=seconds,
                outcomes=_delta(snapshot.outcomes, old.outcomes),
                answers=answers,
                latency_ms=latency,
                breaker=breaker,
            )
        )

    def document(self, answer_classes: tuple[str, ...]) -> dict[str, Any]:
        """The /history document: one column per series, one row per bucket (oldest
        first); counts are per second over the bucket, latencies in milliseconds
        (null where the upstream gave no answer in it)."""
        ring = list(self._ring)
        outcomes = sorted({k for b in ring for k in b.outcomes})
        names = sorted({k for b in ring for k in b.breaker})
        upstreams: dict[str, Any] = {}
        for name in names:
            seen = {k for b in ring for k in b.answers.get(name, {})}
            classes = [*answer_classes, *sorted(seen - set(answer_classes))]
            upstreams[name] = {
                "answers": {
                    c: [_rate(b.answers.get(name, {}).get(c, 0.0), b) for b in ring]
                    for c in classes
                },
                "latency_ms": {
                    "p50": [b.latency_ms.get(name, (None, None))[0] for b in ring],
                    "p99": [b.latency_ms.get(name, (None, None))[1] for b in ring],
                },
                "breaker": [b.breaker.get(name, "closed") for b in ring],
            }
        return {
            "bucket_seconds": self.bucket,
            "span_seconds": self.span,
            "t": [round(b.t, 3) for b in ring],
            "requests": [_rate(sum(b.outcomes.values()), b) for b in ring],
            "outcomes": {o: [_rate(b.outcomes.get(o, 0.0), b) for b in ring] for o in outcomes},
            "upstreams": upstreams,
        }


def _rate(count: float, bucket: _Bucket) -> float:
    return round(count / bucket.seconds, 3)
