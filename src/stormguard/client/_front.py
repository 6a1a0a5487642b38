# What the two HTTP front ends (httpx, requests) share, with no HTTP library
# imported: their configuration, and one logical request's facts — its method and
# idempotency key, whether its body can be replayed, its origin's guard, and the
# translation of a response or a transport error into the engine's Outcome.
# Each adapter keeps only what its library spells differently.
from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from functools import partial
from typing import Any

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import BulkheadFull, ConfigError
from ..core._body_hints import MAX_BODY
from ..core._engine import Outcome, records_outcomes
from ..core._outcome import Failure
from ..core._policy import RetryFailure, RetryPolicy
from ..core._ratelimit_headers import Quota, parse_rate_limits
from ..protection._origin import (
    COOLDOWN_STATUSES,
    OriginGuard,
    OriginGuards,
    Protection,
    guards_for,
    unknown_keywords,
)
from ..protection._quick import QuickGuard, quick_guard
from ._driver import Detail, Engine, RetryHook, Run
from ._driver import _twin as twin
from ._http import (
    IDEMPOTENCY_KEY,
    KEYED_METHODS,
    describe,
    error_failure,
    new_idempotency_key,
    response_failure,
)

__all__ = [
    "FrontOptions",
    "HttpCall",
    "HttpFront",
    "Lane",
    "Observation",
    "afirst_attempt",
    "aresume",
    "awith_bulkhead",
    "first_attempt",
    "one_shot",
    "resume",
    "with_bulkhead",
    "with_retry_if",
]

# What an origin guard observes of a response: status, header pairs, parsed hint.
Observation = tuple[int, list[tuple[str, str]], float | None]


class FrontOptions(Protection, total=False):
    """The keywords of both HTTP adapters (see RetryTransport's docstring)."""

    policy: RetryPolicy | None
    retry_if: Callable[[Any], bool | None] | None
    idempotency_keys: bool
    on_retry: RetryHook | Sequence[RetryHook]
    body_excerpt: int
    clock: Clock | None
    rng: random.Random | None
    guards: OriginGuards | None


def with_retry_if(policy: RetryPolicy | None, retry_if: Any) -> RetryPolicy:
    """``policy`` (default ``RetryPolicy()``) with an adapter's ``retry_if`` keyword, if given."""
    policy = policy if policy is not None else RetryPolicy()
    return policy if retry_if is None else policy.replace(retry_if=retry_if)


# A response body in a log line or record is cut here (the body itself is read
# only when small: 429/503 up to 64 KiB, for wait hints).
BODY_EXCERPT = 4096


def excerpt(body: bytes | None, limit: int = BODY_EXCERPT) -> str | None:
    """A failed response's body for the log: decoded leniently, cut past ``limit``."""
    if not body or limit <= 0:
        return None
    text = body[: limit * 4].decode("utf-8", errors="replace")
    if len(text) > limit or len(body) > limit * 4:
        return text[:limit] + f"… [{len(body)} bytes in all]"
    return text


def exhausted_quota(pairs: list[tuple[str, str]], wall_now: float) -> Quota | None:
    """The quota the response's rate-limit headers say is used up, if any."""
    try:
        quotas = parse_rate_limits(pairs, now=wall_now)
    except Exception:  # a hostile header never breaks a request
        return None
    return next((quota for quota in quotas if quota.remaining == 0), None)


def one_shot(failure: RetryFailure) -> RetryFailure:
    """DESIGN rule 5: a body that cannot be replayed is never retried, whoever asks."""
    return RetryFailure(False, failure.reason + " (one-shot body)", failure.hint)


