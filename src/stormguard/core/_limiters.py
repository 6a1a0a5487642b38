# Rate-limit algorithms as pure step functions: (state, now, cost) -> (state, Decision).
#
# Nothing here reads a clock or touches a store. A store (stores/_memory.py) keeps
# the state per key and calls `step`; the Redis store runs the same rules as Lua
# (stores/lua/*.lua), which the contract suite holds to the same behaviour.
#
# Rules shared by every algorithm:
# * `state is None` means a fresh key. `step` never mutates: states are tuples.
# * A hit is admitted only if the full cost fits; a denied hit changes nothing.
# * A cost larger than the capacity can never be admitted: retry_after is inf.
# * cost == 0 is a peek: it is always allowed and reports the current quota.
# * retry_after is exact: at now + retry_after the same hit is admitted unless
#   somebody else took the capacity first. To keep that true in floating point
#   every comparison allows EPSILON (one microsecond, one millionth of a unit);
#   the over-admission this permits is below anything a client can observe.
# * reset_after is when the key is back to a fresh state, so it doubles as the
#   key's time to live in a store.
# * The clock may step back (Redis failover): time is clamped to the state's
#   last timestamp instead of refunding or revoking quota.
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, ClassVar, Protocol, Self, TypeAlias

from .._errors import ConfigError
from ._decision import Decision, combine

__all__ = [
    "EPSILON",
    "GCRA",
    "Algorithm",
    "Concurrency",
    "Decision",
    "FixedWindow",
    "LimitRequest",
    "Outcome",
    "SlidingWindowCounter",
    "SlidingWindowLog",
    "TokenBucket",
    "check_cost",
    "combine",
    "decide_group",
    "make_decision",
    "default_name",
    "outage_decision",
]

EPSILON = 1e-6

State: TypeAlias = Any
Step: TypeAlias = tuple[State, "Decision"]


def _seconds(name: str, value: object) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return _positive(name, value, "a number of seconds or a timedelta")


def _positive(name: str, value: object, kind: str = "a number") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(name, f"must be {kind}, got {value!r}")
    number = float(value)
    if not (0 < number < math.inf):
        raise ConfigError(name, f"must be > 0 and finite, got {value!r}")
    return number


def _wait(deadline: float, now: float) -> float:
    return max(0.0, deadline - now)


# What `advance` returns: (state to keep, allowed, remaining, reset_after,
# retry_after). On denial the state is the one passed in (nothing to write). Plain
# tuples keep the in-memory hot path free of allocations beyond the Decision.
Outcome: TypeAlias = tuple[State, bool, float, float, float]


def _denied(state: State, remaining: float, reset: float, retry: float) -> Outcome:
    return state, False, max(0.0, remaining), max(0.0, reset), retry


class _Stepper:
    # Mixin: the Decision-returning `step` on top of each algorithm's `advance`.
    __slots__ = ()

    def step(self, state: State, now: float, cost: float, lease: str = "") -> Step:
        """Decide one hit of ``cost`` at ``now``; return the new state and the decision."""
        algorithm: Algorithm = self  # type: ignore[assignment]
        outcome = algorithm.advance(state, now, cost, lease)
        return outcome[0], make_decision(algorithm, "default", outcome, lease if cost > 0 else "")


class Algorithm(Protocol):
    """What every algorithm offers: a frozen value plus a pure ``step``."""

    kind: ClassVar[str]

    @property
    def limit(self) -> float:
        """The quota a client sees (``q`` of RateLimit-Policy)."""
        ...

    @property
    def window(self) -> float | None:
        """Seconds the quota refers to (``w`` of RateLimit-Policy), if any."""
        ...

    def params(self) -> tuple[float, float]:
        """The two numbers that define the algorithm (also sent to Lua)."""
        ...

    def scaled(self, factor: float) -> Algorithm:
        """The same algorithm with its quota multiplied by ``factor`` (local fallback)."""
        ...

    def advance(self, state: State, now: float, cost: float, lease: str = "") -> Outcome:
        """Decide one hit: ``(state, allowed, remaining, reset_after, retry_after)``."""
        ...

    def step(self, state: State, now: float, cost: float, lease: str = "") -> Step:
        """Decide one hit of ``cost`` at ``now``; return the new state and the decision."""
        ...


def default_name(algorithm: Algorithm) -> str:
    """A name that differs whenever the parameters differ (policy name, key part)."""
    first, second = algorithm.params()
    return f"{algorithm.kind}:{first:g}:{second:g}"


