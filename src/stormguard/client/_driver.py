# The two drivers of the retry conversation (core/_engine.py): one performs its
# effects with sync calls, the other awaits the async twins (a breaker or budget
# shared through an AsyncRedisStore, the clock's asleep). Every front end —
# decorator, retrying(), httpx, requests, gRPC — runs its calls through them and
# only translates one attempt into an Outcome:
#
#     run = engine.start(policy, target=...)
#     finish = run.run(send)            # or: await run.arun(asend)
#     return finish.result()            # or map it (RetryError, last response)
#
# `advance()`/`aadvance()` perform effects until the machine asks for an attempt,
# for front ends that cannot hand over a callable (retrying()'s `with attempt:`).
from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import CircuitOpen
from ..core._engine import (
    ADMIT,
    COUNT,
    DISCARD,
    GIVE_UP,
    NOTIFY,
    OUTCOME,
    PACE,
    PEEK,
    RECORD,
    SEND,
    SLEEP,
    SPEND,
    Conversation,
    Finish,
    Notice,
    Outcome,
    Steps,
    records_outcomes,
)
from ..core._policy import GiveUp, Retry, RetryPolicy
from ..core._ratelimit_headers import Quota
from . import _otel

__all__ = ["Detail", "Engine", "RetryHook", "RetryRecord", "Run", "describe_quota", "logger"]

logger = logging.getLogger("stormguard")


@dataclass(frozen=True, slots=True)
class RetryRecord:
    """One retry, as hooks and logs see it.

    ``attempt`` is the number of the attempt that failed (1-based); ``wait`` the
    seconds slept before the next one; ``reason`` why the attempt failed;
    ``hint_used`` whether ``wait`` came from the server (``hint``) rather than the
    backoff; ``elapsed`` seconds since the call started; ``target`` what was
    called (``"GET https://api/x"`` or a function's qualified name). For a failed
    HTTP response, ``body`` is an excerpt of the (small 429/503) body the server
    sent, where APIs say which limit was hit, and ``quota`` the exhausted quota
    its headers named (``None`` when there was none).
    """

    attempt: int
    wait: float
    reason: str
    hint_used: bool
    hint: float | None
    elapsed: float
    target: str
    body: str | None = None
    quota: Quota | None = None


class Detail(NamedTuple):
    """What an HTTP front end tells with a retry or a give-up: body excerpt, quota."""

    body: str | None
    quota: Quota | None


def describe_quota(quota: Quota) -> str:
    """``"quota core 0/5000, resets in 312 s"``: a quota as a log line says it."""
    text = "quota" if quota.name is None else f"quota {quota.name}"
    if quota.remaining is not None or quota.limit is not None:
        remaining = "?" if quota.remaining is None else f"{quota.remaining:g}"
        limit = "?" if quota.limit is None else f"{quota.limit:g}"
        text += f" {remaining}/{limit}"
    if quota.reset_after is not None:
        text += f", resets in {quota.reset_after:.0f} s"
    return text


def _detail_text(detail: Any) -> str:
    if not isinstance(detail, Detail):
        return ""
    text = ""
    if detail.quota is not None:
        text += f"; {describe_quota(detail.quota)}"
    if detail.body:
        text += f"; body: {detail.body}"
    return text


RetryHook = Callable[[RetryRecord], None]
Target = str | Callable[[], str]
Pace = Callable[[float], float]
APace = Callable[[float], Awaitable[float]]
Discard = Callable[[Outcome], None]
ADiscard = Callable[[Outcome], Awaitable[None]]