class HttpFront:
    """The configuration both HTTP adapters take (see RetryTransport's docstring)."""

    policy: RetryPolicy
    idempotency_keys: bool
    body_excerpt: int
    hooks: tuple[RetryHook, ...]
    clock: Clock
    rng: random.Random | None
    guards: OriginGuards
    engine: Engine
    monotonic: Callable[[], float]

    @staticmethod
    def pairs(headers: Any) -> list[tuple[str, str]]:
        """The library's header mapping as (name, value) pairs."""
        raise NotImplementedError

    @staticmethod
    def names_quota(headers: Any) -> bool:
        """Whether a header name of the library's mapping is a rate-limit header."""
        raise NotImplementedError

    @staticmethod
    def lower_names(headers: Any) -> list[Any]:
        """The library's header names, lower-cased as it keeps them."""
        raise NotImplementedError

    @staticmethod
    def replayable(request: Any) -> bool:
        """Whether the library's request has a body that can be sent again."""
        raise NotImplementedError

    @staticmethod
    def numbered(request: Any, number: int) -> Any:
        """A copy of the library's request carrying ``Retry-Attempt: number``."""
        raise NotImplementedError

    def _configure(self, owner: str, options: FrontOptions) -> None:
        """Take the adapter's keywords (see :class:`FrontOptions`): policy, keys, hooks,
        protection; an unknown one is a TypeError, as in any ``owner()`` call."""
        unknown_keywords(owner, options, FrontOptions.__optional_keys__)
        on_retry = options.get("on_retry", ())
        clock, rng = options.get("clock"), options.get("rng")
        self.policy = with_retry_if(options.get("policy"), options.get("retry_if"))
        self.idempotency_keys = bool(options.get("idempotency_keys", False))
        body_excerpt = options.get("body_excerpt", BODY_EXCERPT)
        if (
            not isinstance(body_excerpt, int)
            or isinstance(body_excerpt, bool)
            or not 0 <= body_excerpt <= MAX_BODY
        ):
            raise ConfigError(
                "body_excerpt", f"must be an int in [0, {MAX_BODY}], got {body_excerpt!r}"
            )
        self.body_excerpt = body_excerpt
        self.hooks = (on_retry,) if callable(on_retry) else tuple(on_retry)
        self.clock = clock or SYSTEM_CLOCK
        self.monotonic = time.monotonic if self.clock is SYSTEM_CLOCK else self.clock.monotonic
        # (a success path reads time.monotonic itself then: a call of the module's
        # name costs less than one of an attribute)
        self.system_clock = self.clock is SYSTEM_CLOCK
        self.rng = rng
        protection: Protection = {  # type: ignore[assignment]
            name: options[name]  # type: ignore[literal-required]
            for name in Protection.__optional_keys__
            if name in options
        }
        self.guards = guards_for(guards=options.get("guards"), clock=clock, rng=rng, **protection)
        self.engine = Engine(clock=self.clock, rng=rng, hooks=self.hooks)
        self._lanes: dict[Any, Lane] = {}
        # With every protection off no request needs an origin: one lane for all.
        self.bare_lane = None if self.guards.enabled else self._make_lane("", None)

    def lane_of(self, key: Any, url: Any, origin_of: Callable[[Any], str]) -> Lane:
        """The lane of ``url``'s origin, found by ``key`` (a cheap stand-in for the
        scheme and authority of ``url``, which decide its origin); ``origin_of``
        computes the origin itself when the lane is made.

        A lane holds the guard the registry handed out and is used while the
        registry's ``generation`` is unchanged: an eviction or a ``reset()`` (also
        ``reset_process_guards()``) makes every lane ask the registry again at its
        next request. Every ``_TOUCH_EVERY`` requests a lane also asks the registry
        for its guard, which marks the origin recently used for eviction. The
        adapters' success paths inline this look-up (see client/_httpx.py) and
        call here only when it is due; RetryTransport's lanes tell the registry
        instead (:meth:`touched`, or their lock-free gate at each budget batch).
        """
        lane = self._lanes.get(key)
        if lane is None or lane.generation != self.guards.generation or lane.touch_in <= 0:
            return self._new_lane(key, url, origin_of)
        lane.touch_in -= 1
        return lane

    def plain(self, lane: Lane, response: Any) -> bool:
        """Whether ``response`` ends the call as it is, with nothing for the guard
        to learn (a success without quota headers, or one nobody paces)."""
        return response.status_code < 400 and not (
            lane.observes and self.names_quota(response.headers)
        )

    def quota_free(self, headers: Any, plain_names: set[Any]) -> bool:
        """Whether no header name of a success names a quota, the slow way (a name
        missing from ``plain_names``); the names are then added to it."""
        if self.names_quota(headers):
            return False
        if len(plain_names) < _MAX_PLAIN_NAMES:
            plain_names.update(self.lower_names(headers))
        return True

    @staticmethod
    def broken(lane: Lane, exc: BaseException) -> Exception:
        """The error a first attempt on the gate raised, to be judged; a cancellation
        or interrupt gives the gate back what it took and is raised again."""
        if isinstance(exc, Exception):
            return exc
        lane.abandon()
        raise exc

    def _new_lane(self, key: Any, url: Any, origin_of: Callable[[Any], str]) -> Lane:
        guards, lanes = self.guards, self._lanes
        generation = guards.generation
        lane = lanes.get(key)
        origin = origin_of(url) if lane is None else lane.origin
        guard = guards.get(origin)
        if lane is None or lane.guard is not guard:
            if len(lanes) >= _MAX_LANES:
                lanes.clear()
            lane = lanes[key] = self._make_lane(origin, guard)
        lane.generation = generation
        lane.touch_in = _TOUCH_EVERY - 1  # requests until the registry is asked again
        return lane

    def _make_lane(self, origin: str, guard: OriginGuard | None) -> Lane:
        # A request that gets an Idempotency-Key needs its HttpCall before the send:
        # such a front end's lanes always take the general path.
        touch = None if guard is None else partial(self.guards.touch, origin)
        return Lane(
            origin, guard, self.policy, self.monotonic, general=self.idempotency_keys, touch=touch
        )

    def touched(self, lane: Lane) -> None:
        """A lane's every ``_TOUCH_EVERY``-th request: the registry hears its origin
        is in use (a lane whose gate counts budget batches tells it from there)."""
        lane.touch_in = _TOUCH_EVERY
        if lane.touch is not None:
            lane.touch()


