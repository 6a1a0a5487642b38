# `@stormguard.retry`: the generic retrying decorator for sync and async callables.
#
# What an exception means is decided once, in `_Judge`; the retry conversation
# (admit, record, decide, spend, wait) is the engine's (core/_engine.py), driven
# sync or async by client/_driver.py. The wrappers below only make attempts.
from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ParamSpec, TypedDict, TypeVar, Unpack, overload

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError, RetryError
from ..core._backoff import Backoff
from ..core._engine import Finish, Outcome
from ..core._policy import RetryFailure, RetryPolicy
from ._attempt import numbered, unnumbered
from ._driver import Detail, Engine, RetryHook
from ._front import excerpt, exhausted_quota
from ._http import BODY_HINT_STATUSES, response_failure

__all__ = ["RetryOptions", "retry"]

P = ParamSpec("P")
T = TypeVar("T")

ExceptionFilter = (
    type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]
)


class _Judge:
    """Turns an exception into the attempt's Outcome (``failure`` None: not ours to retry)."""

    __slots__ = ("_clock", "_policy", "_predicate", "_types")

    def __init__(self, on: ExceptionFilter, policy: RetryPolicy, clock: Clock) -> None:
        self._clock = clock
        self._policy = policy
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

    def result(self, value: Any) -> Outcome:
        """The Outcome of an attempt that returned ``value``: a failure to retry
        when the policy's ``retry_if`` says True of it (tenacity's
        ``retry_if_result``), else the call's answer."""
        predicate = self._policy.retry_if
        if predicate is None or predicate(value) is not True:
            return Outcome(None, False, value)
        reason = f"retry_if on the result ({type(value).__name__})"
        # (no subject: the predicate has spoken; decide() does not ask it again)
        return Outcome(RetryFailure(True, reason), False, value)

    def __call__(self, exc: BaseException) -> Outcome:
        """The Outcome of an attempt that raised ``exc``."""
        if self._predicate is not None:
            if not self._predicate(exc):
                return Outcome(None, False, None, exc)
        elif not isinstance(exc, self._types):
            return Outcome(None, False, None, exc)
        reason = f"{type(exc).__name__}: {exc}"[:200]
        status = _status_of(exc)
        if status is None:
            hint = _explicit_hint(exc)
            return Outcome(RetryFailure(True, reason, hint, subject=exc), True, None, exc)
        failure, detail = self._status_failure(exc, status, reason)
        return Outcome(failure, status >= 500, None, exc, detail)

    def _status_failure(
        self, exc: BaseException, status: int, reason: str
    ) -> tuple[RetryFailure, Detail | None]:
        # An exception carrying an HTTP response (httpx's HTTPStatusError, requests'
        # HTTPError) is judged like the response itself, by the shared HTTP table.
        request_headers = _headers_of(exc)
        has_key = request_headers is not None and "idempotency-key" in {
            k.lower() for k in request_headers
        }
        explicit = _explicit_hint(exc)
        judged, detail = None, None
        try:
            judged, detail = _response_judgement(exc, status, self._policy, has_key, self._clock)
        except Exception:  # a hostile response object must not break retrying
            pass
        if judged is None:
            return RetryFailure(False, reason, explicit, subject=exc), detail
        hint = explicit if explicit is not None else judged.hint
        return RetryFailure(
            judged.retryable,
            reason,
            hint,
            should_retry=judged.should_retry,
            repeat_unsafe=judged.repeat_unsafe,
            subject=exc,
            throttled=judged.throttled,
        ), detail


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


def _explicit_hint(exc: BaseException) -> float | None:
    explicit = getattr(exc, "retry_after", None)
    if isinstance(explicit, int | float) and not isinstance(explicit, bool) and explicit >= 0:
        return float(explicit)
    return None


def _response_judgement(
    exc: BaseException, status: int, policy: RetryPolicy, has_key: bool, clock: Clock
) -> tuple[RetryFailure | None, Detail]:
    # The judgement and what the log and RetryError tell of the response.
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    pairs = list(headers.items()) if headers is not None else []
    body = None
    if status in BODY_HINT_STATUSES:
        content = getattr(response, "content", None)  # only bodies already read
        if isinstance(content, bytes | str):
            body = content.encode() if isinstance(content, str) else content
    wall_now = clock.time()
    failure = response_failure(
        policy,
        status,
        pairs,
        method=(_method_of(exc) or "GET").upper(),
        has_key=has_key,
        wall_now=wall_now,
        body=body,
        content_type=headers.get("content-type") if headers is not None else None,
    )
    return failure, Detail(excerpt(body), exhausted_quota(pairs, wall_now))


