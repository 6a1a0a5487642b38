# The circuit breaker as a pure state machine.
#
# BreakerCore never reads the clock, never sleeps, never locks: every method takes
# `now` (seconds on any monotonic scale) and, where it draws, an RNG. The runtime
# CircuitBreaker (protection/_breaker.py) holds a lock around these O(1) calls and
# runs the protected call outside it; the simulator drives the same object in
# virtual time; the Redis scripts (stores/lua/breaker_*.lua) implement the same
# table over a hash.
#
# States and the rules that move between them
# -------------------------------------------
#
#   CLOSED     every call is admitted and its outcome lands in the window.
#              Event TRIP: the window holds at least `min_calls` outcomes and the
#              share of failures (a slow call, duration >= slow_call, counts as a
#              failure) is >= `failure_rate`                         -> OPEN
#   OPEN       every call is refused with the time left. The open time is
#              open_for * 2**reopens, capped at open_for_max, and shortened by a
#              random share of at most `jitter` so that a fleet that tripped
#              together does not probe together. `reopens` counts consecutive
#              re-opens from half-open and goes back to 0 when the circuit closes.
#              Event OPEN_ELAPSED: now >= open_until                 -> HALF_OPEN
#   HALF_OPEN  at most `half_open_probes` calls are admitted per half-open episode
#              (so never more at once); each holds a lease of `probe_lease`
#              seconds. Others are refused.
#              Event PROBE_SUCCEEDED, once all `half_open_probes` succeeded -> CLOSED
#              Event PROBE_FAILED: any probe fails                   -> OPEN (reopens+1)
#              Event LEASE_EXPIRED: a probe did not report within its lease (it
#              hung): counted as a failed probe                      -> OPEN (reopens+1)
#   any        Event FORCE_OPEN: open until reset() (remaining is infinite) -> OPEN
#   any        Event RESET: empty window, reopens = 0               -> CLOSED
#
# Every transition bumps `generation`. An Admission carries the generation it was
# granted in; record() ignores an outcome from an older generation: a slow call
# admitted while closed that fails after the circuit opened, or a probe whose
# lease already expired, changes nothing.
#
# Time-based window: `buckets` buckets of window/buckets seconds in a ring, with
# running totals (core/_window.py, shared with the retry budget); a call touches
# one bucket, clearing the ones it skipped (at most `buckets`, so O(1)).
# Count-based window: a ring buffer of the last `window` outcomes with a running
# failure count.
#
# An illegal transition (a table miss) raises IllegalTransition and changes nothing.
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Final, Literal

from .._errors import ConfigError
from ._window import RingWindow

__all__ = [
    "CLOSED",
    "HALF_OPEN",
    "OPEN",
    "Admission",
    "BreakerConfig",
    "BreakerCore",
    "BreakerState",
    "IllegalTransition",
    "TRANSITIONS",
]

BreakerState = Literal["closed", "open", "half_open"]
WindowKind = Literal["time", "count"]

CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half_open"

# (state, event) -> next state. Anything missing is illegal.
TRANSITIONS: Final[dict[tuple[BreakerState, str], BreakerState]] = {
    (CLOSED, "trip"): OPEN,
    (OPEN, "open_elapsed"): HALF_OPEN,
    (HALF_OPEN, "probe_succeeded"): CLOSED,
    (HALF_OPEN, "probe_failed"): OPEN,
    (HALF_OPEN, "lease_expired"): OPEN,
    (CLOSED, "force_open"): OPEN,
    (OPEN, "force_open"): OPEN,
    (HALF_OPEN, "force_open"): OPEN,
    (CLOSED, "reset"): CLOSED,
    (OPEN, "reset"): CLOSED,
    (HALF_OPEN, "reset"): CLOSED,
}


class IllegalTransition(RuntimeError):
    """An event that the transition table does not allow in the current state."""


