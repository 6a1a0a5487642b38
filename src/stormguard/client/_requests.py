# stormguard.requests.RetryAdapter: a requests HTTPAdapter that retries by
# stormguard's decision table. urllib3's own retries are switched off so that
# exactly one component decides; each attempt is delegated to HTTPAdapter.send,
# and the engine (core/_engine.py, client/_driver.py) runs the call.
from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import (
    ConnectTimeoutError,
    NameResolutionError,
    NewConnectionError,
)

from .._clock import Clock
from ..core._engine import Outcome
from ..core._outcome import Failure
from ..core._policy import RetryPolicy
from ..protection._origin import OriginGuards, origin_of
from ._driver import RetryHook
from ._front import HttpCall, HttpFront
from ._http import body_worth_reading

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


class RetryAdapter(HttpFront, HTTPAdapter):
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
        retry_if: Callable[[Any], bool | None] | None = None,
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
        self._configure(locals())

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        verify: bool | str = True,
        cert: bytes | str | tuple[bytes | str, bytes | str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        call = HttpCall(
            self,
            request.method or "GET",
            request.url or "",
            request.headers,
            origin_of=origin_of,
            replayable=_replayable(request.body),
            pairs=_items,
        )

        def send_once() -> Outcome:
            with call.slot():  # the origin's bulkhead
                capped = _cap_timeout(timeout, call.run.remaining())
                try:
                    response = super(RetryAdapter, self).send(
                        request, stream, capped, verify, cert, proxies
                    )
                except Exception as exc:
                    return call.error(_failure_kind(exc), exc)
                status = response.status_code
                small = status >= 400 and body_worth_reading(
                    status, response.headers.get("content-length")
                )
                body = response.content if small else None
                headers = response.headers
                outcome, observation = call.settle(
                    response, status, headers, lambda: (name.lower() for name in headers), body
                )
                if observation is not None:
                    assert call.guard is not None
                    call.guard.observe(*observation)
                return outcome

        result: requests.Response = call.run.run(send_once).result()
        return result


def _items(headers: Any) -> list[tuple[str, str]]:
    return list(headers.items())


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