class Lane:
    """What a front end needs of one origin on every request, found once per origin.

    ``guard`` is the origin's OriginGuard as the registry handed it out: a lane is
    used only while the registry's ``generation`` is the one it was found in, so
    an origin evicted from the registry, or a reset of it, gives the next request
    the registry's guard again (see :meth:`HttpFront.lane_of`). ``policy`` is the
    front end's policy with the origin's breaker and budget; ``observes`` says
    whether a response that is neither 429 nor 503 must still be shown to the
    guard (pacing reads every response's quota headers).

    ``gate`` opens a first attempt: None when there is nothing to take (no
    guard), else ``gate.enter(now)`` (``now`` on the front end's clock) returns a
    ticket when the attempt may be sent at once -- its protection taken by the
    guard's lock-free gate (protection/_quick.py) -- or None when the general path
    (:func:`first_attempt`) must make it. ``fitting`` is the last request timeouts
    that a first attempt found within the deadline: equal ones need no capping.
    """

    __slots__ = (
        "aadmit",
        "acount",
        "breaker",
        "budget",
        "bulkhead",
        "deadline",
        "fitting",
        "gate",
        "generation",
        "guard",
        "max_wait",
        "observes",
        "origin",
        "outcomes",
        "paced",
        "policy",
        "port",
        "protected",
        "quick",
        "scheme",
        "touch",
        "touch_in",
    )

    def __init__(
        self,
        origin: str,
        guard: OriginGuard | None,
        policy: RetryPolicy,
        monotonic: Callable[[], float],
        *,
        general: bool = False,
        touch: Callable[[], object] | None = None,
    ) -> None:
        self.origin = origin
        self.generation = -1
        self.touch_in = 0
        # Tells the origin's registry the origin is in use (None: no guard).
        self.touch = touch
        # The origin's scheme and port as the front end's URL parser gives them,
        # when its look-up by host checks them (httpx's: see RetryTransport).
        self.scheme: Any = None
        self.port: Any = None
        self.guard = guard
        self.policy = policy = policy if guard is None else guard.policy(policy)
        self.breaker = policy.breaker
        self.budget = policy.budget
        # A budget that hears every answer (a quota): a first attempt's success is told.
        self.outcomes = records_outcomes(self.budget)
        self.aadmit = getattr(self.breaker, "aacquire", None)
        self.acount = getattr(self.budget, "arecord_request", None)
        self.deadline = policy.deadline_s
        self.max_wait = policy.max_wait_s
        # The last timeouts a first attempt found within the deadline (nothing to cap).
        self.fitting: Any = _UNSEEN
        self.bulkhead = None if guard is None else guard.bulkhead
        self.paced = guard is not None and guard.paced
        self.observes = guard is not None and guard.pacing
        # Anything to do before the send at all (count, pace, admit)?
        self.protected = self.paced or self.breaker is not None or self.budget is not None
        self.gate: QuickGuard | _General | None = _GENERAL
        # The gate when it is the lock-free one with a budget: it tells the registry
        # the origin is in use whenever it counts its budget's batch, so the
        # front end need not count the lane's requests (see touched()).
        self.quick: QuickGuard | None = None
        if general:
            return
        if guard is None:
            if self.breaker is None and self.budget is None:
                self.gate = None
        elif policy.breaker is guard.breaker and policy.budget is guard.budget:
            # (a policy's own breaker or budget is taken by the general path)
            quick = quick_guard(guard, monotonic, touch)
            self.gate = quick or _GENERAL
            if quick is not None and quick.budget is not None:
                self.quick = quick

    def abandon(self) -> None:
        """A first attempt on the gate never ended (cancelled): the gate's take goes back."""
        if self.gate is not None:
            self.gate.abandon()


