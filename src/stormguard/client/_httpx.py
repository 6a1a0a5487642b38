# stormguard.httpx.RetryTransport: one class that is both an httpx.BaseTransport
# and an httpx.AsyncBaseTransport. It wraps an inner transport, delegates each
# attempt to it, and forwards close()/aclose(). The two loops differ only in
# `await`; every decision is made by RetryCall and the shared HTTP helpers.
from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Sequence
from typing import Any

import httpx

from .._clock import SYSTEM_CLOCK, Clock
from ..core._outcome import Failure
from ..core._policy import GiveUp, RetryFailure, RetryPolicy
from ..protection._origin import COOLDOWN_STATUSES, OriginGuard, OriginGuards, guards_for
from ._driver import RetryCall, RetryHook, arecord_permit, record_permit
from ._http import (
    IDEMPOTENCY_KEY,
    KEYED_METHODS,
    body_worth_reading,
    describe,
    error_failure,
    mentions_quota,
    new_idempotency_key,
    response_failure,
)

__all__ = ["RetryTransport"]

_NOT_SENT: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
)
_MAYBE_PROCESSED: tuple[type[Exception], ...] = (
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)


def _failure_kind(exc: Exception) -> Failure:
    if isinstance(exc, _NOT_SENT):
        return Failure.NOT_SENT
    if isinstance(exc, _MAYBE_PROCESSED):
        return Failure.MAYBE_PROCESSED
    return Failure.FINAL


def _body_if_read(response: httpx.Response) -> bytes | None:
    try:
        return response.content
    except httpx.ResponseNotRead:
        return None


def _origin(url: httpx.URL) -> str:
    # origin_of() for an already-parsed httpx.URL (no second parse per request).
    scheme = url.scheme
    port = url.port
    if port is None or port == {"http": 80, "https": 443}.get(scheme):
        return f"{scheme}://{url.host}"
    return f"{scheme}://{url.host}:{port}"


def _worth_observing(response: httpx.Response) -> bool:
    # Only a 429/503 (cooldown) or a response with quota headers (pacing) teaches
    # the origin's guard anything; most responses carry neither.
    return response.status_code in COOLDOWN_STATUSES or mentions_quota(response.headers.keys())


