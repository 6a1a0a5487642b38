# gRPC hedging interceptors (unary-unary), sync and grpc.aio: gRPC A6's
# hedgingPolicy performed by stormguard (client/_hedge.py), from a HedgePolicy or
# from the channel's service config (maxAttempts, hedgingDelay,
# nonFatalStatusCodes). Only the methods named (`methods`, or those the service
# config gives a hedgingPolicy) are hedged: a hedge may run twice on the server.
#
#   OK, or a status not in the non-fatal codes   the answer: the others cancelled
#   a non-fatal status (default: UNAVAILABLE)    the next copy at once
#   every copy failed                            the last failure
#
# Copy n > 1 carries grpc-previous-rpc-attempts: n-1 (A6 "Exposed Retry
# Metadata"; grpcio passes it on a channel with grpc.enable_retries 0, see
# stormguard.grpc.channel_options). The sync API's continuation blocks until the
# call ends: the sync copies run in the Hedger's worker threads, and a sync loser
# runs to its end (or its deadline) with its answer dropped; the aio losers are
# cancelled.
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import grpc
import grpc.aio

from ..core._hedge import HedgePolicy
from ._attempt import GRPC_PREVIOUS_ATTEMPTS
from ._grpc import _SyncDetails, method_predicate
from ._grpc_config import Hedging, ServiceConfig
from ._hedge import Answer, Hedger

__all__ = ["AsyncHedgingInterceptor", "HedgingInterceptor"]

_NON_FATAL = frozenset({grpc.StatusCode.UNAVAILABLE})


def _metadata(metadata: Any, copy: int) -> list[tuple[str, Any]]:
    kept = [(name, value) for name, value in metadata or () if name != GRPC_PREVIOUS_ATTEMPTS]
    if copy > 1:
        kept.append((GRPC_PREVIOUS_ATTEMPTS, str(copy - 1)))
    return kept


def _nothing(value: Any) -> None:
    return None


async def _anothing(value: Any) -> None:
    return None


class _HedgingBase:
    """Configuration both interceptors share, and the choice of policy per method."""

    def __init__(
        self,
        *,
        policy: HedgePolicy | None = None,
        methods: bool | Collection[str] | Callable[[str], bool] = False,
        non_fatal: Collection[grpc.StatusCode] = _NON_FATAL,
        service_config: str | Mapping[str, Any] | None = None,
        budget: Any = None,
    ) -> None:
        self._named = method_predicate(methods)
        self.policy = policy or HedgePolicy()
        self.non_fatal = frozenset(non_fatal)
        self.service_config = None if service_config is None else ServiceConfig(service_config)
        # Hedges are throttled with retries (A6): the config's retryThrottling first.
        throttling = None if self.service_config is None else self.service_config.throttling
        self._budget = budget if budget is not None else throttling
        self._hedgers: dict[str, tuple[Hedger, frozenset[grpc.StatusCode]] | None] = {}
        self._default = Hedger(self.policy, budget=self._budget)

    def _hedger(self, method: str) -> tuple[Hedger, frozenset[grpc.StatusCode]] | None:
        """The race for ``method`` (None: it is not hedged)."""
        if method in self._hedgers:
            return self._hedgers[method]
        chosen: tuple[Hedger, frozenset[grpc.StatusCode]] | None = None
        settings = None if self.service_config is None else self.service_config.for_method(method)
        hedging: Hedging | None = None if settings is None else settings.hedging
        if hedging is not None:
            policy = HedgePolicy(
                attempts=hedging.attempts,
                delay=hedging.delay,
                ratio=self.policy.ratio,
                min_per_second=self.policy.min_per_second,
            )
            budget = self._budget or self._default.budget
            chosen = (Hedger(policy, budget=budget), hedging.non_fatal)
        elif self._named(method):
            chosen = (self._default, self.non_fatal)
        if len(self._hedgers) < 1024:
            self._hedgers[method] = chosen
        return chosen

    @staticmethod
    def _method(details: Any) -> str:
        method = details.method
        return method.decode() if isinstance(method, bytes) else str(method)


class HedgingInterceptor(_HedgingBase, grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """A sync interceptor that hedges the unary calls of ``methods`` (a set of full
    method names, a predicate, or True for all) by a :class:`stormguard.HedgePolicy`,
    or those with a ``hedgingPolicy`` in ``service_config``.

    Copies are sent ``policy.delay`` apart (or after the policy's latency
    percentile) until one answers OK or with a status outside ``non_fatal``
    (default ``UNAVAILABLE``, which sends the next copy at once); extra copies
    are bounded by the budget (the config's ``retryThrottling`` when there is
    one, as A6 throttles hedges, else a RetryBudget of ``policy.ratio``). The
    sync API blocks each copy in a worker thread: losers run to their end and are
    dropped; :class:`AsyncHedgingInterceptor` cancels them.
    """

    def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        method = self._method(client_call_details)
        race = self._hedger(method)
        if race is None:
            return continuation(client_call_details, request)
        hedger, non_fatal = race
        d = client_call_details

        def send(copy: int) -> Any:
            details = _SyncDetails(
                d.method,
                d.timeout,
                _metadata(d.metadata, copy),
                d.credentials,
                getattr(d, "wait_for_ready", None),
                getattr(d, "compression", None),
            )
            return continuation(details, request)

        def final(answer: Answer) -> bool:
            return answer.error is not None or answer.value.code() not in non_fatal

        return hedger.run(send, final, _nothing)


class AsyncHedgingInterceptor(_HedgingBase, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """The grpc.aio twin of :class:`HedgingInterceptor`: the losers are cancelled."""

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        method = self._method(client_call_details)
        race = self._hedger(method)
        if race is None:
            return await continuation(client_call_details, request)
        hedger, non_fatal = race
        d = client_call_details

        async def asend(copy: int) -> Any:
            details = grpc.aio.ClientCallDetails(
                d.method, d.timeout, _metadata(d.metadata, copy), d.credentials, d.wait_for_ready
            )
            call = await continuation(details, request)
            try:
                code = await call.code()
            except BaseException:
                call.cancel()  # this copy lost the race: the RPC goes too
                raise
            return _Finished(call, code)

        def final(answer: Answer) -> bool:
            return answer.error is not None or answer.value.code not in non_fatal

        finished: _Finished = await hedger.arun(asend, final, _anothing)
        return finished.call


class _Finished:
    """An aio copy's call once it ended, with its status code."""

    __slots__ = ("call", "code")

    def __init__(self, call: Any, code: grpc.StatusCode) -> None:
        self.call = call
        self.code = code
