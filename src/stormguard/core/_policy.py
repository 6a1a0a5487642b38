# The retry policy as a state machine.
#
#   decide(policy, state, failure, now=..., rng=...) -> Retry | GiveUp
#
# `state` is a frozen RetryState (attempts made, when the call started, the last
# wait drawn). `failure` describes the attempt that just failed: whether the
# decision table allows another try, and the server's wait hint if it gave one.
# The rules, in order:
#   1. not retryable by the table                   -> GiveUp(NOT_RETRYABLE)
#   2. attempts used up                             -> GiveUp(ATTEMPTS_EXHAUSTED)
#   3. a server hint longer than max_wait           -> GiveUp(HINT_TOO_LONG, hint)
#   4. wait = hint if there is one, else the backoff draw
#   5. now + wait past the deadline                 -> GiveUp(HINT_TOO_LONG) for a
#      hint (the caller can reschedule), GiveUp(DEADLINE) for a backoff draw
#   6. otherwise                                    -> Retry(wait)
# Budgets and breakers are stateful and may be shared across processes, so they
# are consulted by the driver after `decide` says Retry (the seam: a Retry can
# still become GiveUp(BUDGET_EXHAUSTED) or GiveUp(CIRCUIT_OPEN)).
from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .._errors import ConfigError
from ._backoff import Backoff, FullJitter, seconds
from ._outcome import DEFAULT_RETRY_STATUSES

__all__ = [
    "GiveUp",
    "GiveUpReason",
    "Retry",
    "RetryFailure",
    "RetryPolicy",
    "RetryState",
    "decide",
]


class GiveUpReason(enum.StrEnum):
    """Why a retrying call stopped."""

    NOT_RETRYABLE = "not retryable"
    ATTEMPTS_EXHAUSTED = "attempts exhausted"
    DEADLINE = "deadline"
    HINT_TOO_LONG = "hint too long"
    BUDGET_EXHAUSTED = "retry budget exhausted"
    CIRCUIT_OPEN = "circuit open"


def _default_exceptions() -> tuple[type[BaseException], ...]:
    return (Exception,)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How to retry: a frozen, validated value. Change it with ``dataclasses.replace``.

    * ``attempts``: total attempts including the first (>= 1; default 4).
    * ``backoff``: the wait after the n-th failure when the server gives no hint
      (default ``FullJitter(0.5, 30)``: ``uniform(0, min(30, 0.5 * 2**(n-1)))``).
    * ``deadline``: seconds for the whole call including waits (> 0; default 60).
    * ``max_wait``: the longest server-advised wait honoured (>= 0; default 60).
      A longer hint ends the call at once so the caller can reschedule.
    * ``retry_statuses``: HTTP statuses worth retrying (default 408, 425, 429, 502,
      503, 504); each must be 400-599.
    * ``retry_exceptions``: exception types worth retrying (the decorator's ``on``).
    * ``budget``/``breaker``: optional :class:`RetryBudget` / :class:`CircuitBreaker`.
    """

    attempts: int = 4
    backoff: Backoff = field(default_factory=lambda: FullJitter(0.5, 30.0))
    deadline: float | timedelta = 60.0
    max_wait: float | timedelta = 60.0
    retry_statuses: Collection[int] = DEFAULT_RETRY_STATUSES
    retry_exceptions: type[BaseException] | tuple[type[BaseException], ...] = field(
        default_factory=_default_exceptions
    )
    budget: Any = None
    breaker: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ConfigError("attempts", f"must be an integer >= 1, got {self.attempts!r}")
        if self.attempts < 1:
            raise ConfigError("attempts", f"must be >= 1 (1 means no retry), got {self.attempts}")
        if not callable(getattr(self.backoff, "delay", None)):
            raise ConfigError("backoff", f"must have a delay() method, got {self.backoff!r}")
        object.__setattr__(self, "deadline", seconds(self.deadline, "deadline", allow_zero=False))
        object.__setattr__(self, "max_wait", seconds(self.max_wait, "max_wait"))
        statuses = frozenset(self.retry_statuses)
        for status in statuses:
            if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
                raise ConfigError(
                    "retry_statuses", f"each status must be an integer 400-599, got {status!r}"
                )
        object.__setattr__(self, "retry_statuses", statuses)
        exceptions = self.retry_exceptions
        if not isinstance(exceptions, tuple):
            exceptions = (exceptions,)
        for exc in exceptions:
            if not (isinstance(exc, type) and issubclass(exc, BaseException)):
                raise ConfigError(
                    "retry_exceptions", f"each entry must be an exception class, got {exc!r}"
                )
        object.__setattr__(self, "retry_exceptions", tuple(exceptions))
        for name, needed in (("budget", "try_retry"), ("breaker", "acquire")):
            value = getattr(self, name)
            if value is not None and not callable(getattr(value, needed, None)):
                raise ConfigError(name, f"must provide {needed}(), got {value!r}")

    @property
    def deadline_s(self) -> float:
        """The deadline in seconds (normalised at construction)."""
        assert isinstance(self.deadline, float)
        return self.deadline

    @property
    def max_wait_s(self) -> float:
        """``max_wait`` in seconds (normalised at construction)."""
        assert isinstance(self.max_wait, float)
        return self.max_wait

    def replace(self, **changes: Any) -> RetryPolicy:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class RetryState:
    """Where a logical call stands: attempts made so far, start time, last wait."""

    started_at: float
    attempts: int = 1
    previous_wait: float | None = None

    def after_wait(self, wait: float) -> RetryState:
        """The state for the next attempt, after waiting ``wait`` seconds."""
        return RetryState(self.started_at, self.attempts + 1, wait)


@dataclass(frozen=True, slots=True)
class RetryFailure:
    """The attempt that just failed, as the decision needs it.

    ``retryable`` is the decision table's answer; ``hint`` the server's wait hint in
    seconds (``None`` if it gave none); ``reason`` a short text for logs.
    """

    retryable: bool
    reason: str
    hint: float | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """Try again after ``wait`` seconds; ``hint_used`` says whether the server chose it."""

    wait: float
    hint_used: bool = False


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop now, for ``reason``; ``hint`` is the server's wait when one was seen."""

    reason: GiveUpReason
    hint: float | None = None


def decide(
    policy: RetryPolicy,
    state: RetryState,
    failure: RetryFailure,
    *,
    now: float,
    rng: random.Random,
) -> Retry | GiveUp:
    """Decide what follows a failed attempt. Pure: ``now`` and ``rng`` are inputs."""
    hint = failure.hint
    if not failure.retryable:
        return GiveUp(GiveUpReason.NOT_RETRYABLE, hint)
    if state.attempts >= policy.attempts:
        return GiveUp(GiveUpReason.ATTEMPTS_EXHAUSTED, hint)
    remaining = policy.deadline_s - (now - state.started_at)
    if hint is not None:
        if hint > policy.max_wait_s or hint >= remaining:
            return GiveUp(GiveUpReason.HINT_TOO_LONG, hint)
        return Retry(hint, hint_used=True)
    wait = policy.backoff.delay(state.attempts, rng, state.previous_wait)
    if wait >= remaining:
        return GiveUp(GiveUpReason.DEADLINE)
    return Retry(wait)
