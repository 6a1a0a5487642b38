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
# Streaming calls are not intercepted: a stream cannot be replayed safely.
from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, NamedTuple

import grpc
import grpc.aio

from .._clock import Clock
from ..core._engine import Outcome
from ..core._headers import parse_retry_after
from ..core._policy import RetryFailure, RetryPolicy
from ._driver import Engine, RetryHook, Run
from ._front import with_retry_if
from ._http import new_idempotency_key

__all__ = ["AsyncRetryInterceptor", "RetryInterceptor"]

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
_KEY = "idempotency-key"
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
    ) -> None:
        self.policy = with_retry_if(policy, retry_if)
        if isinstance(idempotent, bool):
            flag = idempotent
            self._idempotent: Callable[[str], bool] = lambda method: flag
        elif callable(idempotent):
            self._idempotent = idempotent
        else:
            names = frozenset(idempotent)
            self._idempotent = names.__contains__
        self.retry_codes = frozenset(retry_codes)
        self.idempotency_keys = idempotency_keys
        self.hooks: tuple[RetryHook, ...] = (on_retry,) if callable(on_retry) else tuple(on_retry)
        self.engine = Engine(clock=clock, rng=rng, hooks=self.hooks)
        self.clock = self.engine.clock
        self.rng = rng

    def _begin(self, details: Any) -> tuple[Run, list[tuple[str, Any]], bool]:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        metadata = list(details.metadata or ())
        has_key = any(name.lower() == _KEY for name, _ in metadata)
        if self.idempotency_keys and not has_key:
            metadata.append((_KEY, new_idempotency_key()))
            has_key = True
        run = self.engine.start(self.policy, target=f"gRPC {method}")
        return run, metadata, has_key or self._idempotent(method)

    @staticmethod
    def _timeout(details: Any, run: Run) -> float | None:
        """The attempt's timeout: the caller's, cut to the time left before the deadline."""
        remaining = max(0.001, run.remaining())
        if remaining == math.inf:  # deadline=None
            return details.timeout  # type: ignore[no-any-return]
        return remaining if details.timeout is None else min(details.timeout, remaining)

    def _judge(
        self, outcome: Any, code: grpc.StatusCode, trailers: Any, details: Any, safe: bool
    ) -> Outcome:
        """One call's answer as the engine's Outcome (server faults count for a breaker)."""
        if code == grpc.StatusCode.OK:
            return Outcome(None, False, outcome)
        refused = code in _REFUSED  # the server did not process it (like HTTP 429)
        forbidden, hint = _pushback(trailers, self.engine.clock.time())
        failure = RetryFailure(
            code in self.retry_codes and not forbidden and (safe or refused),
            f"gRPC {code.name}",
            hint,
            should_retry=False if forbidden else None,
            repeat_unsafe=not (safe or refused),
            subject=Answer(code, details, tuple(trailers or ())),
        )
        return Outcome(failure, code in _SERVER_FAULTS, outcome)


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
    """

    def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        run, metadata, safe = self._begin(client_call_details)
        d = client_call_details

        def send() -> Outcome:
            details = _SyncDetails(
                d.method,
                self._timeout(d, run),
                metadata,
                d.credentials,
                getattr(d, "wait_for_ready", None),
                getattr(d, "compression", None),
            )
            outcome = continuation(details, request)
            code = outcome.code()
            trailers = outcome.trailing_metadata()
            return self._judge(outcome, code, trailers, outcome.details(), safe)

        return run.run(send).result()


class AsyncRetryInterceptor(_Base, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """The asyncio twin of :class:`RetryInterceptor`, for ``grpc.aio`` channels.

    >>> channel = grpc.aio.insecure_channel("localhost:50051",
    ...                                     interceptors=[AsyncRetryInterceptor(idempotent=True)])
    """

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        run, metadata, safe = self._begin(client_call_details)
        d = client_call_details

        async def asend() -> Outcome:
            details = grpc.aio.ClientCallDetails(
                d.method, self._timeout(d, run), metadata, d.credentials, d.wait_for_ready
            )
            outcome = await continuation(details, request)
            code = await outcome.code()
            trailers = await outcome.trailing_metadata()
            return self._judge(outcome, code, trailers, await outcome.details(), safe)

        return (await run.arun(asend)).result()
