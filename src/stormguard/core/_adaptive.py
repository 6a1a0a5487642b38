# An adaptive concurrency limit: a gradient controller on measured latency
# (Envoy's adaptive_concurrency filter and Netflix's concurrency-limits Gradient2
# are the models), as a pure object.
#
# The limit is how many requests may be in flight at once. Every `interval`
# seconds (once `min_samples` latencies are in) the controller compares the
# latency it measures now with the latency of the service unloaded:
#
#     sample_rtt = the `percentile` of the interval's latencies
#     gradient   = clamp((1 + tolerance) * min_rtt / sample_rtt, 0.5, 2.0)
#     target     = limit * gradient + headroom * sqrt(limit)
#     limit     <- target                                          if target < limit
#                  (1 - smoothing) * limit + smoothing * target    otherwise
#     limit     <- clamp(limit, min_limit, max_limit)
#
# Below the service's knee the latency is min_rtt, the gradient is 1 + tolerance
# and the limit grows; past the knee requests queue inside the service, sample_rtt
# grows with the limit, and the limit settles where the gradient balances the
# headroom: at about (1 + tolerance) * knee + headroom * sqrt(limit), a little
# above the concurrency the service can actually run (the few queued requests keep
# it busy; `headroom` 0 stops at the knee itself and cannot find a knee that
# moved up). A latency step up (the service slowed, or its capacity dropped) makes
# the gradient < 1 at once and the limit falls in the same interval: down without
# smoothing (requests queue now), up smoothed (growth is a probe).
#
# An interval's samples are the requests admitted since the limit last changed:
# a request admitted under the old limit says nothing about the new one, and
# without this the controller would react one latency late and overshoot. So an
# interval lasts at least `interval` and in practice at least one latency.
#
# Rules, in order, at the end of an interval:
#   1. dropped requests (timed out, failed as overloaded) in the interval: the
#      limit may not grow, and falls by `backoff` at least;
#   2. app-limited: when no more than half the limit was ever in flight during
#      the interval, the limit does not grow (idle capacity proves nothing);
#   3. a sample_rtt below min_rtt lowers min_rtt at once (the service got faster).
#
# min_rtt, the unloaded latency, is measured by probing (Envoy's minRTT window):
# at the start, every `probe_interval` seconds, and whenever the limit falls to
# `min_limit`, the limit is pinned to
#     probe_limit = max(min_limit, ceil(limit * probe_ratio))
# until `probe_samples` requests admitted during the probe have finished;
# min_rtt is their `percentile` and the limit returns to its value before the
# probe. Without probes a service that stays past its knee would raise its own
# baseline: a lasting latency increase is learnt at the next probe.
#
# Pure: record() takes `now`, the request's latency and the in-flight count; the
# runtime (protection/_adaptive.py) measures and locks.
from __future__ import annotations

import math

from .._errors import ConfigError
from ._checks import check_count, check_fraction, check_number, check_seconds

__all__ = ["AdaptiveLimitCore", "percentile"]

_MAX_SAMPLES = 4096  # latencies kept per interval; later ones in it are not looked at
GRADIENT_MIN = 0.5
GRADIENT_MAX = 2.0


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (non-empty), 0 <= q <= 1."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


