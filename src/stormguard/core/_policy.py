# The retry policy as a state machine.
#
#   decide(policy, state, failure, now=..., rng=...) -> Retry | GiveUp
#
# `state` is a frozen RetryState (attempts made, when the call started, the last
# wait drawn). `failure` describes the attempt that just failed: the decision
# table's answer, the server's wait hint and should-retry verdict if it gave them,
# whether repeating could act twice, and the response or exception itself.
#
# Who decides whether to retry, in order (DESIGN.md, pinned decisions):
#   a. the server says "should retry: false"        -> GiveUp(NOT_RETRYABLE)
#   b. the server says "should retry: true"         -> retryable, even an unkeyed
#      POST and a status outside the table (the server vouches it did nothing)
#   c. policy.retry_if(subject): True -> retryable unless repeating may act twice
#      (an unkeyed POST that may have been processed); False -> not; None -> (d)
#   d. the decision table (failure.retryable)
# Then, for a retryable failure:
#   1. not retryable                                -> GiveUp(NOT_RETRYABLE)
#   2. attempts used up                             -> GiveUp(ATTEMPTS_EXHAUSTED)
#   3. a positive server hint longer than max_wait  -> GiveUp(HINT_TOO_LONG, hint)
#   4. wait = hint + uniform(0, min(1 s, 10% of hint)) for a positive hint (the
#      jitter is added after the max_wait comparison, so a 60 s hint is honoured
#      with max_wait=60, and a fleet told "reset at 12:00:00" does not arrive in
#      the same millisecond); a hint of 0 (or a date in the past) asks for no wait
#      at all, so the backoff draw is used instead and clients do not retry in
#      lockstep; no hint -> the backoff draw
#   5. now + wait past the deadline                 -> GiveUp(HINT_TOO_LONG) for a
#      hint (the caller can reschedule), GiveUp(DEADLINE) for a backoff draw (the
#      policy's throttle_backoff after a throttling failure, when it has one); the
#      jitter on a hint is shrunk to fit the time left rather than fail the call
#   6. otherwise                                    -> Retry(wait)
# deadline=None means no overall deadline: the time left is infinite and only
# `attempts` (and max_wait) bound the call.
# Budgets and breakers are stateful and may be shared across processes, so they
# are consulted by the driver after `decide` says Retry (the seam: a Retry can
# still become GiveUp(BUDGET_EXHAUSTED) or GiveUp(CIRCUIT_OPEN)).
from __future__ import annotations

import dataclasses
import enum
import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .._errors import ConfigError
from ._backoff import Backoff, FullJitter, seconds
from ._outcome import DEFAULT_RETRY_STATUSES
from ._profiles import profile

