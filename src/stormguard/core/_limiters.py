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
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, ClassVar, Protocol, TypeAlias

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
    "SlidingWindowCounter",
    "SlidingWindowLog",
    "TokenBucket",
    "combine",
    "decide_group",
    "default_name",
    "outage_decision",
]

EPSILON = 1e-6

State: TypeAlias = Any
Step: TypeAlias = tuple[State, "Decision"]


def _seconds(name: str, value: object) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(name, f"must be a number of seconds or a timedelta, got {value!r}")
    seconds = float(value)
    if not (0 < seconds < math.inf):
        raise ConfigError(name, f"must be > 0 and finite, got {value!r}")
    return seconds


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(name, f"must be a number, got {value!r}")
    number = float(value)
    if not (0 < number < math.inf):
        raise ConfigError(name, f"must be > 0 and finite, got {value!r}")
    return number


def _wait(deadline: float, now: float) -> float:
    return max(0.0, deadline - now)


def _denied(limit: float, remaining: float, reset_after: float, retry_after: float) -> Decision:
    return Decision(False, limit, max(0.0, remaining), max(0.0, reset_after), retry_after)


def _allowed(limit: float, remaining: float, reset_after: float) -> Decision:
    return Decision(True, limit, max(0.0, remaining), max(0.0, reset_after), 0.0)


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

    def step(self, state: State, now: float, cost: float, lease: str = "") -> Step:
        """Decide one hit of ``cost`` at ``now``; return the new state and the decision."""
        ...


def default_name(algorithm: Algorithm) -> str:
    """A name that differs whenever the parameters differ (policy name, key part)."""
    first, second = algorithm.params()
    return f"{algorithm.kind}:{first:g}:{second:g}"


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """A bucket of ``burst`` tokens refilled at ``rate`` tokens per second.

    ``tokens(t) = min(burst, tokens(t0) + (t - t0) * rate)``; a hit of ``cost`` is
    admitted when ``cost <= tokens``; ``retry_after = (cost - tokens) / rate``.
    """

    kind: ClassVar[str] = "token_bucket"
    rate: float
    burst: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", _positive("rate", self.rate))
        object.__setattr__(self, "burst", _positive("burst", self.burst))

    @property
    def limit(self) -> float:
        return self.burst

    @property
    def window(self) -> float | None:
        return self.burst / self.rate

    def params(self) -> tuple[float, float]:
        return (self.rate, self.burst)

    def scaled(self, factor: float) -> TokenBucket:
        return replace(self, rate=self.rate * factor, burst=self.burst * factor)

    def step(self, state: State, now: float, cost: float, lease: str = "") -> Step:
        if state is None:
            tokens, last = self.burst, now
        else:
            tokens, last = state
            now = max(now, last)
            tokens = min(self.burst, tokens + (now - last) * self.rate)
        if cost > self.burst:
            return state, _denied(self.burst, tokens, 0.0, math.inf)
        if cost > tokens + EPSILON:
            reset = (self.burst - tokens) / self.rate
            return state, _denied(self.burst, tokens, reset, (cost - tokens) / self.rate)
        tokens -= cost
        return (tokens, now), _allowed(self.burst, tokens, (self.burst - tokens) / self.rate)


@dataclass(frozen=True, slots=True)
class GCRA:
    """Generic cell rate algorithm (leaky bucket as a meter), one timestamp per key.

    Emission interval ``T = 1/rate``, tolerance ``tau = burst * T``. State is the
    theoretical arrival time ``tat``; a hit is admitted when
    ``max(tat, now) + cost*T - tau <= now``, and then ``tat += cost*T``.
    Admits exactly what ``TokenBucket(rate, burst)`` admits.
    """

    kind: ClassVar[str] = "gcra"
    rate: float
    burst: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", _positive("rate", self.rate))
        object.__setattr__(self, "burst", _positive("burst", self.burst))

    @property
    def limit(self) -> float:
        return self.burst

    @property
    def window(self) -> float | None:
        return self.burst / self.rate

    def params(self) -> tuple[float, float]:
        return (self.rate, self.burst)

    def scaled(self, factor: float) -> GCRA:
        return replace(self, rate=self.rate * factor, burst=self.burst * factor)

    def step(self, state: State, now: float, cost: float, lease: str = "") -> Step:
        tat = now if state is None else max(state, now)
        tau = self.burst / self.rate
        if cost > self.burst:
            return state, _denied(self.burst, (tau - (tat - now)) * self.rate, tat - now, math.inf)
        new_tat = tat + cost / self.rate
        allow_at = new_tat - tau
        if allow_at > now + EPSILON:
            remaining = (tau - (tat - now)) * self.rate
            return state, _denied(self.burst, remaining, tat - now, allow_at - now)
        remaining = (tau - (new_tat - now)) * self.rate
        return new_tat, _allowed(self.burst, remaining, new_tat - now)


def _free_by(entries: Sequence[tuple[float, float]], need: float, span: float, now: float) -> float:
    # Entries are (start, cost) sorted by start; each frees its cost at start + span.
    freed = 0.0
    for start, cost in entries:
        freed += cost
        if freed >= need - EPSILON:
            return _wait(start + span, now)
    return math.inf  # unreachable while need <= total