class AdaptiveLimitCore:
    """A concurrency limit that follows measured latency (see the module notes)."""

    __slots__ = (
        "_drops",
        "_interval_end",
        "_interval_start",
        "_max_in_flight",
        "_next_probe",
        "_probe_samples",
        "_probe_started",
        "_samples",
        "_saved_limit",
        "backoff",
        "gradient",
        "headroom",
        "interval",
        "limit",
        "max_limit",
        "min_limit",
        "min_rtt",
        "min_samples",
        "percentile",
        "probe_interval",
        "probe_ratio",
        "probe_samples",
        "probes",
        "probing",
        "sample_rtt",
        "smoothing",
        "tolerance",
    )

    def __init__(
        self,
        *,
        min_limit: int = 1,
        max_limit: int = 1000,
        initial_limit: int | None = None,
        tolerance: float = 0.1,
        headroom: float = 0.5,
        smoothing: float = 0.2,
        interval: float = 0.1,
        min_samples: int = 10,
        percentile: float = 0.5,
        backoff: float = 0.9,
        probe_interval: float = 15.0,
        probe_ratio: float = 0.25,
        probe_samples: int = 20,
    ) -> None:
        self.min_limit = check_count(min_limit, "min_limit")
        self.max_limit = check_count(max_limit, "max_limit")
        if self.max_limit < self.min_limit:
            raise ConfigError("max_limit", f"must be >= min_limit ({min_limit}), got {max_limit}")
        if initial_limit is None:
            initial_limit = max(self.min_limit, min(self.max_limit, 20))
        initial = check_count(initial_limit, "initial_limit")
        if not self.min_limit <= initial <= self.max_limit:
            raise ConfigError(
                "initial_limit", f"must be within [{min_limit}, {max_limit}], got {initial}"
            )
        self.tolerance = check_number(tolerance, "tolerance")
        self.headroom = check_number(headroom, "headroom")
        self.smoothing = check_fraction(smoothing, "smoothing", low_open=True)
        self.interval = check_seconds(interval, "interval")
        self.min_samples = check_count(min_samples, "min_samples")
        self.percentile = check_fraction(percentile, "percentile", low_open=True)
        self.backoff = check_fraction(backoff, "backoff", low_open=True)
        self.probe_interval = check_seconds(probe_interval, "probe_interval")
        self.probe_ratio = check_fraction(probe_ratio, "probe_ratio", low_open=True)
        self.probe_samples = check_count(probe_samples, "probe_samples")
        self.limit = float(initial)
        self.min_rtt: float | None = None
        self.sample_rtt: float | None = None
        self.gradient = 1.0
        self.probes = 0
        self._samples: list[float] = []
        self._drops = 0
        self._max_in_flight = 0
        self._interval_end: float | None = None
        self._interval_start = -math.inf
        # Probing at the start: every sample counts (all were admitted at the probe
        # limit), so the start time is -inf.
        self.probing = True
        self._probe_started = -math.inf
        self._probe_samples: list[float] = []
        self._saved_limit = self.limit
        self._next_probe = math.inf

    @property
    def probe_limit(self) -> int:
        """The limit while probing: ``max(min_limit, ceil(limit * probe_ratio))``."""
        return max(self.min_limit, math.ceil(self._saved_limit * self.probe_ratio - 1e-9))

    def current(self) -> int:
        """The number of requests that may be in flight now."""
        if self.probing:
            return self.probe_limit
        return max(self.min_limit, min(self.max_limit, int(self.limit)))

    def record(self, now: float, rtt: float, in_flight: int, *, dropped: bool = False) -> None:
        """A request admitted at ``now - rtt`` finished at ``now`` after ``rtt`` seconds,
        with ``in_flight`` requests in flight; ``dropped``: it timed out or was refused
        downstream as overloaded (it says "too much" and gives no latency sample)."""
        if not (0.0 <= rtt < math.inf):
            return  # a clock that went backwards, or no reading
        if self._interval_end is None:
            self._interval_end = now + self.interval
        self._max_in_flight = max(self._max_in_flight, in_flight)
        if self.probing:
            if not dropped and now - rtt >= self._probe_started:
                self._probe_samples.append(rtt)
                if len(self._probe_samples) >= self.probe_samples:
                    self._end_probe(now)
            return
        if dropped:
            self._drops += 1
        elif now - rtt >= self._interval_start and len(self._samples) < _MAX_SAMPLES:
            self._samples.append(rtt)  # admitted under the current limit
        if now >= self._interval_end and (self._drops or len(self._samples) >= self.min_samples):
            self._update(now)

    def _update(self, now: float) -> None:
        limit = self.limit
        min_rtt = self.min_rtt
        assert min_rtt is not None
        target = limit
        if self._samples:
            sample = percentile(self._samples, self.percentile)
            self.sample_rtt = sample
            if sample < min_rtt:
                self.min_rtt = min_rtt = sample
            ratio = (1.0 + self.tolerance) * min_rtt / sample if sample > 0 else GRADIENT_MAX
            self.gradient = max(GRADIENT_MIN, min(GRADIENT_MAX, ratio))
            target = limit * self.gradient + self.headroom * math.sqrt(limit)
            if self._max_in_flight * 2 < limit:
                target = min(target, limit)  # app-limited: idle capacity proves nothing
        if self._drops:
            target = min(target, limit * self.backoff)
        # Down at once (requests are queueing now), up smoothed (growth is a probe).
        new = target if target < limit else (1.0 - self.smoothing) * limit + self.smoothing * target
        self.limit = max(float(self.min_limit), min(float(self.max_limit), new))
        self._samples = []
        self._drops = 0
        self._max_in_flight = 0
        self._interval_start = now
        self._interval_end = now + self.interval
        if now >= self._next_probe or self.limit <= self.min_limit:
            self._start_probe(now)

    def _start_probe(self, now: float) -> None:
        self.probing = True
        self._probe_started = now
        self._probe_samples = []
        self._saved_limit = self.limit

    def _end_probe(self, now: float) -> None:
        measured = percentile(self._probe_samples, self.percentile)
        self.min_rtt = measured
        self.probing = False
        self.probes += 1
        self.limit = self._saved_limit
        self._probe_samples = []
        self._samples = []
        self._drops = 0
        self._max_in_flight = 0
        self._interval_start = now
        self._interval_end = now + self.interval
        self._next_probe = now + self.probe_interval
