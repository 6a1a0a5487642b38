# `@stormguard.retry`: the generic retrying decorator for sync and async callables.
#
# What an exception means is decided once, in `_judge`, so the two loops below
# only attempt, ask the driver, and sleep.
from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar, overload

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import CircuitOpen, ConfigError, RetryError
from ..core._backoff import Backoff
from ..core._body_hints import wait_hint_from_body
from ..core._headers import wait_hint
from ..core._outcome import DEFAULT_RETRY_STATUSES, Verdict, classify_status
from ..core._policy import GiveUp, RetryFailure, RetryPolicy
from ._driver import RetryCall, RetryHook, arecord_permit, record_permit
from ._http import BODY_HINT_STATUSES

__all__ = ["retry"]

P = ParamSpec("P")
T = TypeVar("T")

ExceptionFilter = (
    type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]
)


class _PolicyDefault:
    # Marks a keyword left to RetryPolicy's own default (shown as such in help()).
    __slots__ = ()

    def __repr__(self) -> str:
        return "<RetryPolicy default>"


UNSET: Any = _PolicyDefault()
_UNSET = UNSET


class _Judge:
    """Turns an exception into a RetryFailure, or None when it is not ours to retry."""

    __slots__ = ("_clock", "_predicate", "_statuses", "_types")

    def __init__(self, on: ExceptionFilter, statuses: Collection[int], clock: Clock) -> None:
        self._clock = clock
        self._statuses = statuses
        if isinstance(on, type | tuple):
            types = on if isinstance(on, tuple) else (on,)
            for exc_type in types:
                if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
                    raise ConfigError("on", f"must be exception classes, got {exc_type!r}")
            self._types: tuple[type[BaseException], ...] = types
            self._predicate: Callable[[BaseException], bool] | None = None
        elif callable(on):
            self._types = ()
            self._predicate = on
        else:
            raise ConfigError("on", f"must be exception classes or a predicate, got {on!r}")

    def __call__(self, exc: BaseException) -> tuple[RetryFailure, bool] | None:
        """(failure, counts against the server) for a matching exception, else None."""
        if self._predicate is not None:
            if not self._predicate(exc):
                return None
        elif not isinstance(exc, self._types):
            return None
        reason = f"{type(exc).__name__}: {exc}"[:200]
        hint = _exception_hint(exc, self._clock)
        status = _status_of(exc)
        if status is None:
            return RetryFailure(True, reason, hint), True
        method = _method_of(exc)
        headers = _headers_of(exc)
        has_key = headers is not None and "idempotency-key" in {k.lower() for k in headers}
        verdict = classify_status(
            status, method or "GET", has_idempotency_key=has_key, retry_statuses=self._statuses
        )
        return RetryFailure(verdict is Verdict.RETRY, reason, hint), status >= 500


def _status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _method_of(exc: BaseException) -> str | None:
    request = getattr(exc, "request", None) or getattr(
        getattr(exc, "response", None), "request", None
    )
    method = getattr(request, "method", None)
    return method if isinstance(method, str) else None


def _headers_of(exc: BaseException) -> Any:
    request = getattr(exc, "request", None)
    return getattr(request, "headers", None)


def _exception_hint(exc: BaseException, clock: Clock) -> float | None:
    explicit = getattr(exc, "retry_after", None)
    if isinstance(explicit, int | float) and not isinstance(explicit, bool) and explicit >= 0:
        return float(explicit)
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    headers = getattr(response, "headers", None)
    if isinstance(status, int) and headers is not None:
        try:
            hint = wait_hint(status, headers.items(), now=clock.time())
            if hint is None and status in BODY_HINT_STATUSES:
                body = getattr(response, "content", None)  # only bodies already read
                if isinstance(body, bytes | str):
                    hint = wait_hint_from_body(body, headers.get("content-type"))
            return hint
        except Exception:  # a hostile response object must not break retrying
            return None
    return None


@dataclass(frozen=True, slots=True)
class Config:
    """Everything `retry` and `retrying` resolve from their keywords, once."""

    policy: RetryPolicy
    judge: _Judge
    hooks: tuple[RetryHook, ...]
    clock: Clock