def _number(value: object, field: str) -> float:
    # Accept float | int | timedelta for durations, normalised once.
    total_seconds = getattr(value, "total_seconds", None)
    if total_seconds is not None:
        return float(total_seconds())
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(field, f"expected a number of seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Validated breaker settings (durations in seconds)."""

    failure_rate: float = 0.5
    min_calls: int = 10
    window: float = 30.0
    window_kind: WindowKind = "time"
    buckets: int = 10
    open_for: float = 5.0
    open_for_max: float = 300.0
    half_open_probes: int = 1
    probe_lease: float = 30.0
    slow_call: float | None = None
    jitter: float = 0.1

    def __post_init__(self) -> None:
        for name in ("window", "open_for", "open_for_max", "probe_lease", "failure_rate"):
            object.__setattr__(self, name, _number(getattr(self, name), name))
        if self.slow_call is not None:
            object.__setattr__(self, "slow_call", _number(self.slow_call, "slow_call"))
        for name in ("min_calls", "buckets", "half_open_probes"):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool), name, "an integer")
        _check(0.0 < self.failure_rate <= 1.0, "failure_rate", "must be in (0, 1]")
        _check(self.min_calls >= 1, "min_calls", "must be >= 1")
        _check(self.window_kind in ("time", "count"), "window_kind", "'time' or 'count'")
        _check(self.window > 0 and math.isfinite(self.window), "window", "must be > 0")
        if self.window_kind == "count":
            _check(self.window == int(self.window), "window", "a count window is whole calls")
        _check(self.buckets >= 1, "buckets", "must be >= 1")
        _check(self.open_for > 0, "open_for", "must be > 0")
        _check(self.open_for_max >= self.open_for, "open_for_max", "must be >= open_for")
        _check(self.half_open_probes >= 1, "half_open_probes", "must be >= 1")
        _check(self.probe_lease > 0, "probe_lease", "must be > 0")
        _check(self.slow_call is None or self.slow_call > 0, "slow_call", "must be > 0")
        _check(0.0 <= self.jitter < 1.0, "jitter", "must be in [0, 1)")

    def open_duration(self, reopens: int, draw: float) -> float:
        """open_for * 2**reopens, capped at open_for_max, shortened by jitter*draw."""
        base = self.open_for * 2.0 ** min(reopens, 64)
        return min(base, self.open_for_max) * (1.0 - self.jitter * draw)


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ConfigError(field, message)


@dataclass(frozen=True, slots=True)
class Admission:
    """The breaker's answer to "may this call run?".

    ``remaining`` is the time until the breaker may admit again when refused (0.0
    when allowed). ``lease_until`` is when a probe's lease expires.
    """

    allowed: bool
    probe: bool
    generation: int
    remaining: float = 0.0
    lease_until: float = 0.0