class _General:
    """The gate of a lane whose first attempts always take the general path."""

    __slots__ = ()

    def enter(self, now: float) -> None:
        return None

    # It hands out no tickets, so it is never settled nor abandoned.
    def settle(self, ticket: Any, started: float, failure: bool = False) -> None:
        return None

    def abandon(self) -> None:
        return None


_GENERAL = _General()
_UNSEEN = object()


_MAX_LANES = 1024
_TOUCH_EVERY = 256

# Pacing reads the quota headers of every response, so each success's header names
# are looked at. A name's verdict never changes (a rate-limit name holds
# "ratelimit" or "rate-limit", see core/_ratelimit_headers.py), so the names
# found plain are kept in a set per library (bytes for httpx, str for requests),
# and a success whose every name is there is settled by one C-level
# `set.issuperset` instead of a scan. The set is process-wide and bounded: past
# _MAX_PLAIN_NAMES names (a server inventing names) new ones are scanned on every
# response, as before, and never kept.
_MAX_PLAIN_NAMES = 1024


class HttpCall:
    """One logical HTTP request across its attempts.

    An HttpCall is made only when a first attempt needs more than the lane's gate
    (:meth:`HttpFront.open`): either the general first attempt
    (:func:`first_attempt`: the budget's count, pacing, the breaker's admission,
    the bulkhead, one send) or the judging of a gated attempt that did not simply
    succeed (:func:`resume`). The engine (``run``) is started only when the first
    attempt failed, from the same start time, and drives every later attempt.
    Whether the request carries an ``Idempotency-Key`` (``has_key``) and whether
    its body can be replayed (``replayable``) are read only when an attempt failed.
    """

    __slots__ = (
        "_has_key",
        "_run",
        "front",
        "guard",
        "headers",
        "lane",
        "method",
        "request",
        "started",
        "url",
    )

    def __init__(
        self,
        front: HttpFront,
        lane: Lane,
        method: str,
        url: Any,
        headers: MutableMapping[str, str],
        request: Any,
        started: float,
    ) -> None:
        self.front = front
        self.lane = lane
        self.guard = lane.guard
        self.url = url  # str()-ed only when a retry is logged
        self.headers = headers
        self.method = method
        self._has_key: bool | None = None
        if front.idempotency_keys:
            self.method = method = method.upper()
            if method in KEYED_METHODS and IDEMPOTENCY_KEY not in headers:
                headers[IDEMPOTENCY_KEY] = new_idempotency_key()
                self._has_key = True
        self.request = request
        self._run: Run | None = None
        self.started = started

    @property
    def has_key(self) -> bool:
        """Whether the request carries an ``Idempotency-Key``."""
        has_key = self._has_key
        if has_key is None:
            has_key = self._has_key = IDEMPOTENCY_KEY in self.headers
        return has_key

    @property
    def policy(self) -> RetryPolicy:
        """The call's policy (with the origin's breaker and budget)."""
        return self.lane.policy

    @property
    def replayable(self) -> bool:
        """Whether the request's body can be sent again (asked after a failure only)."""
        return self.front.replayable(self.request)

    @property
    def run(self) -> Run:
        """The engine's run of this call, started (from the call's start) on first use."""
        run = self._run
        if run is None:
            guard = self.guard
            pace = None if guard is None else (guard.wait_before, guard.await_before)
            method, url = self.method.upper(), self.url
            run = self._run = self.front.engine.start(
                self.lane.policy,
                target=lambda: describe(method, str(url)),
                started_at=self.started,
                pace=pace,
                discard=_DISCARD,
            )
        return run

    def remaining(self) -> float:
        """Seconds left before the call's deadline (``inf`` without one)."""
        return self.lane.deadline - (self.front.monotonic() - self.started)

    def attempt(self) -> Any:
        """The request to send now: the call's own for a first attempt; for a retry
        a copy that says which attempt it is (``Retry-Attempt: N``, 2 on the first
        retry; client/_attempt.py), so the caller's request object is left as it
        was given (it may be sent again, as a first attempt)."""
        run = self._run
        if run is None:
            return self.request
        number = run.conversation.attempts
        return self.request if number < 2 else self.front.numbered(self.request, number)

    def slot(self) -> contextlib.AbstractContextManager[None]:
        """The origin's bulkhead slot for one attempt (waits at most the deadline)."""
        if self.guard is None:
            return contextlib.nullcontext()
        return self.guard.slot(max(0.0, self.remaining()))

    def aslot(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Async twin of :meth:`slot`."""
        if self.guard is None:
            return contextlib.nullcontext()
        return self.guard.aslot(max(0.0, self.remaining()))

    def settle(
        self, response: Any, status: int, headers: Any, body: bytes | None
    ) -> tuple[Outcome, Observation | None]:
        """A response as the attempt's Outcome (5xx count against the server, 4xx
        not), and what the origin's guard should observe of it (or None).

        ``headers`` is the library's header mapping; ``body`` the small 429/503
        body already read, if any.
        """
        front = self.front
        observation: Observation | None = None
        if self.guard is not None and (
            status in COOLDOWN_STATUSES or (self.lane.observes and front.names_quota(headers))
        ):
            observation = (status, front.pairs(headers), None)
        if status < 400:
            return _success(response), observation
        pairs = front.pairs(headers) if observation is None else observation[1]
        wall_now = front.clock.time()
        failure = response_failure(
            self.lane.policy,
            status,
            pairs,
            method=self.method.upper(),
            has_key=self.has_key,
            wall_now=wall_now,
            body=body,
            content_type=headers.get("content-type"),
            subject=response,
        )
        if failure is None:
            return Outcome(None, status >= 500, response), observation
        if observation is not None:  # the guard reuses the hint parsed here
            observation = (status, observation[1], failure.hint)
        if not self.replayable:
            failure = one_shot(failure)
        detail = Detail(excerpt(body, front.body_excerpt), exhausted_quota(pairs, wall_now))
        return Outcome(failure, status >= 500, response, None, detail), observation

    def observed(self, response: Any, status: int, headers: Any, body: bytes | None) -> Outcome:
        """:meth:`settle`, and the origin's guard shown what it should observe."""
        outcome, observation = self.settle(response, status, headers, body)
        if observation is not None:
            assert self.guard is not None
            self.guard.observe(*observation)
        return outcome

    async def aobserved(
        self, response: Any, status: int, headers: Any, body: bytes | None
    ) -> Outcome:
        """Async twin of :meth:`observed` (awaits a shared cooldown)."""
        outcome, observation = self.settle(response, status, headers, body)
        if observation is not None:
            assert self.guard is not None
            await self.guard.aobserve(*observation)
        return outcome

    def error(self, kind: Failure, exc: Exception) -> Outcome:
        """A transport error as the attempt's Outcome (FINAL ones end the call)."""
        if kind is Failure.FINAL:
            return Outcome(None, False, None, exc)
        failure = error_failure(kind, exc, method=self.method.upper(), has_key=self.has_key)
        if not self.replayable:
            failure = one_shot(failure)
        return Outcome(failure, True, None, exc)


