# The adaptive concurrency limit at run time: core/_adaptive.py's controller behind
# a lock, fed with latencies measured on the injected clock.
#
# A fleet: the limit is per instance, and bounds given for the fleet are divided by
# `instances`. Nothing is shared through a store, on purpose:
#   * the controller's signal is the upstream's latency, which every instance
#     measures for itself; when the fleet together pushes the upstream past its
#     knee, every instance sees the latency rise and shrinks its own limit, so the
#     instances' limits add up to about the upstream's capacity, each holding a
#     share in proportion to its traffic (as TCP flows share a link);
#   * a shared limit needs a shared in-flight count: a store round trip before and
#     after every request, and leases for the slots of instances that died --
#     latency and a failure mode added exactly when the upstream is overloaded;
#   * a dead or slow store must never take the limit with it.
# So with Redis configured the limit stays local and `instances` divides its
# bounds (min_limit, max_limit, initial_limit), as `on_store_error: local` divides
# the rate limits.
from __future__ import annotations

import math
import threading
from typing import Any

from .._clock import Clock, monotonic_of
from ..core._adaptive import AdaptiveLimitCore
from ..core._checks import check_count

__all__ = ["AdaptiveLimit"]


def _share(value: int, instances: int) -> int:
    return max(1, math.ceil(value / instances))


class AdaptiveLimit:
    """A concurrency limit that follows the latency it measures (a gradient controller).

    Every ``interval`` seconds, with ``sample_rtt`` the ``percentile`` (default the
    median) of the latencies measured in it and ``min_rtt`` the latency unloaded::

        gradient = clamp((1 + tolerance) * min_rtt / sample_rtt, 0.5, 2.0)
        target   = limit * gradient + headroom * sqrt(limit)
        limit    = target if target < limit else (1 - smoothing) * limit + smoothing * target
        limit    = clamp(limit, min_limit, max_limit)

    The limit grows while latency stays at ``min_rtt`` and falls as soon as requests
    queue (latency rises); it does not grow while less than half of it is used, and
    falls by ``backoff`` when requests are dropped (timed out, refused downstream).
    ``min_rtt`` is measured at the start and every ``probe_interval`` seconds by
    holding the limit at ``max(min_limit, ceil(limit * probe_ratio))`` until
    ``probe_samples`` requests admitted meanwhile finish.

    ``instances``: the number of processes sharing these bounds; each holds its own
    limit within ``min_limit / instances`` .. ``max_limit / instances`` (rounded up,
    at least 1) -- see docs/overload.md for why a fleet divides rather than shares.

    Use it through ``ConcurrencyMiddleware(adaptive=...)`` or
    ``OverloadMiddleware(limit=...)``, or by hand: :meth:`try_acquire` before a
    request, :meth:`release` after it. :meth:`status` is its state for ``/status``.
    """

    __slots__ = ("_core", "_in_flight", "_lock", "_monotonic", "instances", "name")

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
        instances: int = 1,
        name: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.instances = check_count(instances, "instances")
        check_count(min_limit, "min_limit")
        check_count(max_limit, "max_limit")
        if initial_limit is not None:
            initial_limit = _share(check_count(initial_limit, "initial_limit"), instances)
        self._core = AdaptiveLimitCore(
            min_limit=_share(min_limit, instances),
            max_limit=_share(max_limit, instances),
            initial_limit=initial_limit,
            tolerance=tolerance,
            headroom=headroom,
            smoothing=smoothing,
            interval=interval,
            min_samples=min_samples,
            percentile=percentile,
            backoff=backoff,
            probe_interval=probe_interval,
            probe_ratio=probe_ratio,
            probe_samples=probe_samples,
        )
        self._monotonic = monotonic_of(clock)
        self._lock = threading.Lock()
        self._in_flight = 0
        self.name = name

    def __repr__(self) -> str:
        core = self._core
        return (
            f"AdaptiveLimit(limit={core.current()}, min_limit={core.min_limit}, "
            f"max_limit={core.max_limit}, name={self.name!r})"
        )

    @property
    def limit(self) -> int:
        """Requests that may be in flight now."""
        return self._core.current()

    @property
    def in_flight(self) -> int:
        """Requests holding a slot taken with :meth:`try_acquire` now."""
        return self._in_flight

    def now(self) -> float:
        """The clock this limit measures latencies on (monotonic seconds)."""
        return self._monotonic()

    @property
    def queued_after(self) -> float | None:
        """The latency past which a request must have queued somewhere:
        ``min_rtt * (1 + tolerance)`` (None until ``min_rtt`` is measured)."""
        core = self._core
        return None if core.min_rtt is None else core.min_rtt * (1.0 + core.tolerance)

    def record(self, rtt: float, *, in_flight: int, dropped: bool = False) -> None:
        """A request took ``rtt`` seconds with ``in_flight`` in flight (for gates that
        count their own slots); ``dropped``: it timed out or was refused as overloaded."""
        with self._lock:
            self._core.record(self._monotonic(), rtt, in_flight, dropped=dropped)

    def try_acquire(self) -> float | None:
        """Take a slot if the limit allows: the start time (give it to :meth:`release`),
        else None."""
        with self._lock:
            if self._in_flight >= self._core.current():
                return None
            self._in_flight += 1
            return self._monotonic()

    def release(self, started: float, *, dropped: bool = False) -> None:
        """Give back a slot taken at ``started``; its latency feeds the controller."""
        with self._lock:
            now = self._monotonic()
            self._core.record(now, now - started, self._in_flight, dropped=dropped)
            self._in_flight -= 1

    def status(self) -> dict[str, Any]:
        """``{"limit", "in_flight", "min_limit", "max_limit", "min_rtt", "sample_rtt",
        "gradient", "probing", "probes", "instances"}`` (latencies in seconds; None
        before the first measurement)."""
        core = self._core
        return {
            "limit": core.current(),
            "in_flight": self._in_flight,
            "min_limit": core.min_limit,
            "max_limit": core.max_limit,
            "min_rtt": core.min_rtt,
            "sample_rtt": core.sample_rtt,
            "gradient": core.gradient,
            "probing": core.probing,
            "probes": core.probes,
            "instances": self.instances,
        }