@dataclass(frozen=True, slots=True)
class Config:
    """Everything `retry` and `retrying` resolve from their keywords, once."""

    policy: RetryPolicy
    judge: _Judge
    engine: Engine


class RetryOptions(TypedDict, total=False):
    """The keywords :func:`retry` and :func:`retrying` share, each optional.

    ``on`` (default ``Exception``); the :class:`RetryPolicy` fields ``attempts``,
    ``backoff``, ``deadline``, ``max_wait``, ``retry_statuses``, ``budget``,
    ``breaker``, ``retry_if``, ``reraise`` (omitted: the policy's own defaults) or a
    ready ``policy``; ``on_retry`` hooks; ``clock`` and ``rng`` (tests inject them).
    """

    on: ExceptionFilter
    attempts: int
    backoff: Backoff
    deadline: float | timedelta | None
    max_wait: float | timedelta
    retry_statuses: Collection[int]
    budget: Any
    breaker: Any
    retry_if: Callable[[Any], bool | None] | None
    reraise: bool
    policy: RetryPolicy | None
    on_retry: RetryHook | Sequence[RetryHook]
    clock: Clock | None
    rng: random.Random | None


_POLICY_FIELDS = (
    "attempts",
    "backoff",
    "deadline",
    "max_wait",
    "retry_statuses",
    "budget",
    "breaker",
    "retry_if",
    "reraise",
)


def configure(front: str, options: RetryOptions) -> Config:
    """Validate a front end's keywords into a policy, a judge and an engine.

    ConfigError on bad values; TypeError, as for any function, on a keyword that
    is not an option.
    """
    keywords: dict[str, Any] = dict(options)
    for name in keywords:
        if name not in RetryOptions.__optional_keys__:
            raise TypeError(f"{front}() got an unexpected keyword argument {name!r}")
    given = {name: keywords[name] for name in _POLICY_FIELDS if name in keywords}
    policy = options.get("policy")
    if policy is not None and given:
        raise ConfigError("policy", f"pass either policy= or its fields, not both ({given})")
    resolved = policy if policy is not None else RetryPolicy(**given)
    on = options.get("on", Exception)
    if (isinstance(on, type) and issubclass(on, BaseException)) or isinstance(on, tuple):
        resolved = resolved.replace(retry_exceptions=on)
    on_retry = options.get("on_retry", ())
    hooks = (on_retry,) if callable(on_retry) else tuple(on_retry)
    the_clock = options.get("clock") or SYSTEM_CLOCK
    judge = _Judge(on, resolved, the_clock)
    return Config(resolved, judge, Engine(clock=the_clock, rng=options.get("rng"), hooks=hooks))


def conclude(finish: Finish, policy: RetryPolicy) -> Any:
    """The decorator's answer: the result, the exception not ours, or RetryError.

    A breaker refusing the first attempt raises its CircuitOpen as it is; with
    ``reraise`` the last exception itself is raised when the policy gives up.
    """
    give_up = finish.give_up
    if give_up is None:
        return finish.result()
    assert finish.outcome is not None
    last = finish.outcome.error
    if policy.reraise and last is not None:
        raise last
    detail = finish.outcome.detail
    body, quota = detail if isinstance(detail, Detail) else (None, None)
    raise RetryError(
        give_up.reason,
        attempts=finish.attempts,
        last_exception=last,
        last_result=finish.outcome.value if last is None else None,
        hint=give_up.hint,
        response_body=body,
        quota=quota,
    ) from (finish.refusal or last)


@overload
def retry(fn: Callable[P, T], /) -> Callable[P, T]: ...


@overload
def retry(
    **options: Unpack[RetryOptions],
) -> Callable[[Callable[P, T]], Callable[P, T]]: ...


