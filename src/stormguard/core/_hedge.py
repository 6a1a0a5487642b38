# Hedged requests, as pure rules (Dean & Barroso, "The Tail at Scale", CACM 2013;
# gRPC A6's hedgingPolicy; Polly v8's hedging strategy; Envoy's hedged per-try
# timeouts). For one idempotent read:
#
#   copy 1 is sent at once
#   after `delay` without a final answer, copy k+1 is sent (up to `attempts`
#   copies in all), if the budget allows one more extra request
#   an answer that is not final (a 5xx, a 429, a transport error: gRPC's
#   "non-fatal" codes) sends the next copy at once instead of waiting
#   the first final answer wins; the copies still running are cancelled
#   when every copy failed, the last failure is the answer
#
# The delay is fixed, or the `percentile` of the latencies recently seen (the
# LatencyWindow below, fed by the winning copies), never under `min_delay`; until
# `min_samples` latencies are known the fixed `delay` is used. Hedging at the
# 95th percentile sends ~5 % more requests and cuts the tail the slowest 5 % of
# copies cause, at the 99th ~1-2 % more; the budget (a RetryBudgetCore / RetryBudget: extra copies
# <= ratio * requests + a reserve) caps the extra load whatever the latencies do,
# so a slow backend is never sent twice its load.
#
# Pure: nothing here reads a clock or sleeps; the drivers (client/_hedge.py, the
# simulator's sim/_hedging.py) pass latencies in and ask for the delay.
from __future__ import annotations

import math
from dataclasses import dataclass

from .._errors import ConfigError
from ._backoff import seconds

__all__ = ["HedgePolicy", "LatencyWindow"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HedgePolicy:
    """When to send another copy of an idempotent read (see ``HedgePolicy.delay_for``).

    * ``attempts``: copies at most, the first included (2-10; default 2).
    * ``delay``: seconds to wait for an answer before the next copy (default 0.1);
      with ``percentile``, the delay used until ``min_samples`` latencies are known.
    * ``percentile``: hedge after this percentile of recent latencies (0-100,
      e.g. 95), or ``None`` for the fixed ``delay``.
    * ``min_delay``: the shortest delay a percentile may give (default 0).
    * ``min_samples``: latencies needed before the percentile is trusted (100).
    * ``window``: how many recent latencies the percentile is taken over (1000).
    * ``ratio`` / ``min_per_second``: the hedge budget (extra copies at most
      ``ratio`` of requests plus a reserve of ``min_per_second``; defaults 0.1, 1).
      It must exceed the share of copies slower than the delay (5 % at the 95th
      percentile), or it runs dry on the merely slow and the tail goes unhedged.
    """

    attempts: int = 2
    delay: float = 0.1
    percentile: float | None = None
    min_delay: float = 0.0
    min_samples: int = 100
    window: int = 1000
    ratio: float = 0.1
    min_per_second: float = 1.0

    def __post_init__(self) -> None:
        attempts = self.attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 2 <= attempts <= 10:
            raise ConfigError("attempts", f"must be an integer in [2, 10], got {attempts!r}")
        object.__setattr__(self, "delay", seconds(self.delay, "delay"))
        object.__setattr__(self, "min_delay", seconds(self.min_delay, "min_delay"))
        percentile = self.percentile
        if percentile is not None and (
            isinstance(percentile, bool)
            or not isinstance(percentile, int | float)
            or not 0 < percentile < 100
        ):
            raise ConfigError("percentile", f"must be in (0, 100) or None, got {percentile!r}")
        for name in ("min_samples", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, f"must be an integer >= 1, got {value!r}")
        ratio = self.ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 10:
            raise ConfigError("ratio", f"must be in [0, 10], got {ratio!r}")
        reserve = self.min_per_second
        if isinstance(reserve, bool) or not isinstance(reserve, int | float) or not reserve >= 0:
            raise ConfigError("min_per_second", f"must be >= 0, got {reserve!r}")

    def delay_for(self, latencies: LatencyWindow | None) -> float:
        """The wait before the next copy: ``max(min_delay, the percentile of
        recent latencies)`` once ``min_samples`` are known, else ``delay``."""
        if self.percentile is None or latencies is None or len(latencies) < self.min_samples:
            return self.delay
        return max(self.min_delay, latencies.percentile(self.percentile))


class LatencyWindow:
    """The last ``size`` latencies (seconds) and their percentiles.

    ``record`` is O(1); ``percentile`` sorts the window only after ``refresh``
    new samples (the tail moves slowly; a hedge decision need not sort each time).
    """

    __slots__ = ("_next", "_refresh", "_since", "_sorted", "_values", "size")

    def __init__(self, size: int = 1000, *, refresh: int = 32) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError("window", f"must be an integer >= 1, got {size!r}")
        self.size = size
        self._values: list[float] = []
        self._next = 0
        self._refresh = max(1, refresh)
        self._since = 0
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._values)

    def record(self, latency: float) -> None:
        """One latency seen (negative or non-finite values are ignored)."""
        if not (latency >= 0 and math.isfinite(latency)):
            return
        values = self._values
        if len(values) < self.size:
            values.append(latency)
        else:
            values[self._next] = latency
            self._next = (self._next + 1) % self.size
        self._since += 1

    def percentile(self, p: float) -> float:
        """The ``p``-th percentile (nearest rank) of the window; 0.0 when empty."""
        if self._since >= self._refresh or len(self._sorted) != len(self._values):
            self._sorted = sorted(self._values)
            self._since = 0
        ordered = self._sorted
        if not ordered:
            return 0.0
        rank = max(1, math.ceil(p / 100.0 * len(ordered)))
        return ordered[min(rank, len(ordered)) - 1]