def configure(
    *,
    on: ExceptionFilter,
    fields: dict[str, Any],
    policy: RetryPolicy | None,
    on_retry: RetryHook | Sequence[RetryHook],
    clock: Clock | None,
) -> Config:
    """Validate the keywords into a policy, a judge and hooks (ConfigError on bad input)."""
    given = {name: value for name, value in fields.items() if value is not _UNSET}
    if policy is not None and given:
        raise ConfigError("policy", f"pass either policy= or its fields, not both ({given})")
    resolved = policy if policy is not None else RetryPolicy(**given)
    if (isinstance(on, type) and issubclass(on, BaseException)) or isinstance(on, tuple):
        resolved = resolved.replace(retry_exceptions=on)
    hooks = (on_retry,) if callable(on_retry) else tuple(on_retry)
    the_clock = clock or SYSTEM_CLOCK
    judge = _Judge(on, resolved.retry_statuses or DEFAULT_RETRY_STATUSES, the_clock)
    return Config(resolved, judge, hooks, the_clock)


@overload
def retry(fn: Callable[P, T], /) -> Callable[P, T]: ...


@overload
def retry(
    *,
    on: ExceptionFilter = ...,
    attempts: int = ...,
    backoff: Backoff = ...,
    deadline: float | timedelta = ...,
    max_wait: float | timedelta = ...,
    retry_statuses: Collection[int] = ...,
    budget: Any = ...,
    breaker: Any = ...,
    policy: RetryPolicy | None = ...,
    on_retry: RetryHook | Sequence[RetryHook] = ...,
    clock: Clock | None = ...,
    rng: random.Random | None = ...,
) -> Callable[[Callable[P, T]], Callable[P, T]]: ...


