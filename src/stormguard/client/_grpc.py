# gRPC client interceptors: unary-unary calls retried by stormguard's policy.
#
# gRPC has no HTTP methods, so whether a call may be repeated is the caller's
# knowledge: `idempotent` names the methods (or says all are). The table:
#
#   status                 idempotent / keyed      otherwise
#   ---------------------  ----------------------  ---------
#   RESOURCE_EXHAUSTED     retry                   retry     (refused, like HTTP 429)
#   UNAVAILABLE            retry                   give up   (may have been processed)
#   other retry_codes      retry                   give up
#   anything else          give up                 give up
#
# The wait is the server's pushback when it sends one (trailer
# `grpc-retry-pushback-ms`, as in gRPC's retry design; a negative value means
# "do not retry"; or `retry-after` in seconds), else the backoff draw. Each
# attempt's timeout is cut to the time left before the policy's deadline.
# Streaming calls are not intercepted: a stream cannot be replayed safely. A retry
# carries `grpc-previous-rpc-attempts: N-1` in its metadata (gRPC A6).
#
# Per-target cooldown (as the HTTP adapters' per-origin one): an UNAVAILABLE or
# RESOURCE_EXHAUSTED answer with a wait hint pauses the target, and every call to
# it -- through this interceptor, or any interceptor naming the same `target` and
# sharing the guards (by default the process-wide ones) -- waits out the pause
# before it is sent, or fails fast with stormguard.RateLimited when the pause is
# longer than the time it has left. An answer carrying `grpc-retry-pushback-ms`
# is a refusal: it never counts as a failure for a circuit breaker.
from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import grpc
import grpc.aio

from .._clock import Clock
from ..core._engine import Outcome
from ..core._headers import parse_retry_after
from ..core._policy import RetryFailure, RetryPolicy
from ..protection._origin import OriginGuard, OriginGuards, Setting, process_guards
from ._attempt import GRPC_PREVIOUS_ATTEMPTS
from ._driver import Engine, RetryHook, Run
from ._front import with_retry_if
from ._grpc_config import MethodSettings, ServiceConfig
from ._http import new_idempotency_key

__all__ = ["AsyncRetryInterceptor", "RetryInterceptor", "method_predicate"]

DEFAULT_RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
_REFUSED = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED})
# Codes that count against the upstream for a circuit breaker.
_SERVER_FAULTS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
    }
)
# Codes whose wait hint pauses the target (gRPC's 503 and 429).
_COOLDOWN_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
_KEY = "idempotency-key"
_MAX_METHODS = 1024  # methods whose service-config policy an interceptor keeps
_PUSHBACK = "grpc-retry-pushback-ms"


class Answer(NamedTuple):
    """What ``retry_if`` sees of a failed gRPC call (the same for sync and aio)."""

    code: grpc.StatusCode
    details: str | None
    trailing_metadata: tuple[tuple[str, Any], ...]


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _SyncDetails(_Details, grpc.ClientCallDetails):  # type: ignore[misc]
    """ClientCallDetails for the sync API (an abstract class there)."""


def _pushback(
    trailers: Iterable[tuple[str, Any]] | None, wall_now: float
) -> tuple[bool, float | None]:
    """(server forbids a retry, wait hint in seconds) from trailing metadata."""
    for name, value in trailers or ():
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
        key = name.lower()
        if key == _PUSHBACK:
            try:
                millis = int(text.strip())
            except ValueError:
                return True, None  # gRPC A6: an unparseable pushback means do not retry
            if millis < 0:
                return True, None
            return False, millis / 1000.0
        if key == "retry-after":
            return False, parse_retry_after(text, now=wall_now)
    return False, None


def method_predicate(
    methods: bool | Collection[str] | Callable[[str], bool],
) -> Callable[[str], bool]:
    """Which full method names ``methods`` covers: all or none (a bool), a set of
    names, or a predicate of the name."""
    if isinstance(methods, bool):
        flag = methods
        return lambda method: flag
    if callable(methods):
        return methods
    return frozenset(methods).__contains__


def _numbered(metadata: list[tuple[str, Any]], run: Run) -> list[tuple[str, Any]]:
    """The call's metadata for this attempt: a retry says how many attempts came
    before it (``grpc-previous-rpc-attempts``, gRPC A6: 1 on the first retry)."""
    previous = run.conversation.attempts - 1
    if previous < 1:
        return metadata
    return [*metadata, (GRPC_PREVIOUS_ATTEMPTS, str(previous))]


def _pushed_back(trailers: Iterable[tuple[str, Any]] | None) -> bool:
    """Whether the answer carries a pushback trailer (a refusal, not a server fault)."""
    return any(name.lower() == _PUSHBACK for name, _ in trailers or ())