@dataclass(frozen=True, slots=True)
class _RateBurst(_Stepper):
    # What TokenBucket and GCRA share: a rate per second and a burst, validated once.
    rate: float
    burst: float
    # Derived once: read on every hit.
    limit: float = field(init=False, repr=False, compare=False)
    window: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", _positive("rate", self.rate))
        object.__setattr__(self, "burst", _positive("burst", self.burst))
        object.__setattr__(self, "limit", self.burst)
        object.__setattr__(self, "window", self.burst / self.rate)

    def params(self) -> tuple[float, float]:
        return (self.rate, self.burst)

    def scaled(self, factor: float) -> Self:
        return replace(self, rate=self.rate * factor, burst=self.burst * factor)


@dataclass(frozen=True, slots=True)
class TokenBucket(_RateBurst):
    """A bucket of ``burst`` tokens refilled at ``rate`` tokens per second.

    ``tokens(t) = min(burst, tokens(t0) + (t - t0) * rate)``; a hit of ``cost`` is
    admitted when ``cost <= tokens``; ``retry_after = (cost - tokens) / rate``.
    """

    kind: ClassVar[str] = "token_bucket"

    def advance(self, state: State, now: float, cost: float, lease: str = "") -> Outcome:
        rate, burst = self.rate, self.burst
        if state is None:
            tokens = burst
        else:
            tokens, last = state
            if now < last:
                now = last
            tokens += (now - last) * rate
            if tokens > burst:
                tokens = burst
        if cost > tokens + EPSILON:
            if cost > burst:
                return _denied(state, tokens, (burst - tokens) / rate, math.inf)
            return _denied(state, tokens, (burst - tokens) / rate, (cost - tokens) / rate)
        tokens -= cost
        return (tokens, now), True, tokens if tokens > 0.0 else 0.0, (burst - tokens) / rate, 0.0


@dataclass(frozen=True, slots=True)
class GCRA(_RateBurst):
    """Generic cell rate algorithm (leaky bucket as a meter), one timestamp per key.

    Emission interval ``T = 1/rate``, tolerance ``tau = burst * T``. State is the
    theoretical arrival time ``tat``; a hit is admitted when
    ``max(tat, now) + cost*T - tau <= now``, and then ``tat += cost*T``.
    Admits exactly what ``TokenBucket(rate, burst)`` admits.
    """

    kind: ClassVar[str] = "gcra"

    def advance(self, state: State, now: float, cost: float, lease: str = "") -> Outcome:
        tat = now if state is None else max(state, now)
        tau = self.burst / self.rate
        if cost > self.burst:
            return _denied(state, (tau - (tat - now)) * self.rate, tat - now, math.inf)
        new_tat = tat + cost / self.rate
        allow_at = new_tat - tau
        if allow_at > now + EPSILON:
            remaining = (tau - (tat - now)) * self.rate
            return _denied(state, remaining, tat - now, allow_at - now)
        remaining = (tau - (new_tat - now)) * self.rate
        return new_tat, True, max(0.0, remaining), new_tat - now, 0.0


def _free_by(entries: Sequence[tuple[float, float]], need: float, span: float, now: float) -> float:
    # Entries are (start, cost) sorted by start; each frees its cost at start + span.
    freed = 0.0
    for start, cost in entries:
        freed += cost
        if freed >= need - EPSILON:
            return _wait(start + span, now)
    return math.inf  # unreachable while need <= total


@dataclass(frozen=True, slots=True)
class _LimitWindow(_Stepper):
    # What the window algorithms share: a limit per window of seconds, validated once.
    limit: float
    window: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit", _positive("limit", self.limit))
        object.__setattr__(self, "window", _seconds("window", self.window))

    def params(self) -> tuple[float, float]:
        return (self.limit, self.window)

    def scaled(self, factor: float) -> Self:
        return replace(self, limit=self.limit * factor)