def _success(response: Any) -> Outcome:
    # Outcome(None, False, response) without NamedTuple's Python-level __new__;
    # every later field keeps its default.
    return tuple.__new__(Outcome, (None, False, response, *_DEFAULTS_AFTER_VALUE))


_DEFAULTS_AFTER_VALUE = tuple(Outcome(None)[3:])


def with_bulkhead(call: HttpCall, send: Callable[[], Outcome]) -> Callable[[], Outcome]:
    """``send`` holding a slot of the origin's bulkhead (waiting at most the deadline)."""
    bulkhead = call.lane.bulkhead
    if bulkhead is None:
        return send

    def held() -> Outcome:
        bulkhead.acquire(max(0.0, call.remaining()))
        try:
            return send()
        finally:
            bulkhead.release()

    return held


def awith_bulkhead(
    call: HttpCall, asend: Callable[[], Awaitable[Outcome]]
) -> Callable[[], Awaitable[Outcome]]:
    """Async twin of :func:`with_bulkhead`."""
    bulkhead = call.lane.bulkhead
    if bulkhead is None:
        return asend

    async def held() -> Outcome:
        try:  # a free slot is taken without a coroutine; a full one is awaited
            bulkhead.acquire(0.0)
        except BulkheadFull:
            await bulkhead.aacquire(max(0.0, call.remaining()))
        try:
            return await asend()
        finally:
            bulkhead.release()

    return held