class _Base:
    """What both interceptors share: configuration and the per-attempt judgement."""

    def __init__(
        self,
        *,
        policy: RetryPolicy | None = None,
        retry_if: Callable[[Any], bool | None] | None = None,
        idempotent: bool | Collection[str] | Callable[[str], bool] = False,
        retry_codes: Collection[grpc.StatusCode] = DEFAULT_RETRY_CODES,
        idempotency_keys: bool = False,
        on_retry: RetryHook | Sequence[RetryHook] = (),
        clock: Clock | None = None,
        rng: random.Random | None = None,
        cooldown: Setting = True,
        target: str | None = None,
        guards: OriginGuards | None = None,
        service_config: str | Mapping[str, Any] | None = None,
    ) -> None:
        self.policy = with_retry_if(policy, retry_if)
        # The channel's service config (client/_grpc_config.py): per-method
        # policies, codes and hedging, and the retry throttling of every call.
        self.service_config = None if service_config is None else ServiceConfig(service_config)
        self._methods: dict[str, tuple[RetryPolicy, frozenset[grpc.StatusCode], bool]] = {}
        self._idempotent = method_predicate(idempotent)
        self.retry_codes = frozenset(retry_codes)
        self.idempotency_keys = idempotency_keys
        self.hooks: tuple[RetryHook, ...] = (on_retry,) if callable(on_retry) else tuple(on_retry)
        self.engine = Engine(clock=clock, rng=rng, hooks=self.hooks)
        self.clock = self.engine.clock
        self.rng = rng
        # The cooldown's key: the target named, else this interceptor's own calls.
        self.target = f"grpc://{target.lower()}" if target else f"grpc://interceptor-{id(self):x}"
        self._guard: OriginGuard | None = None
        # Only the cooldown of the per-origin guards is used (the breaker and budget
        # come through the policy). With every default: the process-wide set, as HTTP.
        self._guards: OriginGuards | None = None
        self._generation = -1
        if guards is not None:
            self._guards = guards
        elif cooldown is True and clock is None and rng is None:
            self._guards = process_guards()
        elif cooldown is not False and cooldown is not None:
            self._guards = OriginGuards(
                breaker=False,
                budget=False,
                bulkhead=False,
                cooldown=cooldown,
                pacing=False,
                clock=clock,
                rng=rng,
            )

    def _target_guard(self) -> OriginGuard | None:
        """This interceptor's target's guard (asked again after a registry reset)."""
        registry = self._guards
        if registry is None:
            return None
        guard = self._guard
        if guard is None or self._generation != registry.generation:
            guard = self._guard = registry.get(self.target)
            self._generation = registry.generation
        return guard

    def _method(self, method: str) -> tuple[RetryPolicy, frozenset[grpc.StatusCode], bool]:
        """The policy, the retryable codes and whether the config vouches for
        repeating ``method`` (its own retryPolicy lists the codes)."""
        config = self.service_config
        if config is None:
            return self.policy, self.retry_codes, False
        known = self._methods.get(method)
        if known is None:
            settings = config.for_method(method) or MethodSettings()
            policy = settings.policy(self.policy, config.throttling)
            codes = self.retry_codes if settings.codes is None else settings.codes
            if len(self._methods) >= _MAX_METHODS:
                self._methods.clear()
            known = self._methods[method] = (policy, codes, settings.codes is not None)
        return known

    def _begin(self, details: Any) -> tuple[Run, list[tuple[str, Any]], bool, OriginGuard | None]:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        metadata = list(details.metadata or ())
        has_key = any(name.lower() == _KEY for name, _ in metadata)
        if self.idempotency_keys and not has_key:
            metadata.append((_KEY, new_idempotency_key()))
            has_key = True
        guard = self._target_guard()
        pace = None if guard is None else (guard.wait_before, guard.await_before)
        policy, _, vouched = self._method(method)
        run = self.engine.start(policy, target=f"gRPC {method}", pace=pace)
        return run, metadata, has_key or vouched or self._idempotent(method), guard

    def _codes(self, details: Any) -> frozenset[grpc.StatusCode]:
        """The retryable codes of the call's method."""
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        return self._method(method)[1]

    @staticmethod
    def _pause(outcome: Outcome, code: grpc.StatusCode) -> float | None:
        """The wait by which this answer pauses the target (None: it does not)."""
        failure = outcome.failure
        if failure is None or code not in _COOLDOWN_CODES:
            return None
        hint = failure.hint
        return hint if hint is not None and hint > 0 else None

    @staticmethod
    def _timeout(details: Any, run: Run) -> float | None:
        """The attempt's timeout: the caller's, cut to the time left before the deadline."""
        remaining = max(0.001, run.remaining())
        if remaining == math.inf:  # deadline=None
            return details.timeout  # type: ignore[no-any-return]
        return remaining if details.timeout is None else min(details.timeout, remaining)

    def _judge(
        self,
        outcome: Any,
        code: grpc.StatusCode,
        trailers: Any,
        details: Any,
        safe: bool,
        codes: frozenset[grpc.StatusCode] | None = None,
    ) -> Outcome:
        """One call's answer as the engine's Outcome (server faults count for a breaker);
        ``codes``: the method's retryable codes (default: the interceptor's)."""
        if codes is None:
            codes = self.retry_codes
        if code == grpc.StatusCode.OK:
            return Outcome(None, False, outcome)
        refused = code in _REFUSED  # the server did not process it (like HTTP 429)
        forbidden, hint = _pushback(trailers, self.engine.clock.time())
        failure = RetryFailure(
            code in codes and not forbidden and (safe or refused),
            f"gRPC {code.name}",
            hint,
            should_retry=False if forbidden else None,
            repeat_unsafe=not (safe or refused),
            subject=Answer(code, details, tuple(trailers or ())),
            throttled=refused,
        )
        fault = code in _SERVER_FAULTS and not _pushed_back(trailers)
        return Outcome(failure, fault, outcome)