def retry(
    fn: Callable[P, T] | None = None,
    /,
    *,
    on: ExceptionFilter = Exception,
    attempts: int = _UNSET,
    backoff: Backoff = _UNSET,
    deadline: float | timedelta = _UNSET,
    max_wait: float | timedelta = _UNSET,
    retry_statuses: Collection[int] = _UNSET,
    budget: Any = _UNSET,
    breaker: Any = _UNSET,
    policy: RetryPolicy | None = None,
    on_retry: RetryHook | Sequence[RetryHook] = (),
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> Callable[P, T] | Callable[[Callable[P, T]], Callable[P, T]]:
    """Retry a sync or async callable when it raises an exception matched by ``on``.

    ``on`` is an exception class, a tuple of them, or a predicate. The wait after
    the n-th failure is the server's hint when the exception carries one (an
    ``retry_after`` attribute, or a ``response`` with ``Retry-After``/rate-limit
    headers, as httpx's ``HTTPStatusError`` and requests' ``HTTPError`` do), else
    the backoff draw — by default full jitter, ``uniform(0, min(30, 0.5 *
    2**(n-1)))`` seconds. At most ``attempts`` attempts (default 4), never past
    ``deadline`` seconds in total (default 60), never a server wait over
    ``max_wait`` (default 60). An exception with an HTTP status is retried only if
    the decision table allows it (408, 425, 429, 502, 503, 504; a POST without an
    ``Idempotency-Key`` only on 429).

    When it stops it raises :class:`RetryError` with ``reason`` (attempts
    exhausted, deadline, hint too long, not retryable, retry budget exhausted,
    circuit open), ``attempts``, ``hint`` and ``last_exception`` (also its
    ``__cause__``). Exceptions not matched by ``on`` propagate unchanged at once.
    Pass a ready :class:`RetryPolicy` as ``policy=`` instead of its fields.
    """
    config = configure(
        on=on,
        fields={
            "attempts": attempts,
            "backoff": backoff,
            "deadline": deadline,
            "max_wait": max_wait,
            "retry_statuses": retry_statuses,
            "budget": budget,
            "breaker": breaker,
        },
        policy=policy,
        on_retry=on_retry,
        clock=clock,
    )
    resolved, judge, hooks, the_clock = config.policy, config.judge, config.hooks, config.clock

    # Success-path fast lane: with no breaker and no budget there is nothing to
    # consult before the first attempt, so the call state is only built once an
    # attempt has failed. The deadline still counts from before the first attempt.
    fast = resolved.breaker is None and resolved.budget is None
    now = the_clock.monotonic

    def decorate(func: Callable[P, T]) -> Callable[P, T]:
        target = getattr(func, "__qualname__", repr(func))

        def new_call(started: float, count_request: bool = True) -> RetryCall:
            return RetryCall(
                resolved,
                target=target,
                clock=the_clock,
                rng=rng,
                hooks=hooks,
                started_at=started,
                count_request=count_request,
            )

        if inspect.iscoroutinefunction(func):
            afunc: Callable[P, Awaitable[Any]] = func

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                started = now()
                if fast:
                    try:
                        return await afunc(*args, **kwargs)
                    except Exception as exc:
                        call = new_call(started)
                        await the_clock.asleep(after_exception(call, judge, None, exc))
                else:
                    # The async twins await a breaker or budget shared through an
                    # AsyncRedisStore instead of blocking the loop.
                    call = new_call(started, count_request=False)
                    await call.astart()
                while True:
                    permit = await aadmit(call)
                    try:
                        result = await afunc(*args, **kwargs)
                    except Exception as exc:
                        await the_clock.asleep(await aafter_exception(call, judge, permit, exc))
                    else:
                        await arecord_permit(permit, failure=False)
                        return result

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            started = now()
            if fast:
                try:
                    return func(*args, **kwargs)
                except Exception as exc:
                    call = new_call(started)
                    the_clock.sleep(after_exception(call, judge, None, exc))
            else:
                call = new_call(started)
            while True:
                permit = admit(call)
                try:
                    result = func(*args, **kwargs)
                except Exception as exc:
                    the_clock.sleep(after_exception(call, judge, permit, exc))
                else:
                    record_permit(permit, failure=False)
                    return result

        return sync_wrapper

    if fn is not None:
        return decorate(fn)
    return decorate


def admit(call: RetryCall) -> Any:
    try:
        return call.admit()
    except CircuitOpen as refused:
        if call.attempts == 1:
            raise
        give_up = call.circuit_open(refused)
        raise RetryError(
            give_up.reason,
            attempts=call.attempts - 1,
            last_exception=call.last_exception,
            hint=give_up.hint,
        ) from refused


async def aadmit(call: RetryCall) -> Any:
    """Async twin of :func:`admit`."""
    try:
        return await call.aadmit()
    except CircuitOpen as refused:
        if call.attempts == 1:
            raise
        give_up = call.circuit_open(refused)
        raise RetryError(
            give_up.reason,
            attempts=call.attempts - 1,
            last_exception=call.last_exception,
            hint=give_up.hint,
        ) from refused


async def aafter_exception(call: RetryCall, judge: _Judge, permit: Any, exc: Exception) -> float:
    """Async twin of :func:`after_exception`."""
    judged = judge(exc)
    call.last_exception = exc
    if judged is None:
        await arecord_permit(permit, failure=False)
        raise exc
    failure, against_server = judged
    await arecord_permit(permit, failure=against_server)
    action = await call.aafter_failure(failure)
    if isinstance(action, GiveUp):
        raise RetryError(
            action.reason, attempts=call.attempts, last_exception=exc, hint=action.hint
        ) from exc
    return action.wait


def after_exception(call: RetryCall, judge: _Judge, permit: Any, exc: Exception) -> float:
    """Judge a raised exception; return the wait before the next attempt or raise."""
    judged = judge(exc)
    call.last_exception = exc
    if judged is None:
        record_permit(permit, failure=False)
        raise exc
    failure, against_server = judged
    record_permit(permit, failure=against_server)
    action = call.after_failure(failure)
    if isinstance(action, GiveUp):
        raise RetryError(
            action.reason, attempts=call.attempts, last_exception=exc, hint=action.hint
        ) from exc
    return action.wait
