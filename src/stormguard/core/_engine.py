# The retry conversation, written once, as a generator of effects (sans-I/O).
#
# One logical call (a decorated function, a retrying() block, an HTTP request, a
# gRPC call) is a conversation between the policy and the world. The machine says
# what to do next; a driver does it and sends the answer back:
#
#   effect    the driver ...                                  and sends back
#   --------  ----------------------------------------------  ----------------------
#   COUNT     counts the first attempt in the budget           None
#   PACE      asks the front end for its cooldown/pacing wait   seconds (0: none)
#   ADMIT     asks the breaker for a permit                     the permit, or the
#                                                               CircuitOpen refusal
#   SEND      has the front end make one attempt                (Outcome, now)
#   RECORD    reports the attempt to the permit (arg: failed)   None
#   PEEK      asks how long the breaker stays open              seconds
#   SPEND     withdraws one retry from the budget               True / False
#             (arg: the failure, which a quota prices)
#   OUTCOME   tells a budget that records outcomes (a quota,     None
#             gRPC's throttling) how an attempt was answered
#             (arg: a Verdict)
#   NOTIFY    tells hooks and the log (arg: a Notice)           None
#   DISCARD   has the front end drop a failed attempt's value   None
#             (closes a response before the wait; arg: Outcome)
#   GIVE_UP   tells hooks and the log the call gave up          None
#             (arg: a Notice whose retry is the GiveUp)
#   SLEEP     waits (arg: seconds)                              None
#
# The order, written once here:
#
#   COUNT (if a budget)
#   loop:
#     PACE, SLEEP (front ends with per-origin pacing)
#     ADMIT (if a breaker): refused on the first attempt -> Finish(refusal);
#                           later -> Finish(last outcome, GiveUp(CIRCUIT_OPEN))
#     SEND; RECORD (if admitted); OUTCOME (if the budget records outcomes)
#     the outcome ends the call (success, a final answer)     -> Finish(outcome)
#     decide(): GiveUp                                         -> Finish(GiveUp)
#     PEEK (if a breaker): open longer than the wait           -> Finish(CIRCUIT_OPEN)
#     SPEND (if a budget): refused                             -> Finish(BUDGET_EXHAUSTED)
#     NOTIFY; DISCARD (if the attempt returned a value); SLEEP
#   every GiveUp is told once (GIVE_UP) before the Finish, except a failure the
#   table never retries on the first attempt (that is the call's answer, not a
#   retry that gave up) and a refusal of the first attempt (the caller sees it).
#
# The machine reads no clock (SEND's answer carries `now`), never sleeps and never
# calls a breaker, budget or store: it cannot pick a sync call where an async one
# was needed, because it calls nothing. client/_engine.py holds the two drivers.
# Whether an attempt failed, and how, is the front end's translation (Outcome);
# whether to retry it is `decide()`'s.
from __future__ import annotations

import random
from collections.abc import Generator
from typing import Any, Final, NamedTuple

from .._errors import CircuitOpen
from ._policy import GiveUp, GiveUpReason, Retry, RetryFailure, RetryPolicy, RetryState, decide

__all__ = [
    "ADMIT",
    "COUNT",
    "DISCARD",
    "GIVE_UP",
    "NOTIFY",
    "OUTCOME",
    "PACE",
    "PEEK",
    "RECORD",
    "SEND",
    "SLEEP",
    "SPEND",
    "Conversation",
    "Finish",
    "Notice",
    "Outcome",
    "Steps",
    "Verdict",
    "records_outcomes",
    "verdict",
]

COUNT: Final = "count"
PACE: Final = "pace"
ADMIT: Final = "admit"
SEND: Final = "send"
RECORD: Final = "record"
PEEK: Final = "peek"
SPEND: Final = "spend"
NOTIFY: Final = "notify"
SLEEP: Final = "sleep"
DISCARD: Final = "discard"
GIVE_UP: Final = "give up"
OUTCOME: Final = "outcome"


class Outcome(NamedTuple):
    """One attempt, as the front end translated it.

    ``failure`` is ``None`` when the attempt ends the call as it is (a success, a
    final answer, an exception not ours to retry). ``against_server`` says whether
    a breaker counts it as the upstream failing. ``value`` is what the attempt
    returned (a response, a result), ``error`` what it raised; ``detail`` what the
    front end wants told with a retry or a give-up (opaque to the machine).
    """

    failure: RetryFailure | None
    against_server: bool = False
    value: Any = None
    error: BaseException | None = None
    detail: Any = None  # what the front end tells the log (a response's body, quota)

    def result(self) -> Any:
        """The attempt's value, or its exception raised."""
        if self.error is not None:
            raise self.error
        return self.value


class Notice(NamedTuple):
    """A retry about to happen (``retry``: the wait chosen), or the call giving up
    (``retry`` is the GiveUp): the attempt that failed and why."""

    attempt: int
    retry: Retry | GiveUp
    failure: RetryFailure | None
    elapsed: float
    detail: Any = None


class Finish(NamedTuple):
    """How the conversation ended.

    ``outcome``: the last attempt's (``None`` when the breaker refused the first
    attempt). ``give_up``: why the policy stopped, or ``None`` when the outcome
    ended the call by itself. ``attempts``: attempts sent. ``refusal``: the
    breaker's CircuitOpen when it refused an attempt.
    """

    outcome: Outcome | None
    give_up: GiveUp | None
    attempts: int
    refusal: BaseException | None = None

    def result(self) -> Any:
        """What a transport-like front end answers: the refusal, else the last outcome."""
        outcome = self.outcome
        if outcome is None:
            assert self.refusal is not None
            raise self.refusal
        if outcome.error is not None:
            raise outcome.error
        return outcome.value