@dataclass(frozen=True, slots=True)
class SlidingWindowLog(_LimitWindow):
    """At most ``limit`` units in any ``window`` seconds, exactly (one entry per hit).

    An entry made at ``t`` counts while ``now < t + window``. Costs count in whole
    units (a fractional cost is rounded up). Memory per key: at most ``limit``
    entries (in Redis, one sorted-set member per unit).
    """

    kind: ClassVar[str] = "sliding_window_log"

    def advance(self, state: State, now: float, cost: float, lease: str = "") -> Outcome:
        cost = math.ceil(cost - EPSILON)  # whole units, as the Redis log stores them
        entries: tuple[tuple[float, float], ...] = state or ()
        if entries:
            now = max(now, entries[-1][0])
            entries = tuple(e for e in entries if e[0] + self.window - now > EPSILON)
        used = sum(c for _, c in entries)
        reset = _wait(entries[-1][0] + self.window, now) if entries else 0.0
        if cost > self.limit:
            return _denied(state, self.limit - used, reset, math.inf)
        if used + cost > self.limit + EPSILON:
            retry = _free_by(entries, used + cost - self.limit, self.window, now)
            return _denied(state, self.limit - used, reset, retry)
        if cost > 0:
            entries = (*entries, (now, cost))
            reset = self.window
        return entries, True, max(0.0, self.limit - used - cost), reset, 0.0


@dataclass(frozen=True, slots=True)
class FixedWindow(_LimitWindow):
    """At most ``limit`` units per window ``[k*window, (k+1)*window)``.

    Cheapest; allows up to ``2*limit`` across a window boundary.
    """

    kind: ClassVar[str] = "fixed_window"

    def advance(self, state: State, now: float, cost: float, lease: str = "") -> Outcome:
        index = math.floor((now + EPSILON) / self.window)
        if state is not None and state[0] > index:  # clock stepped back
            index = state[0]
        count = state[1] if state is not None and state[0] == index else 0.0
        reset = _wait((index + 1) * self.window, now)
        if cost > self.limit:
            return _denied(state, self.limit - count, reset, math.inf)
        if count + cost > self.limit + EPSILON:
            return _denied(state, self.limit - count, reset, reset)
        count += cost
        return (index, count), True, max(0.0, self.limit - count), reset if count else 0.0, 0.0


@dataclass(frozen=True, slots=True)
class SlidingWindowCounter(_LimitWindow):
    """Approximate sliding window from two fixed-window counters (what Cloudflare does).

    ``used = previous * (1 - elapsed/window) + current``; admitted when
    ``used + cost <= limit``. The approximation assumes the previous window's hits
    were spread evenly; it never admits more than ``limit`` per fixed window and
    at most ``2*limit`` in any sliding window (typically within a few percent).
    """

    kind: ClassVar[str] = "sliding_window_counter"

    def advance(self, state: State, now: float, cost: float, lease: str = "") -> Outcome:
        w, limit = self.window, self.limit
        index = math.floor((now + EPSILON) / w)
        prev = curr = 0.0
        if state is not None:
            if state[0] > index:  # clock stepped back
                index = state[0]
            if state[0] == index:
                prev, curr = state[1], state[2]
            elif state[0] == index - 1:
                prev = state[2]
        elapsed = now - index * w
        if elapsed < 0.0:
            elapsed = 0.0
        elif elapsed > w:
            elapsed = w
        used = prev * (1.0 - elapsed / w) + curr
        if cost > limit:
            return _denied(state, limit - used, self._reset(prev, curr, elapsed), math.inf)
        if used + cost > limit + EPSILON:
            room = limit - curr - cost
            if room >= -EPSILON and prev > 0:
                # Later in this window: prev * (1 - (elapsed + t)/w) + curr + cost == limit.
                retry = w * (1.0 - room / prev) - elapsed
            else:
                # Next window, where curr becomes the decaying previous count.
                later = w * (1.0 - (limit - cost) / curr) if curr > limit - cost else 0.0
                retry = (w - elapsed) + later
            reset = self._reset(prev, curr, elapsed)
            return _denied(state, limit - used, reset, max(0.0, retry))
        curr += cost
        left = limit - used - cost
        # _reset(), its common case (this window counts) inline
        reset = 2 * w - elapsed if curr > 0 else self._reset(prev, curr, elapsed)
        return (index, prev, curr), True, left if left > 0.0 else 0.0, reset, 0.0

    def _reset(self, prev: float, curr: float, elapsed: float) -> float:
        if curr > 0:
            return 2 * self.window - elapsed
        return self.window - elapsed if prev > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Concurrency(_Stepper):
    """At most ``limit`` units held at once; each hit holds a lease until released.

    A lease that is neither released nor renewed expires ``lease`` seconds after it
    was taken (or last renewed), so a crashed holder cannot leak slots forever.
    """

    kind: ClassVar[str] = "concurrency"
    limit: float
    lease: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit", _positive("limit", self.limit))
        object.__setattr__(self, "lease", _seconds("lease", self.lease))

    window: None = field(default=None, init=False, repr=False, compare=False)

    def params(self) -> tuple[float, float]:
        return (self.limit, self.lease)

    def scaled(self, factor: float) -> Concurrency:
        return replace(self, limit=self.limit * factor)

    def _alive(self, state: State, now: float) -> tuple[tuple[str, float, float], ...]:
        held: tuple[tuple[str, float, float], ...] = state or ()
        return tuple(h for h in held if h[1] - now > EPSILON)

    def advance(self, state: State, now: float, cost: float, lease: str = "") -> Outcome:
        held = self._alive(state, now)
        used = sum(h[2] for h in held)
        reset = _wait(max(h[1] for h in held), now) if held else 0.0
        if cost > self.limit:
            return _denied(state, self.limit - used, reset, math.inf)
        if used + cost > self.limit + EPSILON:
            by_expiry = sorted((h[1], h[2]) for h in held)
            retry = _free_by(by_expiry, used + cost - self.limit, 0.0, now)
            return _denied(state, self.limit - used, reset, retry)
        if cost > 0:
            held = (*held, (lease, now + self.lease, cost))
            reset = max(reset, self.lease)
        return held, True, max(0.0, self.limit - used - cost), reset, 0.0

    def release(self, state: State, lease: str, now: float) -> tuple[State, float]:
        """Drop ``lease``; return the new state and its time to live."""
        held = tuple(h for h in self._alive(state, now) if h[0] != lease)
        return held, _wait(max((h[1] for h in held), default=now), now)

    def renew(self, state: State, lease: str, now: float) -> tuple[State, float, bool]:
        """Extend ``lease`` to ``now + lease``; ``False`` when it had expired already."""
        held = self._alive(state, now)
        found = any(h[0] == lease for h in held)
        held = tuple((h[0], now + self.lease, h[2]) if h[0] == lease else h for h in held)
        return held, _wait(max((h[1] for h in held), default=now), now), found