class Engine:
    """What a front end holds once: its clock, random generator and retry hooks."""

    __slots__ = ("clock", "hooks", "rng")

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        hooks: tuple[RetryHook, ...] = (),
    ) -> None:
        self.clock = clock or SYSTEM_CLOCK
        self.rng = rng or _RNG
        self.hooks = hooks

    def start(
        self,
        policy: RetryPolicy,
        *,
        target: Target,
        started_at: float | None = None,
        pace: tuple[Pace, APace] | None = None,
        discard: tuple[Discard, ADiscard] | None = None,
    ) -> Run:
        """A new call; ``started_at`` defaults to now. ``pace`` (sync, async) answers
        PACE with the front end's own wait; ``discard`` (sync, async) closes a failed
        attempt's value before the wait."""
        if started_at is None:
            started_at = self.clock.monotonic()
        conversation = Conversation(
            policy, started_at=started_at, rng=self.rng, paced=pace is not None
        )
        return Run(self, conversation, target, pace, discard)

    def notify(self, notice: Notice, target: Target) -> None:
        """Tell the hooks and the ``stormguard`` logger about a retry."""
        retry, failure = notice.retry, notice.failure
        assert isinstance(retry, Retry) and failure is not None
        detail = notice.detail if isinstance(notice.detail, Detail) else Detail(None, None)
        record = RetryRecord(
            attempt=notice.attempt,
            wait=retry.wait,
            reason=failure.reason,
            hint_used=retry.hint_used,
            hint=failure.hint,
            elapsed=notice.elapsed,
            target=target if isinstance(target, str) else target(),
            body=detail.body,
            quota=detail.quota,
        )
        if logger.isEnabledFor(logging.INFO):
            fields = {"event": "retry", **dataclasses.asdict(record)}
            logger.info(
                "retrying %s: attempt %d failed (%s); waiting %.3fs%s%s",
                record.target,
                record.attempt,
                record.reason,
                record.wait,
                " as the server asked" if record.hint_used else "",
                _detail_text(detail),
                extra={"stormguard": fields, "stormguard_retry": record},
            )
        _otel.retried(record.attempt, record.wait, record.reason, failure.subject, record.target)
        for hook in self.hooks:
            hook(record)

    def gave_up(self, notice: Notice, target: Target) -> None:
        """Log, once per call, at WARNING, that a call gave up and why (and mark
        the current OpenTelemetry span failed)."""
        give_up, failure = notice.retry, notice.failure
        assert isinstance(give_up, GiveUp)
        subject = None if failure is None else failure.subject
        _otel.gave_up(notice.attempt, str(give_up.reason), subject)
        if not logger.isEnabledFor(logging.WARNING):
            return
        fields = {
            "event": "give_up",
            "target": target if isinstance(target, str) else target(),
            "attempts": notice.attempt,
            "reason": str(give_up.reason),
            "last_failure": None if failure is None else failure.reason,
            "hint": give_up.hint,
            "elapsed": notice.elapsed,
            "body": None,
            "quota": None,
        }
        detail = notice.detail
        if isinstance(detail, Detail):
            fields["body"] = detail.body
            fields["quota"] = None if detail.quota is None else dataclasses.asdict(detail.quota)
        logger.warning(
            "giving up on %s after %d attempt%s: %s (last: %s)%s%s",
            fields["target"],
            notice.attempt,
            "" if notice.attempt == 1 else "s",
            fields["reason"],
            fields["last_failure"],
            "" if give_up.hint is None else f"; the server asked to wait {give_up.hint:.3f}s",
            _detail_text(detail),
            extra={"stormguard": fields},
        )