Steps = Generator[tuple[str, Any], Any, Finish]


class Verdict(NamedTuple):
    """How an attempt was answered, as a token budget counts it (OUTCOME's arg).

    ``success``: it ended the call as an answer (no failure to judge). ``failed``:
    a failure that is the server's (a fault, a throttle, a pushback saying not to
    retry) -- a malformed request is neither. ``retried``: the attempt was a
    retry; ``throttled``: the failure that retry followed was a throttle (a
    quota refunds that price on success).
    """

    success: bool
    failed: bool
    retried: bool
    throttled: bool


def verdict(outcome: Outcome, retried: bool = False, throttled: bool = False) -> Verdict:
    """The Verdict of ``outcome`` (see :class:`Verdict`)."""
    failure = outcome.failure
    if failure is None:
        return Verdict(True, False, retried, throttled)
    failed = (
        failure.retryable
        or failure.throttled
        or outcome.against_server
        or failure.should_retry is False
    )
    return Verdict(False, failed, retried, throttled)


def records_outcomes(budget: Any) -> bool:
    """Whether ``budget`` wants every attempt's answer (OUTCOME) and prices retries."""
    return budget is not None and getattr(budget, "records_outcomes", False) is True


class Conversation:
    """One logical call's retry conversation (see the module comment).

    ``started_at`` is the driver's monotonic reading before the first attempt;
    ``paced`` asks the front end for a PACE wait before each attempt.
    """

    __slots__ = ("paced", "policy", "rng", "started_at", "state")

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        started_at: float,
        rng: random.Random,
        paced: bool = False,
    ) -> None:
        self.policy = policy
        self.rng = rng
        self.paced = paced
        self.started_at = started_at
        # The retry state is only built once an attempt has failed: a call that
        # succeeds at once (nearly all of them) never needs it.
        self.state: RetryState | None = None

    @property
    def attempts(self) -> int:
        """The number of the current (or last) attempt, 1-based."""
        state = self.state
        return 1 if state is None else state.attempts

    def remaining(self, now: float) -> float:
        """Seconds left before the deadline at ``now`` (``inf`` without a deadline)."""
        return self.policy.deadline_s - (now - self.started_at)

    def pace_limit(self, now: float) -> float:
        """The longest pacing wait worth taking at ``now``: the time left, at most max_wait."""
        return max(0.0, min(self.remaining(now), self.policy.max_wait_s))

    def steps(self, first: tuple[Outcome, float] | None = None) -> Steps:
        """The conversation. ``first``: the first attempt's (Outcome, now), when the
        front end already made it (a fast lane with neither breaker nor budget)."""
        policy = self.policy
        breaker = policy.breaker
        budget = policy.budget
        outcomes = records_outcomes(budget)
        if first is None and budget is not None:
            yield COUNT, None
        pending = first
        last: Outcome | None = None
        throttled = False  # whether the failure the current attempt retries was a throttle
        now = self.started_at  # when the last attempt ended
        while True:
            if pending is None:
                if self.paced:
                    wait = yield PACE, None
                    if wait:
                        yield SLEEP, wait
                permit = None
                if breaker is not None:
                    permit = yield ADMIT, None
                    if isinstance(permit, CircuitOpen):  # the breaker refused
                        sent = self.attempts - 1
                        if last is None:
                            return Finish(None, None, sent, permit)
                        give_up = GiveUp(GiveUpReason.CIRCUIT_OPEN, permit.remaining)
                        elapsed = now - self.started_at
                        notice = Notice(sent, give_up, last.failure, elapsed, last.detail)
                        yield GIVE_UP, notice
                        return Finish(last, give_up, sent, permit)
                outcome, now = yield SEND, None
                if permit is not None:
                    yield RECORD, (permit, outcome.against_server)
            else:
                outcome, now = pending
                pending = None
            last = outcome
            failure = outcome.failure
            if outcomes:
                yield OUTCOME, verdict(outcome, self.attempts > 1, throttled)
            if failure is None:
                return Finish(outcome, None, self.attempts)
            state = self.state
            if state is None:
                state = self.state = RetryState(started_at=self.started_at)
            action = decide(policy, state, failure, now=now, rng=self.rng)
            if isinstance(action, Retry) and breaker is not None:
                open_for = yield PEEK, None
                if open_for > action.wait:
                    # The breaker stays open past the wait: the retry would be refused.
                    action = GiveUp(GiveUpReason.CIRCUIT_OPEN, open_for)
            if isinstance(action, Retry) and budget is not None and not (yield SPEND, failure):
                action = GiveUp(GiveUpReason.BUDGET_EXHAUSTED, failure.hint)
            throttled = failure.throttled
            if isinstance(action, GiveUp):
                if action.reason is not GiveUpReason.NOT_RETRYABLE or state.attempts > 1:
                    elapsed = now - state.started_at
                    yield GIVE_UP, Notice(state.attempts, action, failure, elapsed, outcome.detail)
                return Finish(outcome, action, state.attempts)
            elapsed = now - state.started_at
            yield NOTIFY, Notice(state.attempts, action, failure, elapsed, outcome.detail)
            self.state = state.after_wait(action.wait)
            if outcome.value is not None:
                yield DISCARD, outcome
            yield SLEEP, action.wait