@dataclass(frozen=True, slots=True)
class LimitRequest:
    """One limit to decide: the algorithm, the client key, its policy name, the cost."""

    algorithm: Algorithm
    key: str
    name: str
    cost: float = 1.0
    lease: str = ""


def decide_group(
    requests: Sequence[LimitRequest], states: Sequence[State], now: float
) -> tuple[list[State] | None, list[Decision]]:
    """Decide several limits all or nothing.

    Returns the new states (``None`` when any limit denied, so nothing may be
    written) and one decision per request, named after it. When the group is
    denied, the limits that would have admitted report their quota untouched.
    """
    outcomes = [
        r.algorithm.advance(s, now, r.cost, r.lease) for r, s in zip(requests, states, strict=True)
    ]
    committed = all(o[1] for o in outcomes)
    decisions = []
    for r, s, o in zip(requests, states, outcomes):
        if not committed and o[1]:
            o = r.algorithm.advance(s, now, 0.0)
        decisions.append(make_decision(r.algorithm, r.name, o, r.lease if committed else ""))
    return ([o[0] for o in outcomes] if committed else None), decisions


def make_decision(algorithm: Algorithm, name: str, outcome: Outcome, lease: str = "") -> Decision:
    """The Decision for ``outcome`` of ``algorithm`` under policy ``name``."""
    _, allowed, remaining, reset, retry = outcome
    return Decision(
        allowed,
        algorithm.limit,
        remaining,
        reset,
        retry,
        name,
        algorithm.window,
        lease if lease and allowed else None,
    )


def check_cost(cost: float) -> float:
    """``cost`` as a float; ConfigError unless it is >= 0 and finite."""
    if not 0 <= cost < math.inf:  # NaN fails the comparison too
        raise ConfigError("cost", f"must be >= 0 and finite, got {cost!r}")
    return float(cost)


def outage_decision(request: LimitRequest, allowed: bool, retry_after: float) -> Decision:
    """What ``on_store_error="open"`` / ``"closed"`` answers while the store is down."""
    algorithm = request.algorithm
    return Decision(
        allowed,
        algorithm.limit,
        algorithm.limit if allowed else 0.0,
        0.0 if allowed else retry_after,
        0.0 if allowed else retry_after,
        name=request.name,
        window=algorithm.window,
    )