class Run:
    """One call being driven: the conversation, its steps, the permit in hand."""

    __slots__ = (
        "_discard",
        "_engine",
        "_pace",
        "conversation",
        "finish",
        "permit",
        "steps",
        "target",
    )

    def __init__(
        self,
        engine: Engine,
        conversation: Conversation,
        target: Target,
        pace: tuple[Pace, APace] | None,
        discard: tuple[Discard, ADiscard] | None,
    ) -> None:
        self._engine = engine
        self.conversation = conversation
        self.target = target
        self._pace = pace
        self._discard = discard
        self.steps: Steps | None = None
        self.permit: Any = None
        self.finish: Finish | None = None

    def begin(self, first: Outcome | None = None) -> None:
        """Start the steps; ``first`` is an attempt the front end already made."""
        if first is None:
            self.steps = self.conversation.steps()
        else:
            self.steps = self.conversation.steps((first, self._engine.clock.monotonic()))

    def remaining(self) -> float:
        """Seconds left before the call's deadline."""
        conversation = self.conversation
        now = self._engine.clock.monotonic()
        return conversation.policy.deadline_s - (now - conversation.started_at)

    def sent(self, outcome: Outcome) -> tuple[Outcome, float]:
        """SEND's answer: the outcome and when it ended."""
        return outcome, self._engine.clock.monotonic()

    # -- the sync driver ----------------------------------------------------------

    def run(self, send: Callable[[], Outcome], first: Outcome | None = None) -> Finish:
        """Drive the call to its end, calling ``send`` for each attempt."""
        if first is None and self.bare:
            # Nothing to count, pace or admit before the first attempt: make it
            # at once, and start the conversation only if it failed.
            first = send()
            if first.failure is None:
                return Finish(first, None, 1)
        self.begin(first)
        reply: Any = None
        while self.advance(reply):
            try:
                outcome = send()
            except BaseException:
                self.release()
                raise
            reply = self.sent(outcome)
        assert self.finish is not None
        return self.finish

    @property
    def bare(self) -> bool:
        """True when the policy has no breaker or budget and the front end no pacing."""
        conversation = self.conversation
        policy = conversation.policy
        return policy.breaker is None and policy.budget is None and not conversation.paced

    def _next(self, reply: Any) -> tuple[str | None, Any]:
        """The machine's next effect for a driver (None: it ended), after telling
        hooks and the log whatever it asks to tell (the same for both drivers)."""
        steps = self.steps
        assert steps is not None
        while True:
            try:
                effect, arg = steps.send(reply)
            except StopIteration as stop:
                self.finish = stop.value
                return None, None
            reply = None
            if effect is NOTIFY:
                self._engine.notify(arg, self.target)
            elif effect is GIVE_UP:
                self._engine.gave_up(arg, self.target)
            else:
                return effect, arg

    def advance(self, reply: Any = None) -> bool:
        """Perform effects until the machine asks for an attempt (True) or ends (False)."""
        policy = self.conversation.policy
        while True:
            effect, arg = self._next(reply)
            if effect is SEND or effect is None:
                return effect is SEND
            if effect is ADMIT:
                try:
                    reply = self.permit = policy.breaker.acquire()
                except CircuitOpen as refused:
                    reply = refused
            elif effect is RECORD:
                self.permit = None
                arg[0].record(failure=arg[1])
                reply = None
            elif effect is COUNT:
                policy.budget.record_request()
                reply = None
            elif effect is SLEEP:
                self._engine.clock.sleep(arg)
                reply = None
            elif effect is PEEK:
                peek = getattr(policy.breaker, "open_remaining", None)
                reply = 0.0 if peek is None else peek()
            elif effect is SPEND:
                reply = _spend(policy.budget, arg)
            elif effect is OUTCOME:
                policy.budget.record_outcome(**arg._asdict())
                reply = None
            elif effect is DISCARD:
                if self._discard is not None:
                    self._discard[0](arg)
                reply = None

            else:
                assert effect is PACE and self._pace is not None
                limit = self.conversation.pace_limit(self._engine.clock.monotonic())
                reply = self._pace[0](limit)

    def release(self) -> None:
        """Give back a permit whose attempt raised instead of ending (sync)."""
        permit, self.permit = self.permit, None
        release = getattr(permit, "release", None)
        if release is not None:
            release()

    # -- the async driver ---------------------------------------------------------

    async def arun(
        self, asend: Callable[[], Awaitable[Outcome]], first: Outcome | None = None
    ) -> Finish:
        """Async twin of :meth:`run`: awaits ``asend`` and every async effect."""
        if first is None and self.bare:
            first = await asend()
            if first.failure is None:
                return Finish(first, None, 1)
        self.begin(first)
        reply: Any = None
        while await self.aadvance(reply):
            try:
                outcome = await asend()
            except BaseException:
                await self.arelease()
                raise
            reply = self.sent(outcome)
        assert self.finish is not None
        return self.finish

    async def aadvance(self, reply: Any = None) -> bool:
        """Async twin of :meth:`advance` (a duck-typed object without async forms is
        called synchronously)."""
        policy = self.conversation.policy
        while True:
            effect, arg = self._next(reply)
            if effect is SEND or effect is None:
                return effect is SEND
            if effect is ADMIT:
                try:
                    reply = self.permit = await _twin(policy.breaker, "acquire")
                except CircuitOpen as refused:
                    reply = refused
            elif effect is RECORD:
                self.permit = None
                reply = await _twin(arg[0], "record", failure=arg[1])
            elif effect is COUNT:
                reply = await _twin(policy.budget, "record_request")
            elif effect is SLEEP:
                await self._engine.clock.asleep(arg)
                reply = None
            elif effect is PEEK:
                has_peek = hasattr(policy.breaker, "open_remaining")
                reply = await _twin(policy.breaker, "open_remaining") if has_peek else 0.0
            elif effect is SPEND:
                budget = policy.budget
                if records_outcomes(budget):
                    reply = _spend(budget, arg)
                else:
                    reply = bool(await _twin(budget, "try_retry"))
            elif effect is OUTCOME:
                reply = await _twin(policy.budget, "record_outcome", **arg._asdict())
            elif effect is DISCARD:
                if self._discard is not None:
                    await self._discard[1](arg)
                reply = None

            else:
                assert effect is PACE and self._pace is not None
                limit = self.conversation.pace_limit(self._engine.clock.monotonic())
                reply = await self._pace[1](limit)

    async def arelease(self) -> None:
        """Async twin of :meth:`release`."""
        permit, self.permit = self.permit, None
        if permit is not None and hasattr(permit, "release"):
            await _twin(permit, "release")


def _spend(budget: Any, failure: Any) -> bool:
    # SPEND: a budget that prices retries (records_outcomes) hears what failed.
    if records_outcomes(budget):
        return bool(budget.try_retry(throttled=failure.throttled))
    return bool(budget.try_retry())


async def _twin(obj: Any, name: str, **kwargs: Any) -> Any:
    # The async form `a<name>` when the object has one, else the sync form.
    async_form = getattr(obj, "a" + name, None)
    if async_form is not None:
        return await async_form(**kwargs)
    return getattr(obj, name)(**kwargs)


# One process-wide generator for jitter. Jitter needs no cryptographic quality;
# tests pass their own seeded Random.
_RNG = random.Random()
