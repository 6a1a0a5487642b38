# The per-call driver shared by every retrying adapter (decorator, httpx, requests).
#
# It owns the I/O-free bookkeeping around `core.decide`: the call's state, the
# deadline measured on the injected clock, the retry budget and circuit breaker
# seams, and observability (hook + logger). The adapters keep only their loop:
#
#     call = RetryCall(policy, ...)
#     while True:
#         permit = call.admit()            # breaker; raises CircuitOpen
#         ... one attempt ...
#         action = call.after_failure(RetryFailure(...))   # or call.succeeded()
#         if GiveUp: stop; else: clock.sleep(action.wait)
#
# so the sync and async twins are a dozen lines each. The async loops use the
# twins (`count_request=False` + `await astart()`, `aadmit`, `aafter_failure`,
# `arecord_permit`) so a breaker or budget shared through an AsyncRedisStore is
# awaited instead of blocking the loop.
from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import CircuitOpen
from ..core._policy import (
    GiveUp,
    GiveUpReason,
    Retry,
    RetryFailure,
    RetryPolicy,
    RetryState,
    decide,
)

__all__ = ["RetryCall", "RetryHook", "RetryRecord", "logger"]

logger = logging.getLogger("stormguard")


@dataclass(frozen=True, slots=True)
class RetryRecord:
    """One retry, as hooks and logs see it.

    ``attempt`` is the number of the attempt that failed (1-based); ``wait`` the
    seconds slept before the next one; ``reason`` why the attempt failed;
    ``hint_used`` whether ``wait`` came from the server (``hint``) rather than the
    backoff; ``elapsed`` seconds since the call started; ``target`` what was
    called (``"GET https://api/x"`` or a function's qualified name).
    """

    attempt: int
    wait: float
    reason: str
    hint_used: bool
    hint: float | None
    elapsed: float
    target: str


RetryHook = Callable[[RetryRecord], None]


class _Permit(Protocol):
    def record(self, *, failure: bool) -> None: ...


class _Budget(Protocol):
    def record_request(self) -> None: ...

    def try_retry(self) -> bool: ...


class _Breaker(Protocol):
    def acquire(self) -> _Permit: ...