class RetryInterceptor(_Base, grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """A sync gRPC interceptor retrying unary-unary calls by a :class:`RetryPolicy`.

    >>> channel = grpc.intercept_channel(grpc.insecure_channel("localhost:50051"),
    ...                                  RetryInterceptor(idempotent={"/shop.Cart/Get"}))

    ``idempotent``: ``True`` (every method), a set of full method names, or a
    predicate. ``RESOURCE_EXHAUSTED`` is retried for any method; ``UNAVAILABLE``
    and other ``retry_codes`` only for idempotent methods or calls carrying an
    ``idempotency-key`` metadata entry (added once per call with
    ``idempotency_keys=True``). ``retry_if`` is called with each failed call's
    ``Answer`` (``.code``, ``.details``, ``.trailing_metadata``) and returns True,
    False or None (the table decides). When the call stops the last outcome is returned as gRPC
    would have returned it.

    ``cooldown`` (default on; ``False`` turns it off, or a mapping of
    :class:`stormguard.Cooldown` settings): an ``UNAVAILABLE`` or
    ``RESOURCE_EXHAUSTED`` answer with a wait hint pauses the target, and calls to
    it wait out the pause or raise :class:`stormguard.RateLimited` when it is
    longer than they may wait. ``target`` names the channel target (the pause is
    shared by every interceptor naming it through the same guards: the process-wide
    ones by default, or ``guards=``); without it the pause covers this
    interceptor's calls only.

    ``service_config``: the channel's gRPC service config (JSON text or the parsed
    mapping), read as gRPC reads it (A6): a method's ``retryPolicy`` sets its
    attempts (at most 5), backoff (``random(0, min(initialBackoff *
    backoffMultiplier**(n-1), maxBackoff))``) and the codes retried for it
    whatever ``idempotent`` says; a method the config names without one is not
    retried; ``timeout`` is the call's deadline across attempts;
    ``retryThrottling`` (``maxTokens``, ``tokenRatio``) throttles the retries of
    every call (:class:`stormguard.RetryThrottling`). Build the channel with
    :func:`stormguard.grpc.channel_options` so gRPC does not retry the same calls
    too. A retry carries ``grpc-previous-rpc-attempts: N-1`` (gRPC A6).
    """

    def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        run, metadata, safe, guard = self._begin(client_call_details)
        d = client_call_details
        codes = self._codes(d)

        def send() -> Outcome:
            details = _SyncDetails(
                d.method,
                self._timeout(d, run),
                _numbered(metadata, run),
                d.credentials,
                getattr(d, "wait_for_ready", None),
                getattr(d, "compression", None),
            )
            outcome = continuation(details, request)
            code = outcome.code()
            trailers = outcome.trailing_metadata()
            judged = self._judge(outcome, code, trailers, outcome.details(), safe, codes)
            pause = None if guard is None else self._pause(judged, code)
            if pause is not None:
                assert guard is not None
                guard.observe(503, (), pause)
            return judged

        return run.run(send).result()


class AsyncRetryInterceptor(_Base, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """The asyncio twin of :class:`RetryInterceptor`, for ``grpc.aio`` channels.

    >>> channel = grpc.aio.insecure_channel("localhost:50051",
    ...                                     interceptors=[AsyncRetryInterceptor(idempotent=True)])
    """

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        run, metadata, safe, guard = self._begin(client_call_details)
        d = client_call_details
        codes = self._codes(d)

        async def asend() -> Outcome:
            details = grpc.aio.ClientCallDetails(
                d.method,
                self._timeout(d, run),
                _numbered(metadata, run),
                d.credentials,
                d.wait_for_ready,
            )
            outcome = await continuation(details, request)
            code = await outcome.code()
            trailers = await outcome.trailing_metadata()
            judged = self._judge(outcome, code, trailers, await outcome.details(), safe, codes)
            pause = None if guard is None else self._pause(judged, code)
            if pause is not None:
                assert guard is not None
                await guard.aobserve(503, (), pause)
            return judged

        return (await run.arun(asend)).result()
