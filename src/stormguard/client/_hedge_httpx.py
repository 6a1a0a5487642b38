# stormguard.httpx.HedgingTransport: hedged requests for idempotent reads, as an
# httpx transport that wraps another (sync and async in one class, like
# RetryTransport). It races copies of each GET/HEAD/OPTIONS through the inner
# transport (client/_hedge.py) and returns the first final answer; a copy after
# the first carries `Retry-Attempt: N`, since it is extra load as a retry is.
# Put it under a RetryTransport to retry what the race could not answer:
#     RetryTransport(HedgingTransport(), policy=...)
from __future__ import annotations

from collections.abc import Collection
from typing import Any

import httpx

from ..core._hedge import HedgePolicy
from ._attempt import RETRY_ATTEMPT
from ._hedge import Answer, Hedger
from ._inner import Wrapping, numbered

__all__ = ["HedgingTransport"]

_READS = ("GET", "HEAD", "OPTIONS")


def _final(answer: Answer) -> bool:
    # An answer ends the race unless it is a failure another copy may beat: a
    # transport error, a 5xx, a 429.
    if answer.error is not None:
        return False
    status: int = answer.value.status_code
    return status < 500 and status != 429


def _copy(request: httpx.Request, copy: int) -> httpx.Request:
    return request if copy == 1 else numbered(request, RETRY_ATTEMPT, copy, keep=True)


def _close(response: httpx.Response) -> None:
    response.close()


async def _aclose(response: httpx.Response) -> None:
    await response.aclose()


class HedgingTransport(Wrapping):
    """An httpx transport that hedges idempotent reads (Dean & Barroso's hedged
    requests; gRPC A6 hedging).

    >>> from stormguard import HedgePolicy
    >>> from stormguard.httpx import HedgingTransport, RetryTransport
    >>> transport = RetryTransport(HedgingTransport(policy=HedgePolicy(percentile=95)))

    Each ``GET``, ``HEAD`` or ``OPTIONS`` (``methods``) is sent; when no final
    answer came back after the policy's delay (fixed, or the ``percentile`` of
    recent latencies), a copy is sent too, up to ``policy.attempts`` copies; a
    5xx, a 429 or a transport error sends the next copy at once. The first final
    answer is returned; async losers are cancelled, sync ones (worker threads)
    are dropped when they answer. Extra copies come from a budget (default: a
    :class:`stormguard.RetryBudget` of ``policy.ratio`` of the requests plus a
    reserve), so hedging never adds more than that share of load. Other methods
    go straight through. ``transport`` is the inner transport (default: httpx's).
    """

    def __init__(
        self,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        *,
        policy: HedgePolicy | None = None,
        budget: Any = None,
        methods: Collection[str] = _READS,
    ) -> None:
        self._wrap(transport)
        self.policy = policy or HedgePolicy()
        self.hedger = Hedger(self.policy, budget=budget)
        self.methods = frozenset(method.upper() for method in methods)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        inner = self._sync_inner or self._sync()
        if request.method not in self.methods:
            return inner.handle_request(request)

        def send(copy: int) -> httpx.Response:
            return inner.handle_request(_copy(request, copy))

        response: httpx.Response = self.hedger.run(send, _final, _close)
        return response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        inner = self._async_inner or self._async()
        if request.method not in self.methods:
            return await inner.handle_async_request(request)

        async def asend(copy: int) -> httpx.Response:
            return await inner.handle_async_request(_copy(request, copy))

        response: httpx.Response = await self.hedger.arun(asend, _final, _aclose)
        return response

    def close(self) -> None:
        self.hedger.close()
        super().close()

    async def aclose(self) -> None:
        self.hedger.close()
        await super().aclose()