class RetryCall:
    """The state of one logical call across its attempts."""

    __slots__ = ("_clock", "_hooks", "_rng", "_target", "last_exception", "policy", "state")

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        target: str | Callable[[], str],
        clock: Clock | None = None,
        rng: random.Random | None = None,
        hooks: tuple[RetryHook, ...] = (),
        started_at: float | None = None,
        count_request: bool = True,
    ) -> None:
        self.policy = policy
        self._target = target  # a callable is described only when a retry is logged
        self._clock = clock or SYSTEM_CLOCK
        self._rng = rng or _RNG
        self._hooks = hooks
        self.last_exception: BaseException | None = None
        if started_at is None:
            started_at = self._clock.monotonic()
        self.state = RetryState(started_at=started_at)
        budget: _Budget | None = policy.budget
        if budget is not None and count_request:
            budget.record_request()

    async def astart(self) -> None:
        """Count the first attempt in the budget (for calls made with count_request=False)."""
        budget = self.policy.budget
        if budget is not None:
            arecord = getattr(budget, "arecord_request", None)
            if arecord is not None:
                await arecord()
            else:
                budget.record_request()

    @property
    def target(self) -> str:
        """What is being called (``"GET https://api/x"``, a function's name)."""
        target = self._target
        if not isinstance(target, str):
            target = self._target = target()
        return target

    @property
    def clock(self) -> Clock:
        """The clock this call measures its deadline on."""
        return self._clock

    @property
    def attempts(self) -> int:
        """Attempts started so far (the current one included)."""
        return self.state.attempts

    def remaining(self) -> float:
        """Seconds left before the deadline (may be negative)."""
        return self.policy.deadline_s - (self._clock.monotonic() - self.state.started_at)

    def admit(self) -> _Permit | None:
        """Ask the breaker for this attempt; raises :class:`CircuitOpen` if it refuses."""
        breaker: _Breaker | None = self.policy.breaker
        return None if breaker is None else breaker.acquire()

    async def aadmit(self) -> _Permit | None:
        """Async twin of :meth:`admit` (awaits ``aacquire`` when the breaker has it)."""
        breaker: _Breaker | None = self.policy.breaker
        if breaker is None:
            return None
        aacquire = getattr(breaker, "aacquire", None)
        return await aacquire() if aacquire is not None else breaker.acquire()

    def after_failure(self, failure: RetryFailure) -> Retry | GiveUp:
        """Decide what follows a failed attempt; a Retry is recorded and observed."""
        action = decide(
            self.policy, self.state, failure, now=self._clock.monotonic(), rng=self._rng
        )
        if isinstance(action, Retry):
            breaker = self.policy.breaker
            peek = getattr(breaker, "open_remaining", None)
            if peek is not None:
                refused = self._refused(action, peek())
                if refused is not None:
                    return refused
            budget: _Budget | None = self.policy.budget
            return self._spend(action, failure, budget is None or budget.try_retry())
        return action

    async def aafter_failure(self, failure: RetryFailure) -> Retry | GiveUp:
        """Async twin of :meth:`after_failure` (awaits ``atry_retry`` when the budget has it)."""
        action = decide(
            self.policy, self.state, failure, now=self._clock.monotonic(), rng=self._rng
        )
        if isinstance(action, Retry):
            breaker = self.policy.breaker
            apeek = getattr(breaker, "aopen_remaining", None)
            if apeek is not None:
                refused = self._refused(action, await apeek())
                if refused is not None:
                    return refused
            budget: _Budget | None = self.policy.budget
            allowed = True
            if budget is not None:
                atry = getattr(budget, "atry_retry", None)
                allowed = bool(await atry()) if atry is not None else budget.try_retry()
            return self._spend(action, failure, allowed)
        return action

    @staticmethod
    def _refused(action: Retry, open_for: float) -> GiveUp | None:
        # The breaker stays open past the wait: the retry would be refused, so the
        # call ends now with reason "circuit open" (and the breaker's time as hint).
        if open_for > action.wait:
            return GiveUp(GiveUpReason.CIRCUIT_OPEN, open_for)
        return None

    def _spend(self, action: Retry, failure: RetryFailure, allowed: bool) -> Retry | GiveUp:
        if not allowed:
            return GiveUp(GiveUpReason.BUDGET_EXHAUSTED, failure.hint)
        self._observe(action, failure)
        self.state = self.state.after_wait(action.wait)
        return action

    def circuit_open(self, exc: CircuitOpen) -> GiveUp:
        """The breaker refused a retry: the call ends with reason ``circuit open``."""
        return GiveUp(GiveUpReason.CIRCUIT_OPEN, exc.remaining)

    def _observe(self, action: Retry, failure: RetryFailure) -> None:
        record = RetryRecord(
            attempt=self.state.attempts,
            wait=action.wait,
            reason=failure.reason,
            hint_used=action.hint_used,
            hint=failure.hint,
            elapsed=self._clock.monotonic() - self.state.started_at,
            target=self.target,
        )
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "retrying %s: attempt %d failed (%s); waiting %.3fs%s",
                record.target,
                record.attempt,
                record.reason,
                record.wait,
                " as the server asked" if record.hint_used else "",
                extra={"stormguard_retry": record},
            )
        for hook in self._hooks:
            hook(record)


def record_permit(permit: _Permit | None, *, failure: bool) -> None:
    """Report an attempt's outcome to the breaker permit, if there is one."""
    if permit is not None:
        permit.record(failure=failure)


async def arecord_permit(permit: _Permit | None, *, failure: bool) -> None:
    """Async twin of :func:`record_permit` (awaits ``arecord`` when the permit has it)."""
    if permit is not None:
        arecord = getattr(permit, "arecord", None)
        if arecord is not None:
            await arecord(failure=failure)
        else:
            permit.record(failure=failure)


# One process-wide generator for jitter. Jitter needs no cryptographic quality;
# tests pass their own seeded Random.
_RNG = random.Random()
