# stormguard.httpx.RetryTransport: one class that is both an httpx.BaseTransport
# and an httpx.AsyncBaseTransport. It wraps an inner transport, delegates each
# attempt to it, and forwards close()/aclose(). It has no retry loop: the engine
# (core/_engine.py, driven by client/_driver.py) runs the call, and the two
# `send` functions below only make one attempt and translate it (client/_front.py).
from __future__ import annotations

import math
import operator
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, Unpack

import httpx

from ..core._engine import Outcome
from ..core._outcome import Failure
from ._attempt import RETRY_ATTEMPT
from ._front import (
    _MAX_LANES,
    FrontOptions,
    HttpCall,
    HttpFront,
    Lane,
    _success,
    afirst_attempt,
    aresume,
    awith_bulkhead,
    first_attempt,
    resume,
    with_bulkhead,
)
from ._http import body_worth_reading
from ._inner import Wrapping, numbered

__all__ = ["RetryTransport"]

_INF = math.inf
T = TypeVar("T")

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


def _origin_key(url: httpx.URL) -> Any:
    # The parsed scheme, host and port decide the origin; reading them off httpx's
    # parse result costs a tuple, where _origin() costs three URL properties.
    try:
        ref = url._uri_reference
        return (ref.scheme, ref.host, ref.port)
    except AttributeError:  # an httpx without it: the origin is its own key
        return _origin(url)


def _cap_timeouts(request: httpx.Request, remaining: float) -> bool:
    """No attempt may outlive the call's deadline (``inf``: deadline=None).

    The request's timeouts are rewritten only when the deadline shortens one;
    True when none needed it.
    """
    timeouts = request.extensions.get("timeout")
    if remaining == _INF or not isinstance(timeouts, dict):
        return True
    remaining = max(0.001, remaining)
    for value in timeouts.values():
        if value is None or value > remaining:
            break
    else:
        return True
    request.extensions["timeout"] = {
        name: remaining if value is None else min(value, remaining)
        for name, value in timeouts.items()
    }
    return False


def _cap_first(request: httpx.Request, lane: Lane) -> None:
    """:func:`_cap_timeouts` for a first attempt (the whole deadline is left);
    timeouts that fit are remembered, so the same ones need no look next time."""
    timeouts = request.extensions.get("timeout")
    if _cap_timeouts(request, lane.deadline):
        lane.fitting = dict(timeouts) if isinstance(timeouts, dict) else timeouts


def _wants_body(response: httpx.Response) -> bool:
    """A small 429/503 body may carry the wait hint; read it before judging."""
    return body_worth_reading(response.status_code, response.headers.get("content-length"))


def _body(response: httpx.Response) -> bytes | None:
    """A failed response's body when it was read (for wait hints), else None."""
    return _body_if_read(response) if response.status_code >= 400 else None