# The first attempt, lean. The engine's order for a first attempt is COUNT, PACE
# (+ SLEEP), ADMIT, SEND, RECORD (core/_engine.py); these two functions perform
# exactly those effects, in that order, on the objects the driver would call, and
# hand the attempt to the engine (`run(send, first=outcome)`) only when it failed.
# A success therefore builds no run, conversation or retry state: the decorator's
# fast lane, for HTTP. A breaker refusing this first attempt raises its CircuitOpen
# as the engine's Finish.result() would.


def first_attempt(call: HttpCall, send: Callable[[], Outcome]) -> Any:
    """Make ``call``'s first attempt with ``send``; the engine drives any retry."""
    lane = call.lane
    permit = None
    if lane.protected:
        if lane.budget is not None:
            lane.budget.record_request()
        if lane.paced:
            assert lane.guard is not None
            wait = lane.guard.wait_before(_pace_limit(call))
            if wait:
                call.front.clock.sleep(wait)
        if lane.breaker is not None:
            permit = lane.breaker.acquire()
    try:
        outcome = send()
    except BaseException:
        if permit is not None and hasattr(permit, "release"):
            permit.release()
        raise
    if permit is not None:
        permit.record(failure=outcome[1])
    if outcome[0] is None:
        if lane.outcomes:
            lane.budget.record_outcome(success=True)
        return outcome.result()
    return call.run.run(send, first=outcome).result()


def resume(
    call: HttpCall, ticket: Any, first: Callable[[], Outcome], send: Callable[[], Outcome]
) -> Any:
    """A first attempt sent on the lane's gate (``ticket``) that did not simply
    succeed: ``first()`` makes its Outcome (the slot still held), the gate gives the
    slot back and records it, and the engine drives any retry with ``send``."""
    try:
        outcome = first()
    except BaseException:
        call.lane.abandon()
        raise
    if _settled(call, ticket, outcome):
        return outcome.result()
    return call.run.run(with_bulkhead(call, send), first=outcome).result()


def _settled(call: HttpCall, ticket: Any, outcome: Outcome) -> bool:
    # The gate's slot back and the outcome recorded; True when it ends the call.
    gate = call.lane.gate
    if gate is not None:
        gate.settle(ticket, call.started, outcome[1])
    return outcome[0] is None


async def afirst_attempt(call: HttpCall, asend: Callable[[], Awaitable[Outcome]]) -> Any:
    """Async twin of :func:`first_attempt` (awaits the async forms where there are)."""
    lane = call.lane
    permit = None
    if lane.protected:
        # The async forms, found once per lane (twin()'s choice without its wrapper).
        if lane.acount is not None:
            await lane.acount()
        elif lane.budget is not None:
            lane.budget.record_request()
        if lane.paced:
            assert lane.guard is not None
            wait = await lane.guard.await_before(_pace_limit(call))
            if wait:
                await call.front.clock.asleep(wait)
        if lane.aadmit is not None:
            permit = await lane.aadmit()
        elif lane.breaker is not None:
            permit = lane.breaker.acquire()
    try:
        outcome = await asend()
    except BaseException:
        if permit is not None and hasattr(permit, "release"):
            await twin(permit, "release")
        raise
    if permit is not None:
        arecord = getattr(permit, "arecord", None)
        if arecord is not None:
            await arecord(failure=outcome[1])
        else:
            permit.record(failure=outcome[1])
    if outcome[0] is None:
        if lane.outcomes:
            lane.budget.record_outcome(success=True)
        return outcome.result()
    return (await call.run.arun(asend, first=outcome)).result()


async def aresume(
    call: HttpCall,
    ticket: Any,
    first: Callable[[], Awaitable[Outcome]],
    asend: Callable[[], Awaitable[Outcome]],
) -> Any:
    """Async twin of :func:`resume`."""
    try:
        outcome = await first()
    except BaseException:
        call.lane.abandon()
        raise
    if _settled(call, ticket, outcome):
        return outcome.result()
    return (await call.run.arun(awith_bulkhead(call, asend), first=outcome)).result()


def _pace_limit(call: HttpCall) -> float:
    # Conversation.pace_limit(): the time left, at most max_wait.
    limit = call.lane.deadline - (call.front.monotonic() - call.started)
    max_wait = call.lane.max_wait
    return max_wait if limit > max_wait else max(0.0, limit)


def _discard(outcome: Outcome) -> None:
    outcome.value.close()


async def _adiscard(outcome: Outcome) -> None:
    await outcome.value.aclose()


_DISCARD = (_discard, _adiscard)