def retry(
    fn: Callable[P, T] | None = None, /, **options: Unpack[RetryOptions]
) -> Callable[P, T] | Callable[[Callable[P, T]], Callable[P, T]]:
    """Retry a sync or async callable when it raises an exception matched by ``on``.

    ``on`` is an exception class, a tuple of them, or a predicate. The wait after
    the n-th failure is the server's hint when the exception carries one (an
    ``retry_after`` attribute, or a ``response`` with ``Retry-After``/rate-limit
    headers, as httpx's ``HTTPStatusError`` and requests' ``HTTPError`` do), else
    the backoff draw — by default full jitter, ``uniform(0, min(30, 0.5 *
    2**(n-1)))`` seconds. At most ``attempts`` attempts (default 4), never past
    ``deadline`` seconds in total (default 120; ``None``: no deadline), never a
    server wait over ``max_wait`` (default 60). An exception with an HTTP status is
    retried only if the decision table allows it (408, 425, 429, 502, 503, 504; a
    POST without an ``Idempotency-Key`` only on 429).

    ``retry_if`` is called with each exception matched by ``on`` and returns
    ``True`` (retry it), ``False`` (never) or ``None`` (the table decides). It is
    also called with each value the function returns (tenacity's
    ``retry_if_result``): ``True`` retries the call as a failure, ``False`` or
    ``None`` returns the value. When the policy gives up on a value, the
    :class:`RetryError` carries it as ``last_result`` (``reraise`` has no
    exception to raise then, and raises the RetryError).

    The attempt being made is :func:`stormguard.current_attempt` inside the
    function (2 on the first retry); :func:`stormguard.attempt_headers` gives the
    ``Retry-Attempt`` header a retry sends over HTTP.

    When it stops it raises :class:`RetryError` with ``reason`` (attempts
    exhausted, deadline, hint too long, not retryable, retry budget exhausted,
    circuit open), ``attempts``, ``hint`` and ``last_exception`` (also its
    ``__cause__``) — or, with ``reraise=True``, the last exception itself.
    Exceptions not matched by ``on`` propagate unchanged at once. Pass a ready
    :class:`RetryPolicy` as ``policy=`` instead of its fields.

    The ``stormguard`` logger says INFO for each retry and WARNING once when a
    call gives up; each record carries ``extra={"stormguard": {...}}`` (``event``
    ``"retry"`` or ``"give_up"``, ``target``, ``reason``, ``hint``, ``elapsed`` …)
    for structured log formatters. ``on_retry`` hooks get a :class:`RetryRecord`.
    """
    config = configure("retry", options)
    resolved, judge, engine = config.policy, config.judge, config.engine

    # Success-path fast lane: with no breaker and no budget there is nothing to
    # consult before the first attempt, so the call's conversation is only built
    # once an attempt has failed. The deadline still counts from before the first
    # attempt.
    fast = resolved.breaker is None and resolved.budget is None
    # With a retry_if the fast lane asks it of the value returned (a result it
    # says True of is retried like a failure).
    judged = resolved.retry_if is not None
    now = engine.clock.monotonic

    def decorate(func: Callable[P, T]) -> Callable[P, T]:
        target = getattr(func, "__qualname__", repr(func))

        if inspect.iscoroutinefunction(func):
            afunc: Callable[P, Awaitable[Any]] = func

            async def aretried(
                started: float, first: Outcome | None, args: Any, kwargs: Any
            ) -> Any:
                async def asend() -> Outcome:
                    token = numbered(run.conversation.attempts)
                    try:
                        return judge.result(await afunc(*args, **kwargs))
                    except Exception as exc:
                        return judge(exc)
                    finally:
                        unnumbered(token)

                run = engine.start(resolved, target=target, started_at=started)
                return conclude(await run.arun(asend, first), resolved)

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                started = now()
                if fast:
                    try:
                        value = await afunc(*args, **kwargs)
                    except Exception as exc:
                        return await aretried(started, judge(exc), args, kwargs)
                    if not judged:
                        return value
                    first = judge.result(value)
                    if first.failure is None:
                        return value
                    return await aretried(started, first, args, kwargs)
                return await aretried(started, None, args, kwargs)

            return async_wrapper  # type: ignore[return-value]

        def retried(started: float, first: Outcome | None, args: Any, kwargs: Any) -> Any:
            def send() -> Outcome:
                token = numbered(run.conversation.attempts)
                try:
                    return judge.result(func(*args, **kwargs))
                except Exception as exc:
                    return judge(exc)
                finally:
                    unnumbered(token)

            run = engine.start(resolved, target=target, started_at=started)
            return conclude(run.run(send, first), resolved)

        @functools.wraps(func)
        def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            # The fast lane keeps no closure over the arguments: the retry path
            # (`retried`) is a separate function, entered only after a failure.
            started = now()
            if fast:
                try:
                    value = func(*args, **kwargs)
                except Exception as exc:
                    result: T = retried(started, judge(exc), args, kwargs)
                    return result
                if not judged:
                    return value
                first = judge.result(value)
                if first.failure is None:
                    return value
                result = retried(started, first, args, kwargs)
                return result
            result = retried(started, None, args, kwargs)
            return result

        return sync_wrapper

    if fn is not None:
        return decorate(fn)
    return decorate