class RetryTransport(HttpFront, Wrapping):
    """An httpx transport that retries by stormguard's decision table.

    >>> import httpx, stormguard
    >>> from stormguard.httpx import RetryTransport
    >>> client = httpx.Client(transport=RetryTransport(policy=stormguard.RetryPolicy(attempts=3)))

    ``transport`` is the inner transport (default: ``httpx.HTTPTransport()`` for
    sync use, ``httpx.AsyncHTTPTransport()`` for async use, created on first use).
    ``policy`` is a :class:`stormguard.RetryPolicy` (default ``RetryPolicy()``).
    ``retry_if`` (the policy's, given here for short) is called with each failed
    response or transport error and returns ``True`` (retry it, e.g. a 409 on GET),
    ``False`` (never, e.g. a "Bad credentials" 403) or ``None`` (the table decides);
    it cannot make an unkeyed POST that may have been processed retryable.
    With ``idempotency_keys=True`` a POST or PATCH without an ``Idempotency-Key``
    gets one (UUID4) before its first attempt, reused on every retry. When the
    call stops, the last response is returned as it is (its status tells the
    caller what happened); the last transport error is raised as it is.
    ``on_retry`` hooks receive a :class:`stormguard.RetryRecord` per retry.
    ``body_excerpt`` is how many characters of a failed 429/503 response's body
    (where APIs name the limit hit) the retry records and log lines carry
    (default 4096; longer bodies are cut with a marker; 0 leaves bodies out).

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
        **options: Unpack[FrontOptions],
    ) -> None:
        self._wrap(transport)
        self._configure("RetryTransport", options)
        # Lanes by host (the lane of each host's first origin; see _lane_by_host).
        self._hosts: dict[str, Lane] = {}

    # -- the two front ends of the engine ---------------------------------------
    #
    # A request's first attempt goes through its lane's gate (Lane.enter): when the
    # origin's protection is taken at once, the request is sent right here and a
    # plain success (< 400, no quota headers to learn from) is handed back with no
    # HttpCall, run or permit built. Anything else -- the gate saying no, a
    # transport error, a status the table judges, quota headers -- goes to the
    # general path of client/_front.py, which does what it always did.

    def _call(self, request: httpx.Request, lane: Lane, started: float) -> HttpCall:
        return HttpCall(self, lane, request.method, request.url, request.headers, request, started)

    @staticmethod
    def replayable(request: Any) -> bool:
        """Bodies given as bytes/str/json/form are held in a ByteStream and can be
        sent again; a generator or file stream is one-shot and is never retried."""
        return isinstance(request.stream, httpx.ByteStream)

    @staticmethod
    def pairs(headers: Any) -> list[tuple[str, str]]:
        """httpx headers as (name, value) pairs."""
        pairs: list[tuple[str, str]] = headers.multi_items()
        return pairs

    @staticmethod
    def lower_names(headers: Any) -> list[bytes]:
        """httpx ``headers``' names, lower-cased (as httpx keeps them beside the raw ones)."""
        try:
            return list(map(_LOWER_NAME, headers._list))
        except AttributeError:
            return [name.lower() for name, _ in headers.raw]

    @staticmethod
    def names_quota(headers: Any) -> bool:
        """Whether a rate-limit header is among httpx ``headers`` (raw names, one pass)."""
        names = b" ".join(RetryTransport.lower_names(headers))
        # (bytes.find: `in` on bytes first tries the needle as an int, and fails)
        return names.find(b"rate") >= 0 and (
            names.find(b"ratelimit") >= 0 or names.find(b"rate-limit") >= 0
        )

    @staticmethod
    def numbered(request: Any, number: int) -> httpx.Request:
        """A copy of ``request`` carrying ``Retry-Attempt: number`` (same body stream,
        which is replayable: a one-shot body is never retried)."""
        return numbered(request, RETRY_ATTEMPT, number)

    def _send(self, call: HttpCall, inner: httpx.BaseTransport) -> Callable[[], Outcome]:
        def send() -> Outcome:
            request = call.attempt()
            _cap_timeouts(request, call.remaining())
            try:
                response = inner.handle_request(request)
            except Exception as exc:
                return call.error(_failure_kind(exc), exc)
            return self._outcome(call, response)

        return send

    def _outcome(self, call: HttpCall, response: httpx.Response) -> Outcome:
        if self.plain(call.lane, response):
            return _success(response)
        if _wants_body(response):
            try:
                response.read()
            except httpx.HTTPError as exc:
                # The body broke off (often: the deadline cut the read). A half-read
                # response cannot be handed back, so the attempt failed as its read.
                response.close()
                return call.error(_failure_kind(exc), exc)
        return call.observed(response, response.status_code, response.headers, _body(response))

    def _asend(
        self, call: HttpCall, inner: httpx.AsyncBaseTransport
    ) -> Callable[[], Awaitable[Outcome]]:
        async def asend() -> Outcome:
            request = call.attempt()
            _cap_timeouts(request, call.remaining())
            try:
                response = await inner.handle_async_request(request)
            except Exception as exc:
                return call.error(_failure_kind(exc), exc)
            return await self._aoutcome(call, response)

        return asend

    async def _aoutcome(self, call: HttpCall, response: httpx.Response) -> Outcome:
        if self.plain(call.lane, response):
            return _success(response)
        if _wants_body(response):
            try:
                await response.aread()
            except httpx.HTTPError as exc:
                await response.aclose()  # a half-read body: as in _outcome()
                return call.error(_failure_kind(exc), exc)
        return await call.aobserved(
            response, response.status_code, response.headers, _body(response)
        )

    def _first(self, call: HttpCall, result: Any) -> Outcome:
        if isinstance(result, Exception):
            return call.error(_failure_kind(result), result)
        return self._outcome(call, result)

    async def _afirst(self, call: HttpCall, result: Any) -> Outcome:
        if isinstance(result, Exception):
            return call.error(_failure_kind(result), result)
        return await self._aoutcome(call, result)

    # The success path: both front ends below are the same four steps, and only
    # the send is awaited in one of them. The two sync halves around the send,
    # _enter() and _passed(), are shared; they write out what a plain success
    # needs of the front end itself in one frame (the lane look-up,
    # HttpFront.lane_of, here by host first; the quota-name check) and enter and
    # settle the lane's gate through its own methods (protection/_quick.py, on
    # the breaker's and the bulkhead's lock-free try_enter/settle pairs).
    # tests/client/test_success_path_fronts.py runs each rule through both front
    # ends (and through RetryAdapter.send).

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        inner = self._sync_inner or self._sync()
        lane, started, ticket = self._enter(request)
        if ticket is None:
            call = self._call(request, lane, started)
            return first_attempt(call, with_bulkhead(call, self._send(call, inner)))  # type: ignore[no-any-return]
        try:
            response: Any = inner.handle_request(request)
        except BaseException as exc:
            response = self.broken(lane, exc)
        else:
            if response.status_code < 400 and self._passed(lane, started, ticket, response):
                return response  # type: ignore[no-any-return]
        return self._resume(request, lane, started, ticket, response, inner)  # type: ignore[no-any-return]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        inner = self._async_inner or self._async()
        lane, started, ticket = self._enter(request)
        if ticket is None:
            call = self._call(request, lane, started)
            return await afirst_attempt(call, awith_bulkhead(call, self._asend(call, inner)))  # type: ignore[no-any-return]
        try:
            response: Any = await inner.handle_async_request(request)
        except BaseException as exc:
            response = self.broken(lane, exc)
        else:
            if response.status_code < 400 and self._passed(lane, started, ticket, response):
                return response  # type: ignore[no-any-return]
        return await self._aresume(request, lane, started, ticket, response, inner)  # type: ignore[no-any-return]

    def _enter(self, request: httpx.Request) -> tuple[Lane, float, Any]:
        """A first attempt's lane, when it starts, and its ticket from the lane's
        gate (None: the general path makes the attempt; nothing was taken). The
        request's timeouts are capped by the deadline first, where it shortens them."""
        lane = self.bare_lane
        if lane is None:  # HttpFront.lane_of(), inline: by host first
            url = request.url
            try:
                ref = url._uri_reference
            except AttributeError:  # an httpx without it: by origin
                lane = self.lane_of(_origin(url), url, _origin)
            else:
                lane = self._hosts.get(ref.host)
                if (
                    lane is None
                    or lane.scheme != ref.scheme
                    or lane.port != ref.port
                    or lane.generation != self.guards.generation
                ):
                    lane = self._lane_by_host(ref, url)
        try:  # timeouts seen to fit the deadline before need no capping
            if request.extensions["timeout"] != lane.fitting:
                _cap_first(request, lane)
        except KeyError:  # a request built without a client has none
            pass
        started = _monotonic() if self.system_clock else self.monotonic()
        gate = lane.gate
        if gate is None:
            return lane, started, True
        if lane.quick is None:  # (a gate with a budget tells the registry itself)
            lane.touch_in -= 1
            if lane.touch_in <= 0:
                self.touched(lane)
        return lane, started, gate.enter(started)

    def _passed(self, lane: Lane, started: float, ticket: Any, response: Any) -> bool:
        """Whether a first attempt's success (< 400) ends the call as it is: no
        header of it names a quota the pacer must learn. Then its gate is settled."""
        if lane.observes:
            try:  # httpx keeps (raw name, lower-cased name, value) triples
                for name in response.headers._list:
                    if name[1] not in _PLAIN_NAMES:
                        break
                else:
                    name = None
            except AttributeError:  # an httpx that does not: scanned each time
                name = True
            if name is not None and not self.quota_free(response.headers, _PLAIN_NAMES):
                return False
        gate = lane.gate
        if gate is not None:
            gate.settle(ticket, started)
        return True

    def _lane_by_host(self, ref: Any, url: httpx.URL) -> Lane:
        # The look-up by every part of the URL that decides the origin (scheme,
        # user info, host, port: httpx's parse result), when the lane kept for the
        # host is missing, of another origin on that host, or due to be renewed.
        # The lane found is kept for the host unless another origin of the host is
        # (that one keeps the fast look-up; this one always comes here).
        lane = self.lane_of(ref[:4], url, _origin)
        hosts, host = self._hosts, ref.host
        held = hosts.get(host)
        if held is None or held is lane or (held.scheme, held.port) == (ref.scheme, ref.port):
            if held is None and len(hosts) >= _MAX_LANES:
                hosts.clear()
            lane.scheme, lane.port = ref.scheme, ref.port
            hosts[host] = lane
        return lane

    def _resume(
        self,
        request: httpx.Request,
        lane: Lane,
        started: float,
        ticket: Any,
        response: Any,
        inner: httpx.BaseTransport,
    ) -> Any:
        # (a function of its own: a closure in handle_request would make each of
        # its variables a cell, on every request)
        call = self._call(request, lane, started)
        return resume(call, ticket, lambda: self._first(call, response), self._send(call, inner))

    async def _aresume(
        self,
        request: httpx.Request,
        lane: Lane,
        started: float,
        ticket: Any,
        response: Any,
        inner: httpx.AsyncBaseTransport,
    ) -> Any:
        call = self._call(request, lane, started)  # (as _resume)
        first = lambda: self._afirst(call, response)  # noqa: E731
        return await aresume(call, ticket, first, self._asend(call, inner))


_LOWER_NAME = operator.itemgetter(1)
_monotonic = time.monotonic
# The lower-cased header names found in no quota (see client/_front.py).
_PLAIN_NAMES: set[bytes] = set()
