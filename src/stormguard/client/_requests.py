# stormguard.requests.RetryAdapter: a requests HTTPAdapter that retries by
# stormguard's decision table. urllib3's own retries are switched off so that
# exactly one component decides; each attempt is delegated to HTTPAdapter.send,
# and the engine (core/_engine.py, client/_driver.py) runs the call.
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Unpack

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import (
    ConnectTimeoutError,
    NameResolutionError,
    NewConnectionError,
)
from urllib3.util import Timeout

from ..core._engine import Outcome
from ..core._outcome import Failure
from ..protection._origin import origin_of
from ._attempt import RETRY_ATTEMPT
from ._front import (
    FrontOptions,
    HttpCall,
    HttpFront,
    Lane,
    _success,
    first_attempt,
    resume,
    with_bulkhead,
)
from ._http import body_worth_reading

__all__ = ["RetryAdapter"]


class RequestsOptions(FrontOptions, total=False):
    """RetryAdapter's keywords: the adapters' own, and HTTPAdapter's pool settings."""

    pool_connections: int
    pool_maxsize: int
    pool_block: bool


_POOL = ("pool_connections", "pool_maxsize", "pool_block")

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


class RetryAdapter(HttpFront, HTTPAdapter):
    """A ``requests`` transport adapter that retries by stormguard's decision table.

    >>> import requests, stormguard
    >>> from stormguard.requests import RetryAdapter
    >>> session = requests.Session()
    >>> session.mount("https://", RetryAdapter(policy=stormguard.RetryPolicy(attempts=3)))

    Same rules and keywords as :class:`stormguard.httpx.RetryTransport`; the
    remaining ``HTTPAdapter`` keywords (``pool_connections``, ``pool_maxsize``…)
    are passed through (``body_excerpt`` too). ``max_retries`` is fixed at 0: stormguard decides.
    Per-origin protection takes the same keywords (``breaker``, ``budget``,
    ``bulkhead``, ``cooldown``, ``pacing``, ``store``, ``guards``), each on by
    default and off with ``False``.
    """

    def __init__(self, **options: Unpack[RequestsOptions]) -> None:
        if "max_retries" in options:
            raise TypeError("RetryAdapter decides retries itself; do not pass max_retries")
        pool = {name: options.pop(name) for name in _POOL if name in options}  # type: ignore[misc]
        super().__init__(max_retries=0, **pool)
        self._configure("RetryAdapter", options)
        # HTTPAdapter.request_url's answers for requests sent without proxies, by URL.
        self._paths: dict[str, str] = {}

    def request_url(self, request: requests.PreparedRequest, proxies: Any) -> str:
        """HTTPAdapter.request_url, kept per URL when no proxy is given.

        Without proxies its answer depends on the URL alone (the path and query),
        but it parses the URL three times to learn that no proxy applies: about
        a tenth of a plain request's time in requests. The answer is HTTPAdapter's
        own, computed once per URL (at most ``_MAX_PATHS`` kept).
        """
        url = request.url
        if proxies or url is None:
            return super().request_url(request, proxies)
        paths = self._paths
        path = paths.get(url)
        if path is None:
            path = super().request_url(request, proxies)
            if len(paths) >= _MAX_PATHS:
                paths.clear()
            paths[url] = path
        return path

    @staticmethod
    def pairs(headers: Any) -> list[tuple[str, str]]:
        """requests headers as (name, value) pairs."""
        return list(headers.items())

    @staticmethod
    def lower_names(headers: Any) -> list[str]:
        """requests ``headers``' names, lower-cased."""
        try:  # a CaseInsensitiveDict keeps its names lower-cased as its keys
            return list(headers._store)
        except AttributeError:
            return [name.lower() for name in headers]

    @staticmethod
    def names_quota(headers: Any) -> bool:
        """Whether a rate-limit header is among requests ``headers`` (one pass)."""
        names = " ".join(RetryAdapter.lower_names(headers))
        return "rate" in names and ("ratelimit" in names or "rate-limit" in names)

    @staticmethod
    def replayable(request: Any) -> bool:
        """No body, bytes or str can be sent again; a generator or file cannot."""
        body = request.body
        return body is None or isinstance(body, bytes | str)

    @staticmethod
    def numbered(request: Any, number: int) -> requests.PreparedRequest:
        """A copy of the prepared ``request`` carrying ``Retry-Attempt: number``."""
        copy: requests.PreparedRequest = request.copy()
        copy.headers[RETRY_ATTEMPT] = str(number)
        return copy

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | Timeout | None = None,
        verify: bool | str = True,
        cert: bytes | str | tuple[bytes | str, bytes | str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        # As RetryTransport's success path (client/_httpx.py): the lane's gate
        # first, the general path of client/_front.py for anything but a plain success.
        lane = self.bare_lane
        if lane is None:  # HttpFront.lane_of(), inline
            url = request.url or ""
            # Everything up to the first "/" after the scheme holds the scheme and
            # the whole authority (requests' prepared URLs always have a path).
            end = url.find("/", url.find("://") + 3)
            key = url if end < 0 else url[:end]
            lane = self._lanes.get(key)
            if lane is None or lane.generation != self.guards.generation or lane.touch_in <= 0:
                lane = self._new_lane(key, url, origin_of)
            else:
                lane.touch_in -= 1
        started = self.monotonic()
        gate = lane.gate
        ticket = True if gate is None else gate.enter(started)
        if ticket is None:
            options = (stream, timeout, verify, cert, proxies)
            call = self._call(request, lane, started)
            return first_attempt(call, with_bulkhead(call, self._send(call, options)))  # type: ignore[no-any-return]
        given = timeout
        if timeout != lane.fitting:  # else: found within the deadline before
            timeout = _cap_timeout(timeout, lane.deadline)
            if timeout == given:
                lane.fitting = given
        try:
            response: Any = super().send(request, stream, timeout, verify, cert, proxies)  # type: ignore[arg-type]
        except BaseException as exc:
            response = self.broken(lane, exc)
        else:
            if response.status_code < 400:
                try:  # a CaseInsensitiveDict keeps its names lower-cased as its keys
                    plain = not lane.observes or _PLAIN_NAMES.issuperset(response.headers._store)
                except AttributeError:  # headers of another kind
                    plain = False
                if plain or self.quota_free(response.headers, _PLAIN_NAMES):
                    if gate is not None:
                        gate.settle(ticket, started)
                    return response  # type: ignore[no-any-return]
        options = (stream, given, verify, cert, proxies)
        return self._resume(request, lane, started, ticket, response, options)

    def _resume(
        self,
        request: requests.PreparedRequest,
        lane: Lane,
        started: float,
        ticket: Any,
        response: Any,
        options: tuple[Any, ...],
    ) -> requests.Response:
        call = self._call(request, lane, started)
        first = lambda: self._first(call, response)  # noqa: E731
        return resume(call, ticket, first, self._send(call, options))  # type: ignore[no-any-return]

    def _call(self, request: requests.PreparedRequest, lane: Lane, started: float) -> HttpCall:
        url = request.url or ""
        return HttpCall(self, lane, request.method or "GET", url, request.headers, request, started)

    def _send(self, call: HttpCall, options: tuple[Any, ...]) -> Callable[[], Outcome]:
        stream, timeout, verify, cert, proxies = options
        adapter_send = super().send

        def send_once() -> Outcome:
            capped = _cap_timeout(timeout, call.remaining())
            try:
                response = adapter_send(call.attempt(), stream, capped, verify, cert, proxies)  # type: ignore[arg-type]  # a urllib3 Timeout too
            except Exception as exc:
                return call.error(_failure_kind(exc), exc)
            return self._outcome(call, response)

        return send_once

    def _first(self, call: HttpCall, result: Any) -> Outcome:
        if isinstance(result, Exception):
            return call.error(_failure_kind(result), result)
        return self._outcome(call, result)

    def _outcome(self, call: HttpCall, response: requests.Response) -> Outcome:
        status = response.status_code
        if self.plain(call.lane, response):
            return _success(response)
        small = status >= 400 and body_worth_reading(status, response.headers.get("content-length"))
        try:
            body = response.content if small else None
        except requests.RequestException as exc:
            # The body broke off mid-read: the attempt failed as its read did.
            response.close()
            return call.error(_failure_kind(exc), exc)
        return call.observed(response, status, response.headers, body)


# The lower-cased header names found in no quota (see client/_front.py).
_PLAIN_NAMES: set[str] = set()
# How many URLs' request_url answers an adapter keeps (then it starts afresh).
_MAX_PATHS = 512


def _timeout_fits(timeout: Timeout, remaining: float) -> bool:
    # A urllib3 Timeout bounds an attempt by its total, else by connect and read.
    total = timeout.total
    if isinstance(total, int | float):
        return total <= remaining
    bounds = (timeout._connect, timeout._read)
    return all(isinstance(bound, int | float) and bound <= remaining for bound in bounds)


def _cap_timeout(
    timeout: float | tuple[float | None, float | None] | Timeout | None, remaining: float
) -> float | tuple[float, float] | Timeout | None:
    if remaining == math.inf:  # deadline=None: the caller's timeout as it is
        return timeout  # type: ignore[return-value]  # requests' own shapes, passed through
    remaining = max(0.001, remaining)
    if timeout is None:
        return remaining
    if isinstance(timeout, Timeout):  # urllib3's own, which HTTPAdapter passes on
        if _timeout_fits(timeout, remaining):
            return timeout
        capped = timeout.clone()
        total = timeout.total
        capped.total = min(total, remaining) if isinstance(total, int | float) else remaining
        return capped
    if isinstance(timeout, tuple):
        connect, read = timeout
        return (
            remaining if connect is None else min(connect, remaining),
            remaining if read is None else min(read, remaining),
        )
    return min(float(timeout), remaining)