__all__ = [
    "GiveUp",
    "GiveUpReason",
    "Retry",
    "RetryFailure",
    "RetryPolicy",
    "RetryState",
    "decide",
    "is_retryable",
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
    * ``deadline``: seconds for the whole call including waits (> 0; default 120,
      room for a 60 s server hint after a few attempts), or ``None`` for no overall
      deadline (``attempts`` still bounds the call).
    * ``max_wait``: the longest server-advised wait honoured (>= 0; default 60).
      A longer hint ends the call at once so the caller can reschedule. A positive
      hint is slept with a little jitter added after this comparison:
      ``hint + uniform(0, min(1, 0.1 * hint))``; a hint of 0 uses the backoff draw.
    * ``retry_statuses``: HTTP statuses worth retrying (default 408, 425, 429, 502,
      503, 504); each must be 400-599.
    * ``retry_exceptions``: exception types worth retrying (the decorator's ``on``).
    * ``budget``/``breaker``: optional :class:`RetryBudget` / :class:`CircuitBreaker`.
    * ``retry_if``: an optional predicate called with the failed attempt's response
      (HTTP adapters) or exception, and with the value a decorated function
      returned; ``True`` retries it (even a status outside ``retry_statuses``, such
      as a 409 on GET, or a result such as ``{"status": "pending"}``), ``False``
      never retries it, ``None`` leaves it to the decision table (a value is
      then the call's answer). It cannot make an unkeyed POST that may have
      been processed retryable, and a server's ``x-should-retry`` /
      ``Stripe-Should-Retry`` header overrides it either way.
    * ``reraise``: when retries end, raise the last exception itself instead of
      :class:`RetryError` (the tenacity/stamina habit; default ``False``).
    * ``throttle_backoff``: the wait after a throttling failure (a 429, a
      rate-limit 403, an AWS throttling error, gRPC ``RESOURCE_EXHAUSTED``) when
      the server gives no hint; ``None`` (default): ``backoff`` for every failure.
      The AWS SDKs back off from 1 s after a throttle and from 50 ms otherwise.

    ``RetryPolicy.for_api(name)`` gives the policy a vendor's own SDK follows.
    """

    attempts: int = 4
    backoff: Backoff = field(default_factory=lambda: FullJitter(0.5, 30.0))
    deadline: float | timedelta | None = 120.0
    max_wait: float | timedelta = 60.0
    retry_statuses: Collection[int] = DEFAULT_RETRY_STATUSES
    retry_exceptions: type[BaseException] | tuple[type[BaseException], ...] = field(
        default_factory=_default_exceptions
    )
    budget: Any = None
    breaker: Any = None
    retry_if: Callable[[Any], bool | None] | None = None
    reraise: bool = False
    throttle_backoff: Backoff | None = None

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ConfigError("attempts", f"must be an integer >= 1, got {self.attempts!r}")
        if self.attempts < 1:
            raise ConfigError("attempts", f"must be >= 1 (1 means no retry), got {self.attempts}")
        if not callable(getattr(self.backoff, "delay", None)):
            raise ConfigError("backoff", f"must have a delay() method, got {self.backoff!r}")
        throttle = self.throttle_backoff
        if throttle is not None and not callable(getattr(throttle, "delay", None)):
            raise ConfigError(
                "throttle_backoff", f"must have a delay() method or be None, got {throttle!r}"
            )
        if self.deadline is not None:
            deadline = seconds(self.deadline, "deadline", allow_zero=False)
            object.__setattr__(self, "deadline", deadline)
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
        if self.retry_if is not None and not callable(self.retry_if):
            raise ConfigError(
                "retry_if", f"must be a callable returning True/False/None, got {self.retry_if!r}"
            )
        if not isinstance(self.reraise, bool):
            raise ConfigError("reraise", f"must be True or False, got {self.reraise!r}")

    @property
    def deadline_s(self) -> float:
        """The deadline in seconds (normalised at construction); ``inf`` when ``None``."""
        if self.deadline is None:
            return math.inf
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

    @classmethod
    def for_api(cls, api: str, **changes: Any) -> RetryPolicy:
        """The retry policy a vendor's own SDK follows, as a frozen policy.

        ``api`` is ``"openai"``, ``"anthropic"``, ``"stripe"``, ``"github"`` or
        ``"aws"``: each sets the attempts, backoff, retryable statuses and
        ``max_wait`` of that SDK (docs/client/vendors.md has the table, each row
        citing the SDK file it follows); ``"aws"`` also brings a new
        :class:`stormguard.RetryQuota` and the throttle backoff. ``changes``
        replace any field. A profile never loosens the unkeyed-POST rule: pass
        ``idempotency_keys=True`` to the adapter where the API accepts keys
        (Stripe's SDK keys every POST).
        """
        policy = cls(**profile(api))
        return policy.replace(**changes) if changes else policy


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

    ``retryable`` is the decision table's answer; ``reason`` a short text for logs;
    ``hint`` the server's wait hint in seconds (``None`` if it gave none).
    ``should_retry`` is the server's own verdict (``x-should-retry`` /
    ``Stripe-Should-Retry``: ``True``, ``False``, or ``None`` when it said nothing).
    ``repeat_unsafe`` is ``True`` when the request is not idempotent (an unkeyed
    POST/PATCH) and may have been processed, so repeating it could act twice: only
    the server's ``should_retry=True`` overrides that, never ``retry_if``.
    ``subject`` is what ``RetryPolicy.retry_if`` is called with: the response or
    the exception of the attempt (``None``: the predicate is not consulted).
    ``throttled`` says the server refused for load (a 429 or its equivalents):
    the policy's ``throttle_backoff`` and a quota's throttling price apply.
    """

    retryable: bool
    reason: str
    hint: float | None = None
    should_retry: bool | None = None
    repeat_unsafe: bool = False
    subject: Any = None
    throttled: bool = False


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


# Jitter on a positive server hint: uniform(0, min(1 s, 10 % of the hint)).
_HINT_JITTER_CAP = 1.0
_HINT_JITTER_RATIO = 0.1


def is_retryable(policy: RetryPolicy, failure: RetryFailure) -> bool:
    """Whether ``failure`` may be retried at all: should-retry, then retry_if, then the table."""
    if failure.should_retry is not None:
        return failure.should_retry
    if policy.retry_if is not None and failure.subject is not None:
        verdict = policy.retry_if(failure.subject)
        if verdict is not None:
            return bool(verdict) and not failure.repeat_unsafe
    return failure.retryable


def decide(
    policy: RetryPolicy,
    state: RetryState,
    failure: RetryFailure,
    *,
    now: float,
    rng: random.Random,
) -> Retry | GiveUp:
    """Decide what follows a failed attempt. Pure: ``now`` and ``rng`` are inputs.

    Whether to retry: the server's should-retry verdict, then ``policy.retry_if``,
    then the decision table (see the module comment). How long to wait: a positive
    server hint plus ``uniform(0, min(1, 0.1 * hint))`` jitter, else the backoff.
    """
    hint = failure.hint
    if not is_retryable(policy, failure):
        return GiveUp(GiveUpReason.NOT_RETRYABLE, hint)
    if state.attempts >= policy.attempts:
        return GiveUp(GiveUpReason.ATTEMPTS_EXHAUSTED, hint)
    remaining = policy.deadline_s - (now - state.started_at)
    if hint is not None and hint > 0:
        if hint > policy.max_wait_s or hint >= remaining:
            return GiveUp(GiveUpReason.HINT_TOO_LONG, hint)
        spread = min(_HINT_JITTER_CAP, _HINT_JITTER_RATIO * hint, (remaining - hint) / 2.0)
        return Retry(hint + rng.uniform(0.0, spread), hint_used=True)
    backoff = policy.backoff
    if failure.throttled and policy.throttle_backoff is not None:
        backoff = policy.throttle_backoff
    wait = backoff.delay(state.attempts, rng, state.previous_wait)
    if wait >= remaining:
        return GiveUp(GiveUpReason.DEADLINE)
    return Retry(wait)
