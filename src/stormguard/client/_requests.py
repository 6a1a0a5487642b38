# stormguard.requests.RetryAdapter: a requests HTTPAdapter that retries by
# stormguard's decision table. urllib3's own retries are switched off so that
# exactly one component decides; each attempt is delegated to HTTPAdapter.send.
from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import (
    ConnectTimeoutError,
    NameResolutionError,
    NewConnectionError,
)

from .._clock import SYSTEM_CLOCK, Clock
from ..core._outcome import Failure
from ..core._policy import GiveUp, RetryFailure, RetryPolicy
from ..protection._origin import COOLDOWN_STATUSES, OriginGuard, OriginGuards, guards_for
from ._driver import RetryCall, RetryHook, record_permit
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

__all__ = ["RetryAdapter"]

_NEVER_CONNECTED = (NewConnectionError, ConnectTimeoutError, NameResolutionError)


def _failure_kind(exc: Exception) -> Failure:
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return Failure.NOT_SENT
    if isinstance(exc, requests.exceptions.ConnectionError):
        # requests folds "could not connect" and "connection dropped after sending"
        # into ConnectionError; the urllib3 reason inside tells them apart.
        reason = exc.args[0] if exc.args else None
        reason = getattr(reason, "reason", reason)
        if isinstance(reason, _NEVER_CONNECTED):
            return Failure.NOT_SENT
        return Failure.MAYBE_PROCESSED
    if isinstance(exc, requests.exceptions.Timeout | requests.exceptions.ChunkedEncodingError):
        return Failure.MAYBE_PROCESSED
    return Failure.FINAL


def _replayable(body: Any) -> bool:
    return body is None or isinstance(body, bytes | str)


class RetryAdapter(HTTPAdapter):
    """A ``requests`` transport adapter that retries by stormguard's decision table.

    >>> import requests, stormguard
    >>> from stormguard.requests import RetryAdapter
    >>> session = requests.Session()
    >>> session.mount("https://", RetryAdapter(policy=stormguard.RetryPolicy(attempts=3)))

    Same rules and keywords as :class:`stormguard.httpx.RetryTransport`; the
    remaining ``HTTPAdapter`` keywords (``pool_connections``, ``pool_maxsize``…)
    are passed through. ``max_retries`` is fixed at 0: stormguard decides.
    Per-origin protection takes the same keywords (``breaker``, ``budget``,
    ``bulkhead``, ``cooldown``, ``pacing``, ``store``, ``guards``), each on by
    default and off with ``False``.
    """

    def __init__(
        self,
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
        **adapter_kwargs: Any,
    ) -> None:
        if "max_retries" in adapter_kwargs:
            raise TypeError("RetryAdapter decides retries itself; do not pass max_retries")
        super().__init__(max_retries=0, **adapter_kwargs)
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

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        verify: bool | str = True,
        cert: bytes | str | tuple[bytes | str, bytes | str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        method = (request.method or "GET").upper()
        if (
            self.idempotency_keys
            and method in KEYED_METHODS
            and IDEMPOTENCY_KEY not in request.headers
        ):
            request.headers[IDEMPOTENCY_KEY] = new_idempotency_key()
        has_key = IDEMPOTENCY_KEY in request.headers
        replayable = _replayable(request.body)
        # Per-origin protection: the origin's breaker and budget join the policy.
        guard = self.guards.for_url(request.url or "") if self.guards.enabled else None
        policy = self.policy if guard is None else guard.policy(self.policy)
        call = RetryCall(
            policy,
            target=lambda: describe(method, request.url or ""),
            clock=self.clock,
            rng=self.rng,
            hooks=self.hooks,
        )
        while True:
            if guard is not None:  # the origin's cooldown and pacing
                first = guard.wait_before(max(0.0, min(call.remaining(), policy.max_wait_s)))
                if first:
                    self.clock.sleep(first)
            with _slot(guard, call):  # the origin's bulkhead
                permit = call.admit()
                capped = _cap_timeout(timeout, call.remaining())
                try:
                    response = super().send(request, stream, capped, verify, cert, proxies)
                except Exception as exc:
                    kind = _failure_kind(exc)
                    record_permit(permit, failure=kind is not Failure.FINAL)
                    if kind is Failure.FINAL:
                        raise
                    failure = error_failure(kind, exc, method=method, has_key=has_key)
                    if not replayable:
                        raise
                    action = call.after_failure(failure)
                    if isinstance(action, GiveUp):
                        raise
                else:
                    maybe = _judge(policy, response, method, has_key, self.clock)
                    _observe(guard, response, maybe)
                    record_permit(permit, failure=response.status_code >= 500)  # 5xx count, 4xx not
                    if maybe is None or not replayable:
                        return response
                    action = call.after_failure(maybe)
                    if isinstance(action, GiveUp):
                        return response
                    response.close()
            self.clock.sleep(action.wait)


def _judge(
    policy: RetryPolicy, response: requests.Response, method: str, has_key: bool, clock: Clock
) -> RetryFailure | None:
    status = response.status_code
    if status < 400:
        return None  # success: returned as it is (response_failure judges the rest)
    small = body_worth_reading(status, response.headers.get("content-length"))
    return response_failure(
        policy,
        status,
        response.headers.items(),
        method=method,
        has_key=has_key,
        wall_now=clock.time(),
        body=response.content if small else None,
        content_type=response.headers.get("content-type"),
        subject=response,
    )


def _slot(guard: OriginGuard | None, call: RetryCall) -> contextlib.AbstractContextManager[None]:
    if guard is None:
        return contextlib.nullcontext()
    return guard.slot(max(0.0, call.remaining()))


def _observe(
    guard: OriginGuard | None, response: requests.Response, failure: RetryFailure | None
) -> None:
    if guard is None:
        return
    status = response.status_code
    if status in COOLDOWN_STATUSES or mentions_quota(k.lower() for k in response.headers):
        hint = failure.hint if failure is not None else None
        guard.observe(status, response.headers.items(), hint)


def _cap_timeout(
    timeout: float | tuple[float | None, float | None] | None, remaining: float
) -> float | tuple[float, float] | None:
    if remaining == math.inf:  # deadline=None: the caller's timeout as it is
        return timeout  # type: ignore[return-value]  # requests' own shapes, passed through
    remaining = max(0.001, remaining)
    if timeout is None:
        return remaining
    if isinstance(timeout, tuple):
        connect, read = timeout
        return (
            remaining if connect is None else min(connect, remaining),
            remaining if read is None else min(read, remaining),
        )
    return min(float(timeout), remaining)