class BreakerCore:
    """Closed/open/half-open decisions from outcomes and ``now``. Not thread-safe."""

    __slots__ = (
        "_admit_closed",
        "_count_calls",
        "_count_fails",
        "_count_n",
        "_fail_ring",
        "_forced",
        "_jitter_pending",
        "_leases",
        "_min_calls",
        "_open_until",
        "_opened_for",
        "_pos",
        "_probes_admitted",
        "_probes_succeeded",
        "_rate",
        "_ring",
        "_slow",
        "_state",
        "closed_admission",
        "config",
        "generation",
        "quiet_until",
        "reopens",
    )

    def __init__(self, config: BreakerConfig | None = None, /, **settings: Any) -> None:
        """A core for ``config``, or for ``BreakerConfig(**settings)`` (the same keywords)."""
        self._setup(config if config is not None else BreakerConfig(**settings))

    @classmethod
    def from_config(cls, config: BreakerConfig) -> BreakerCore:
        """A core for an already validated config."""
        core = cls.__new__(cls)
        core._setup(config)
        return core

    def _setup(self, config: BreakerConfig) -> None:
        self.config = config
        self._slow = config.slow_call
        self._state: BreakerState = CLOSED
        self.generation = 0
        self.reopens = 0
        self._forced = False
        self._open_until = 0.0
        self._opened_for = 0.0
        self._jitter_pending = False
        self._leases: list[float] = []
        self._probes_admitted = 0
        self._probes_succeeded = 0
        self._admit_closed = Admission(True, False, 0)
        self.closed_admission: Admission | None = self._admit_closed
        self._min_calls = config.min_calls
        self._rate = config.failure_rate
        # Time window: a ring of buckets (a = calls, b = failures). Count window: a
        # ring buffer of the last `window` outcomes with running counts.
        self._ring: RingWindow | None = None
        self._count_n = 0
        if config.window_kind == "time":
            self._ring = RingWindow(config.window, config.buckets)
        else:
            self._count_n = int(config.window)
        self._clear_window()

    def _clear_window(self) -> None:
        if self._ring is not None:
            self._ring.clear()
        self._fail_ring = [False] * self._count_n
        self._count_calls = 0
        self._count_fails = 0
        self._pos = 0  # count window: next slot in the ring
        self.quiet_until = -math.inf

    def _totals(self) -> tuple[int, int]:
        ring = self._ring
        if ring is not None:
            return ring.a_total, ring.b_total
        return self._count_calls, self._count_fails

    def _quiet(self) -> None:
        # `quiet_until`: until then, a success of the current closed admission needs
        # no decision, only counting in the newest bucket: closed, no failure in
        # the window (so a success cannot trip it), time window. The runtime reads
        # it without a lock to batch successes (see add_successes).
        ring = self._ring
        if self._state == CLOSED and ring is not None and not ring.b_total:
            self.quiet_until = ring.bucket_end
        else:
            self.quiet_until = -math.inf

    # -- transitions ---------------------------------------------------------------

    def _fire(self, event: str, now: float) -> None:
        try:
            target = TRANSITIONS[(self._state, event)]
        except KeyError:
            raise IllegalTransition(f"event {event!r} in state {self._state!r}") from None
        if target == OPEN:
            if event == "force_open":
                self._forced = True
                self._open_until = math.inf
            else:
                if event != "trip":
                    self.reopens += 1
                self._opened_for = self.config.open_duration(self.reopens, 0.0)
                self._open_until = now + self._opened_for
                self._jitter_pending = self.config.jitter > 0.0
        elif target == HALF_OPEN:
            self._leases.clear()
            self._probes_admitted = 0
            self._probes_succeeded = 0
        else:  # CLOSED
            self.reopens = 0
            self._forced = False
            self._clear_window()
        self._state = target
        self.generation += 1
        self._admit_closed = Admission(True, False, self.generation)
        # One attribute, replaced atomically: a lock-free reader that sees an
        # Admission saw a closed breaker at that instant.
        self.closed_admission = self._admit_closed if target == CLOSED else None
        self._quiet()

    def _advance(self, now: float) -> None:
        # Transitions that happen by the passage of time alone.
        state = self._state
        if state == OPEN:
            if now >= self._open_until:
                self._fire("open_elapsed", now)
        elif state == HALF_OPEN and self._leases and min(self._leases) <= now:
            self._fire("lease_expired", now)

    # -- the interface ---------------------------------------------------------------

    def try_acquire(self, now: float, rng: random.Random) -> Admission:
        """Admit or refuse one call at ``now``; probes in half-open hold a lease."""
        if self._state == CLOSED:
            return self._admit_closed
        if self._jitter_pending:
            # The jitter is drawn here (record() has no RNG); it only shortens the
            # open time, so nobody was refused on a deadline that moves later.
            self._jitter_pending = False
            cut = self._opened_for * self.config.jitter * rng.random()
            self._open_until -= cut
        self._advance(now)
        if self._state == HALF_OPEN:
            if self._probes_admitted < self.config.half_open_probes:
                self._probes_admitted += 1
                lease_until = now + self.config.probe_lease
                self._leases.append(lease_until)
                return Admission(True, True, self.generation, 0.0, lease_until)
            # Refused until a probe reports; at the latest when the first lease ends.
            remaining = max(0.0, min(self._leases) - now) if self._leases else 0.0
            return Admission(False, False, self.generation, remaining)
        # OPEN (time alone never closes a breaker).
        return Admission(False, False, self.generation, max(0.0, self._open_until - now))

    def record(
        self, now: float, admission: Admission, *, failure: bool, duration: float = 0.0
    ) -> None:
        """Record the outcome of an admitted call; stale generations are ignored."""
        self.outcome(now, admission, failure, duration)

    def outcome(self, now: float, admission: Admission, failure: bool, duration: float) -> None:
        """:meth:`record` with positional arguments (the runtime's hot path)."""
        if (
            now < self.quiet_until
            and not failure
            and admission is self.closed_admission
            and (self._slow is None or duration < self._slow)
        ):
            # Closed, current generation, same bucket: one counter each.
            ring = self._ring
            assert ring is not None  # quiet_until is finite only with a time window
            ring.a[ring.j] += 1
            ring.a_total += 1
            return
        if self._state != CLOSED:
            self._advance(now)  # an expired lease moves on first: its result is stale
        if admission.generation != self.generation or not admission.allowed:
            return
        slow = self._slow
        if slow is not None and duration >= slow:
            failure = True
        if self._state == CLOSED:
            self._count(now, failure)
            calls, fails = self._totals()
            if fails and calls >= self._min_calls and fails >= self._rate * calls:
                self._fire("trip", now)
            return
        if (
            self._state == HALF_OPEN
            and admission.probe
            and admission.lease_until in self._leases  # not reported twice
        ):
            self._leases.remove(admission.lease_until)
            if failure:
                self._fire("probe_failed", now)
                return
            self._probes_succeeded += 1
            if self._probes_succeeded >= self.config.half_open_probes:
                self._fire("probe_succeeded", now)

    def release(self, now: float, admission: Admission) -> None:
        """Give back an admission without an outcome (the call was cancelled).

        A probe's slot goes to the next caller; nothing lands in the window.
        """
        if (
            admission.probe
            and admission.generation == self.generation
            and self._state == HALF_OPEN
            and admission.lease_until in self._leases
        ):
            self._leases.remove(admission.lease_until)
            self._probes_admitted -= 1

    def add_successes(self, count: int) -> None:
        """Count ``count`` successes in the newest bucket, if still closed and quiet.

        The runtime's batched fast path: successes observed before ``quiet_until``
        with the current closed admission, counted later under its lock.
        """
        ring = self._ring
        if self._state == CLOSED and ring is not None:
            ring.a[ring.j] += count
            ring.a_total += count

    def _count(self, now: float, failure: bool) -> None:
        ring = self._ring
        if ring is not None:
            if now >= ring.bucket_end and ring.roll(now):
                self._quiet()
            ring.add(now, 1, 1 if failure else 0)
            if failure:
                self.quiet_until = -math.inf
            return
        slots, pos = self._fail_ring, self._pos
        if self._count_calls == self._count_n:
            if slots[pos]:
                self._count_fails -= 1
        else:
            self._count_calls += 1
        slots[pos] = failure
        if failure:
            self._count_fails += 1
        self._pos = (pos + 1) % self._count_n

    def state(self, now: float) -> BreakerState:
        """The state at ``now`` (applies the transitions due by time alone)."""
        if self._state != CLOSED:
            self._advance(now)
        return self._state

    def remaining(self, now: float) -> float:
        """Seconds until an open breaker half-opens (0.0 when not open)."""
        if self.state(now) != OPEN:
            return 0.0
        return max(0.0, self._open_until - now)

    def window_counts(self, now: float) -> tuple[int, int]:
        """(calls, failures) currently in the window."""
        ring = self._ring
        if ring is not None and ring.idx >= 0 and now >= ring.bucket_end and ring.roll(now):
            self._quiet()  # aged without recording anything
        return self._totals()

    @property
    def forced(self) -> bool:
        """True while held open by force_open()."""
        return self._forced

    def force_open(self, now: float) -> None:
        """Open and stay open until reset()."""
        self._fire("force_open", now)

    def reset(self, now: float) -> None:
        """Close, empty the window and forget consecutive re-opens."""
        self._fire("reset", now)