@dataclass(frozen=True, slots=True)
class SlidingWindowLog:
    """At most ``limit`` units in any ``window`` seconds, exactly (one entry per hit).

    An entry made at ``t`` counts while ``now < t + window``. Memory per key is one
    entry per admitted hit, so at most ``limit`` entries.
    """

    kind: ClassVar[str] = "sliding_window_log"
    limit: float
    window: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit", _positive("limit", self.limit))
        object.__setattr__(self, "window", _seconds("window", self.window))

    def params(self) -> tuple[float, float]:
        return (self.limit, self.window)

    def scaled(self, factor: float) -> SlidingWindowLog:
        return replace(self, limit=self.limit * factor)

    def step(self, state: State, now: float, cost: float, lease: str = "") -> Step:
        entries: tuple[tuple[float, float], ...] = state or ()
        if entries:
            now = max(now, entries[-1][0])
            entries = tuple(e for e in entries if e[0] + self.window - now > EPSILON)
        used = sum(c for _, c in entries)
        reset = _wait(entries[-1][0] + self.window, now) if entries else 0.0
        if cost > self.limit:
            return state, _denied(self.limit, self.limit - used, reset, math.inf)
        if used + cost > self.limit + EPSILON:
            retry = _free_by(entries, used + cost - self.limit, self.window, now)
            return state, _denied(self.limit, self.limit - used, reset, retry)
        if cost > 0:
            entries = (*entries, (now, cost))
            reset = self.window
        return entries, _allowed(self.limit, self.limit - used - cost, reset)


@dataclass(frozen=True, slots=True)
class FixedWindow:
    """At most ``limit`` units per window ``[k*window, (k+1)*window)``.

    Cheapest; allows up to ``2*limit`` across a window boundary.
    """

    kind: ClassVar[str] = "fixed_window"
    limit: float
    window: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit", _positive("limit", self.limit))
        object.__setattr__(self, "window", _seconds("window", self.window))

    def params(self) -> tuple[float, float]:
        return (self.limit, self.window)

    def scaled(self, factor: float) -> FixedWindow:
        return replace(self, limit=self.limit * factor)

    def step(self, state: State, now: float, cost: float, lease: str = "") -> Step:
        index = math.floor((now + EPSILON) / self.window)
        if state is not None and state[0] > index:  # clock stepped back
            index = state[0]
        count = state[1] if state is not None and state[0] == index else 0.0
        reset = _wait((index + 1) * self.window, now)
        if cost > self.limit:
            return state, _denied(self.limit, self.limit - count, reset, math.inf)
        if count + cost > self.limit + EPSILON:
            return state, _denied(self.limit, self.limit - count, reset, reset)
        count += cost
        return (index, count), _allowed(self.limit, self.limit - count, reset if count else 0.0)


@dataclass(frozen=True, slots=True)
class SlidingWindowCounter:
    """Approximate sliding window from two fixed-window counters (what Cloudflare does).

    ``used = previous * (1 - elapsed/window) + current``; admitted when
    ``used + cost <= limit``. The approximation assumes the previous window's hits
    were spread evenly; it never admits more than ``limit`` per fixed window and
    at most ``2*limit`` in any sliding window (typically within a few percent).
    """

    kind: ClassVar[str] = "sliding_window_counter"
    limit: float
    window: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit", _positive("limit", self.limit))
        object.__setattr__(self, "window", _seconds("window", self.window))

    def params(self) -> tuple[float, float]:
        return (self.limit, self.window)

    def scaled(self, factor: float) -> SlidingWindowCounter:
        return replace(self, limit=self.limit * factor)

    def step(self, state: State, now: float, cost: float, lease: str = "") -> Step:
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
        elapsed = min(w, max(0.0, now - index * w))
        weight = 1.0 - elapsed / w
        used = prev * weight + curr
        if cost > limit:
            return state, _denied(limit, limit - used, self._reset(prev, curr, elapsed), math.inf)
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
            return state, _denied(limit, limit - used, reset, max(0.0, retry))
        curr += cost
        reset = self._reset(prev, curr, elapsed)
        return (index, prev, curr), _allowed(limit, limit - used - cost, reset)

    def _reset(self, prev: float, curr: float, elapsed: float) -> float:
        if curr > 0:
            return 2 * self.window - elapsed
        return self.window - elapsed if prev > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Concurrency:
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

    @property
    def window(self) -> float | None:
        return None

    def params(self) -> tuple[float, float]:
        return (self.limit, self.lease)

    def scaled(self, factor: float) -> Concurrency:
        return replace(self, limit=self.limit * factor)

    def _alive(self, state: State, now: float) -> tuple[tuple[str, float, float], ...]:
        held: tuple[tuple[str, float, float], ...] = state or ()
        return tuple(h for h in held if h[1] - now > EPSILON)

    def step(self, state: State, now: float, cost: float, lease: str = "") -> Step:
        held = self._alive(state, now)
        used = sum(h[2] for h in held)
        reset = _wait(max(h[1] for h in held), now) if held else 0.0
        if cost > self.limit:
            return state, _denied(self.limit, self.limit - used, reset, math.inf)
        if used + cost > self.limit + EPSILON:
            by_expiry = sorted((h[1], h[2]) for h in held)
            retry = _free_by(by_expiry, used + cost - self.limit, 0.0, now)
            return state, _denied(self.limit, self.limit - used, reset, retry)
        if cost > 0:
            held = (*held, (lease, now + self.lease, cost))
            reset = max(reset, self.lease)
        decision = _allowed(self.limit, self.limit - used - cost, reset)
        return held, replace(decision, lease=lease or None) if cost > 0 else decision

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
    steps = [
        r.algorithm.step(s, now, r.cost, r.lease) for r, s in zip(requests, states, strict=True)
    ]
    if all(d.allowed for _, d in steps):
        return [s for s, _ in steps], [_named(r, d) for r, (_, d) in zip(requests, steps)]
    decisions = []
    for r, s, (_, d) in zip(requests, states, steps):
        if d.allowed:
            d = r.algorithm.step(s, now, 0.0)[1]
        decisions.append(_named(r, d))
    return None, decisions


def _named(request: LimitRequest, decision: Decision) -> Decision:
    return replace(decision, name=request.name, window=request.algorithm.window)


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
