# Two token budgets for retries, beside the ratio budget of core/_budget.py, each
# a pure counter shaped like RetryBudgetCore (record_request / try_retry, `now`
# passed in and unused: neither decays with time) plus record_outcome(), which
# both need to hear every attempt's answer.
#
# RetryQuotaCore -- the AWS SDKs' retry quota (the 2026 "SEP 2.1" numbers, as in
# aws/aws-sdk-net sdk/src/Core/Amazon.Runtime/Pipeline/RetryHandler/
# StandardRetryPolicy.cs and the other SDKs' AWS_NEW_RETRIES_2026 path):
#
#     tokens start at capacity (500) and never exceed it
#     a retry after a transient failure   costs retry_cost (14)
#     a retry after a throttling failure  costs throttling_cost (5)
#     no tokens enough for the cost       -> no retry (the call ends)
#     a first attempt that succeeds       refunds success_increment (1)
#     a retry that succeeds               refunds what that retry cost
#
# so retrying after transient failures is affordable only while most calls
# succeed at once, and a throttled fleet (whose retries the server refuses
# cheaply) is charged less per retry than one whose retries hit failing hosts.
#
# RetryThrottlingCore -- gRPC's retry throttling (gRPC A6, "Throttling Retry
# Attempts and Hedged RPCs"; grpc/grpc-proto grpc/service_config/
# service_config.proto, RetryThrottlingPolicy):
#
#     tokens start at max_tokens, stay within [0, max_tokens]
#     every failed attempt       tokens -= 1
#     every successful attempt   tokens += token_ratio
#     a retry (or a hedge) is allowed while tokens > max_tokens / 2; it takes nothing
#
# "Failed" is A6's: an answer with a retryable status (a server fault, a
# throttle) or a pushback saying "do not retry" -- never a malformed request.
# Both never read the clock; invalid settings raise ConfigError naming the field.
from __future__ import annotations

import math

from .._errors import ConfigError

__all__ = ["RetryQuotaCore", "RetryThrottlingCore"]


def _number(value: object, field: str, *, low: float, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
        bound = f"in ({low:g}, {high:g}]" if high < math.inf else f"> {low:g}"
        raise ConfigError(field, f"must be a number {bound}, got {value!r}")
    return float(value)


def _cost(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ConfigError(field, f"must be a number >= 0, got {value!r}")
    return float(value)


class RetryQuotaCore:
    """The AWS retry quota as a pure counter (see the module comment)."""

    __slots__ = ("capacity", "retry_cost", "success_increment", "throttling_cost", "tokens")

    def __init__(
        self,
        *,
        capacity: float = 500,
        retry_cost: float = 14,
        throttling_cost: float = 5,
        success_increment: float = 1,
    ) -> None:
        self.capacity = _number(capacity, "capacity", low=0)
        self.retry_cost = _cost(retry_cost, "retry_cost")
        self.throttling_cost = _cost(throttling_cost, "throttling_cost")
        self.success_increment = _cost(success_increment, "success_increment")
        self.tokens = self.capacity

    def cost(self, throttled: bool) -> float:
        """What a retry after a throttling (or a transient) failure costs."""
        return self.throttling_cost if throttled else self.retry_cost

    def record_request(self, now: float) -> None:
        """A first attempt at ``now``: it costs nothing (a success refunds later)."""

    def try_retry(self, now: float, *, throttled: bool = False) -> bool:
        """Take the price of one retry at ``now``; False (nothing taken) when short."""
        price = self.cost(throttled)
        if price > self.tokens:
            return False
        self.tokens -= price
        return True

    def record_outcome(
        self,
        now: float,
        *,
        success: bool,
        failed: bool = False,
        retried: bool = False,
        throttled: bool = False,
    ) -> None:
        """An attempt answered: a success refunds (``retried``: the price its retry
        paid, ``throttled`` saying which; else ``success_increment``). ``failed``
        changes nothing: a failure is paid for by the retry it leads to."""
        if success:
            refund = self.cost(throttled) if retried else self.success_increment
            self.tokens = min(self.capacity, self.tokens + refund)

    def balance(self, now: float) -> float:
        """Tokens left."""
        return self.tokens


class RetryThrottlingCore:
    """gRPC A6 retry throttling as a pure counter (see the module comment)."""

    __slots__ = ("max_tokens", "threshold", "token_ratio", "tokens")

    def __init__(self, *, max_tokens: float = 10, token_ratio: float = 0.1) -> None:
        # A6: maxTokens in (0, 1000]; tokenRatio > 0 (gRPC keeps 3 decimals).
        self.max_tokens = _number(max_tokens, "max_tokens", low=0, high=1000)
        self.token_ratio = _number(token_ratio, "token_ratio", low=0)
        self.threshold = self.max_tokens / 2.0
        self.tokens = self.max_tokens

    def record_request(self, now: float) -> None:
        """A first attempt at ``now``: only its answer counts."""

    def try_retry(self, now: float, *, throttled: bool = False) -> bool:
        """Whether a retry (or a hedge) may be sent: tokens above half of max_tokens."""
        return self.tokens > self.threshold

    def record_outcome(
        self,
        now: float,
        *,
        success: bool,
        failed: bool = False,
        retried: bool = False,
        throttled: bool = False,
    ) -> None:
        """An attempt answered: ``failed`` takes a token, ``success`` adds token_ratio."""
        if failed:
            self.tokens = max(0.0, self.tokens - 1.0)
        elif success:
            self.tokens = min(self.max_tokens, self.tokens + self.token_ratio)

    def balance(self, now: float) -> float:
        """Tokens left."""
        return self.tokens
