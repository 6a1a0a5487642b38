# The runtime token budgets: RetryQuotaCore and RetryThrottlingCore
# (core/_quota.py) behind a lock, for threads and asyncio tasks alike (the lock
# is held for one counter update, never across an await).
#
# Each is a budget for RetryPolicy(budget=...) as RetryBudget is: the engine calls
# record_request() before a first attempt and try_retry(throttled=...) before a
# retry; since `records_outcomes` is True it also reports every attempt's answer
# (record_outcome), which is what refunds the AWS quota and what moves gRPC's
# token count. Either is usable on its own too: ask try_retry() before retrying
# and report each answer with record_outcome().
from __future__ import annotations

import threading
from typing import ClassVar

from ..core._profiles import BUDGETS
from ..core._quota import RetryQuotaCore, RetryThrottlingCore

__all__ = ["RetryQuota", "RetryThrottling"]


class _TokenBudget:
    """What both share: a core behind a lock, and the budget protocol."""

    __slots__ = ("_core", "_lock")
    # The engine reports every attempt's answer to a budget that says so.
    records_outcomes: ClassVar[bool] = True
    _core: RetryQuotaCore | RetryThrottlingCore

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def record_request(self) -> None:
        """A first attempt is about to be sent (it costs nothing by itself)."""

    def try_retry(self, *, throttled: bool = False) -> bool:
        """Whether one retry may be sent now, taking its price if there is one;
        ``throttled``: the failure it follows was a throttle (429, a rate-limit
        403, RESOURCE_EXHAUSTED, an AWS throttling error). False: do not retry."""
        with self._lock:
            return self._core.try_retry(0.0, throttled=throttled)

    def record_outcome(
        self,
        *,
        success: bool,
        failed: bool = False,
        retried: bool = False,
        throttled: bool = False,
    ) -> None:
        """An attempt was answered: ``success`` (it ended the call as an answer) or
        ``failed`` (a server fault, a throttle, or a pushback saying not to retry;
        a malformed request is neither); ``retried``: it was a retry, which
        followed a throttle when ``throttled``."""
        with self._lock:
            self._core.record_outcome(
                0.0, success=success, failed=failed, retried=retried, throttled=throttled
            )

    @property
    def balance(self) -> float:
        """Tokens left now."""
        with self._lock:
            return self._core.tokens


class RetryQuota(_TokenBudget):
    """The AWS SDKs' retry quota: a bucket of ``capacity`` tokens (default 500).

    A retry after a transient failure costs ``retry_cost`` tokens (14), one after
    a throttling failure ``throttling_cost`` (5); when the bucket holds less than
    the price the call is not retried. A first attempt that succeeds adds
    ``success_increment`` (1), a retry that succeeds gives back what it cost;
    the bucket never holds more than ``capacity``. These are the numbers of the
    SDKs' 2026 retry behaviour (``AWS_NEW_RETRIES_2026``). Share one quota per
    service endpoint (``RetryPolicy(budget=quota)``, or the ``aws`` profile).
    """

    __slots__ = ()

    def __init__(
        self,
        *,
        capacity: float = 500,
        retry_cost: float = 14,
        throttling_cost: float = 5,
        success_increment: float = 1,
    ) -> None:
        super().__init__()
        self._core = RetryQuotaCore(
            capacity=capacity,
            retry_cost=retry_cost,
            throttling_cost=throttling_cost,
            success_increment=success_increment,
        )

    def __repr__(self) -> str:
        core = self._core
        assert isinstance(core, RetryQuotaCore)
        return f"RetryQuota(capacity={core.capacity:g}, tokens={core.tokens:g})"


class RetryThrottling(_TokenBudget):
    """gRPC's retry throttling (gRPC A6; the service config's ``retryThrottling``).

    A token count starts at ``max_tokens`` (in (0, 1000]; default 10): every failed
    attempt takes one token, every successful one adds ``token_ratio`` (default
    0.1), within ``[0, max_tokens]``. Retries and hedges are sent only while the
    count is above ``max_tokens / 2``; they take nothing themselves. "Failed" is
    a server fault, a throttle or a pushback saying not to retry -- never a
    malformed request. gRPC keeps one count per server name: share one object per
    channel target.
    """

    __slots__ = ()

    def __init__(self, *, max_tokens: float = 10, token_ratio: float = 0.1) -> None:
        super().__init__()
        self._core = RetryThrottlingCore(max_tokens=max_tokens, token_ratio=token_ratio)

    def __repr__(self) -> str:
        core = self._core
        assert isinstance(core, RetryThrottlingCore)
        return f"RetryThrottling(max_tokens={core.max_tokens:g}, tokens={core.tokens:g})"


# The `aws` profile's budget (core/_profiles.py cannot build a runtime object).
BUDGETS["retry_quota"] = RetryQuota