class _Attempt:
    """Per-logical-request facts the loops need: method, key, replayable body."""

    __slots__ = ("call", "guard", "has_key", "method", "replayable")

    def __init__(
        self, transport: RetryTransport, request: httpx.Request, *, is_async: bool = False
    ) -> None:
        self.method = request.method.upper()
        if (
            transport.idempotency_keys
            and self.method in KEYED_METHODS
            and IDEMPOTENCY_KEY not in request.headers
        ):
            request.headers[IDEMPOTENCY_KEY] = new_idempotency_key()
        self.has_key = IDEMPOTENCY_KEY in request.headers
        # Bodies given as bytes/str/json/form are held in a ByteStream and can be
        # sent again; a generator or file stream is one-shot and is never retried.
        self.replayable = isinstance(request.stream, httpx.ByteStream)
        # Per-origin protection: the origin's breaker and budget join the policy.
        guards = transport.guards
        url = request.url
        self.guard: OriginGuard | None = guards.get(_origin(url)) if guards.enabled else None
        policy = transport.policy if self.guard is None else self.guard.policy(transport.policy)
        method = self.method
        self.call = RetryCall(
            policy,
            target=lambda: describe(method, str(url)),
            clock=transport.clock,
            rng=transport.rng,
            hooks=transport.hooks,
            count_request=not is_async,  # the async loop awaits call.astart()
        )

    def _limit(self) -> float:
        return max(0.0, min(self.call.remaining(), self.call.policy.max_wait_s))

    def pace(self) -> float:
        """The origin's cooldown and pacing wait; RateLimited if it would pass the deadline."""
        return 0.0 if self.guard is None else self.guard.wait_before(self._limit())

    async def apace(self) -> float:
        """Async twin of :meth:`pace`."""
        return 0.0 if self.guard is None else await self.guard.await_before(self._limit())

    def slot(self) -> contextlib.AbstractContextManager[None]:
        """The origin's bulkhead slot for one attempt (waits at most the deadline)."""
        if self.guard is None:
            return contextlib.nullcontext()
        return self.guard.slot(max(0.0, self.call.remaining()))

    def aslot(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Async twin of :meth:`slot`."""
        if self.guard is None:
            return contextlib.nullcontext()
        return self.guard.aslot(max(0.0, self.call.remaining()))

    def observe(self, response: httpx.Response, failure: RetryFailure | None) -> None:
        """Feed the origin's cooldown (429/503 hints) and pacing (quota headers)."""
        if self.guard is not None and _worth_observing(response):
            hint = failure.hint if failure is not None else None
            self.guard.observe(response.status_code, response.headers.multi_items(), hint)

    async def aobserve(self, response: httpx.Response, failure: RetryFailure | None) -> None:
        """Async twin of :meth:`observe`."""
        if self.guard is not None and _worth_observing(response):
            hint = failure.hint if failure is not None else None
            await self.guard.aobserve(response.status_code, response.headers.multi_items(), hint)

    def cap_timeouts(self, request: httpx.Request) -> None:
        """No attempt may outlive the call's deadline."""
        remaining = max(0.001, self.call.remaining())
        timeouts = request.extensions.get("timeout")
        if isinstance(timeouts, dict) and remaining != math.inf:  # inf: deadline=None
            request.extensions["timeout"] = {
                name: remaining if value is None else min(value, remaining)
                for name, value in timeouts.items()
            }

    def wants_body(self, response: httpx.Response) -> bool:
        """A small 429/503 body may carry the wait hint; read it before judging."""
        return body_worth_reading(response.status_code, response.headers.get("content-length"))

    def on_response(self, response: httpx.Response) -> RetryFailure | None:
        if response.status_code < 400:
            return None  # success: returned as it is (response_failure judges the rest)
        failure = response_failure(
            self.call.policy,
            response.status_code,
            response.headers.multi_items(),
            method=self.method,
            has_key=self.has_key,
            wall_now=self.call.clock.time(),
            body=_body_if_read(response),
            content_type=response.headers.get("content-type"),
            subject=response,
        )
        if failure is not None and not self.replayable:
            return RetryFailure(False, failure.reason + " (one-shot body)", failure.hint)
        return failure

    def on_error(self, exc: Exception) -> RetryFailure | None:
        kind = _failure_kind(exc)
        if kind is Failure.FINAL:
            return None
        failure = error_failure(kind, exc, method=self.method, has_key=self.has_key)
        if not self.replayable:
            return RetryFailure(False, failure.reason + " (one-shot body)")
        return failure


class RetryTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """An httpx transport that retries by stormguard's decision table.

    >>> import httpx, stormguard
    >>> from stormguard.httpx import RetryTransport
    >>> client = httpx.Client(transport=RetryTransport(policy=stormguard.RetryPolicy(attempts=3)))

    ``transport`` is the inner transport (default: ``httpx.HTTPTransport()`` for
    sync use, ``httpx.AsyncHTTPTransport()`` for async use, created on first use).
    ``policy`` is a :class:`stormguard.RetryPolicy` (default ``RetryPolicy()``).
    With ``idempotency_keys=True`` a POST or PATCH without an ``Idempotency-Key``
    gets one (UUID4) before its first attempt, reused on every retry. When the
    call stops, the last response is returned as it is (its status tells the
    caller what happened); the last transport error is raised as it is.
    ``on_retry`` hooks receive a :class:`stormguard.RetryRecord` per retry.

    Per-origin protection, each on by default and off with ``False`` (or given a
    mapping of settings, or a ready object to share): ``breaker`` (a
    :class:`stormguard.CircuitBreaker` per origin; 5xx and transport errors count,
    4xx do not; refusals raise :class:`stormguard.CircuitOpen`), ``budget`` (a
    :class:`stormguard.RetryBudget` per origin; when spent the call ends with the
    last response), ``bulkhead`` (100 concurrent requests per origin, waiting at
    most the deadline; else :class:`stormguard.BulkheadFull`), ``cooldown`` (a 429
    or 503 with a wait hint pauses the whole origin; a request whose deadline ends
    first raises :class:`stormguard.RateLimited`) and ``pacing`` (the last 10 % of
    a quota is spread until its reset). ``store=RedisStore(url)`` shares breakers,
    budgets and cooldowns across processes. With every protection keyword at its
    default, all such clients in the process share one set per origin (one
    breaker, budget, bulkhead and cooldown for every client object, thread and
    task calling that upstream); custom settings give the transport its own set,
    and ``guards=`` passes a :class:`stormguard.protection.OriginGuards` to share
    exactly (or to keep clients apart).
    """

    def __init__(
        self,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        *,
        policy: RetryPolicy | None = None,
        idempotency_keys: bool = False,
        on_retry: RetryHook | Sequence[RetryHook] = (),
        clock: Clock | None = None,
        rng: random.Random | None = None,
        breaker: Any = True,
        budget: Any = True,
        bulkhead: Any = True,
        cooldown: Any = True,
        pacing: Any = True,
        store: Any = None,
        guards: OriginGuards | None = None,
    ) -> None:
        self._inner = transport
        self._sync_inner: httpx.BaseTransport | None = None
        self._async_inner: httpx.AsyncBaseTransport | None = None
        self.policy = policy if policy is not None else RetryPolicy()
        self.idempotency_keys = idempotency_keys
        self.hooks: tuple[RetryHook, ...] = (on_retry,) if callable(on_retry) else tuple(on_retry)
        self.clock = clock or SYSTEM_CLOCK
        self.rng = rng
        self.guards = guards_for(
            guards=guards,
            breaker=breaker,
            budget=budget,
            bulkhead=bulkhead,
            cooldown=cooldown,
            pacing=pacing,
            store=store,
            clock=clock,
            rng=rng,
        )

    # -- delegation -------------------------------------------------------------

    def _sync(self) -> httpx.BaseTransport:
        if self._sync_inner is None:
            if self._inner is None:
                self._sync_inner = httpx.HTTPTransport()
            elif isinstance(self._inner, httpx.BaseTransport):
                self._sync_inner = self._inner
            else:
                raise TypeError("the inner transport is async-only; use httpx.AsyncClient")
        return self._sync_inner

    def _async(self) -> httpx.AsyncBaseTransport:
        if self._async_inner is None:
            if self._inner is None:
                self._async_inner = httpx.AsyncHTTPTransport()
            elif isinstance(self._inner, httpx.AsyncBaseTransport):
                self._async_inner = self._inner
            else:
                raise TypeError("the inner transport is sync-only; use httpx.Client")
        return self._async_inner

    def close(self) -> None:
        if self._sync_inner is not None:
            self._sync_inner.close()
        elif isinstance(self._inner, httpx.BaseTransport):
            self._inner.close()

    async def aclose(self) -> None:
        if self._async_inner is not None:
            await self._async_inner.aclose()
        elif isinstance(self._inner, httpx.AsyncBaseTransport):
            await self._inner.aclose()

    # -- the two loops ----------------------------------------------------------

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        inner = self._sync()
        attempt = _Attempt(self, request)
        while True:
            first = attempt.pace()  # the origin's cooldown and pacing
            if first:
                self.clock.sleep(first)
            with attempt.slot():  # the origin's bulkhead
                permit = attempt.call.admit()
                attempt.cap_timeouts(request)
                try:
                    response = inner.handle_request(request)
                except Exception as exc:
                    failure = attempt.on_error(exc)
                    record_permit(permit, failure=failure is not None)
                    wait = _next_wait(attempt, failure, exc)
                    assert wait is not None  # _next_wait raises exc instead of None
                else:
                    if attempt.wants_body(response):
                        with contextlib.suppress(httpx.HTTPError):
                            response.read()
                    failure = attempt.on_response(response)
                    attempt.observe(response, failure)
                    record_permit(permit, failure=response.status_code >= 500)
                    wait = _next_wait(attempt, failure, None)
                    if wait is None:
                        return response
                    response.close()
            self.clock.sleep(wait)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        inner = self._async()
        attempt = _Attempt(self, request, is_async=True)
        await attempt.call.astart()
        while True:
            first = await attempt.apace()
            if first:
                await self.clock.asleep(first)
            async with attempt.aslot():
                permit = await attempt.call.aadmit()
                attempt.cap_timeouts(request)
                try:
                    response = await inner.handle_async_request(request)
                except Exception as exc:
                    failure = attempt.on_error(exc)
                    await arecord_permit(permit, failure=failure is not None)
                    wait = await _anext_wait(attempt, failure, exc)
                    assert wait is not None  # _anext_wait raises exc instead of None
                else:
                    if attempt.wants_body(response):
                        with contextlib.suppress(httpx.HTTPError):
                            await response.aread()
                    failure = attempt.on_response(response)
                    await attempt.aobserve(response, failure)
                    await arecord_permit(permit, failure=response.status_code >= 500)
                    wait = await _anext_wait(attempt, failure, None)
                    if wait is None:
                        return response
                    await response.aclose()
            await self.clock.asleep(wait)


def _next_wait(
    attempt: _Attempt, failure: RetryFailure | None, exc: Exception | None
) -> float | None:
    """The wait before the next attempt; None to return the response; raises to end with exc."""
    if failure is None:
        if exc is not None:
            raise exc
        return None
    action = attempt.call.after_failure(failure)
    if isinstance(action, GiveUp):
        if exc is not None:
            raise exc
        return None
    return action.wait


async def _anext_wait(
    attempt: _Attempt, failure: RetryFailure | None, exc: Exception | None
) -> float | None:
    """Async twin of :func:`_next_wait` (awaits a shared budget)."""
    if failure is None:
        if exc is not None:
            raise exc
        return None
    action = await attempt.call.aafter_failure(failure)
    if isinstance(action, GiveUp):
        if exc is not None:
            raise exc
        return None
    return action.wait
