"""The token budgets of core/_quota.py: the AWS retry quota and gRPC A6 retry
throttling, as pure counters (their numbers are the SDKs')."""

from __future__ import annotations

import pytest

from stormguard import ConfigError
from stormguard.core._quota import RetryQuotaCore, RetryThrottlingCore

NOW = 0.0


def test_a_transient_retry_costs_fourteen_and_a_throttled_one_five() -> None:
    """AWS 2026: 500 tokens; a retry after a transient failure takes 14, after a throttle 5."""
    quota = RetryQuotaCore()
    assert quota.try_retry(NOW) and quota.tokens == 486
    assert quota.try_retry(NOW, throttled=True) and quota.tokens == 481


def test_a_retry_that_succeeds_gives_back_its_price() -> None:
    """A succeeded retry refunds what it cost (14 after a transient failure); the
    bucket is whole again."""
    quota = RetryQuotaCore()
    assert quota.try_retry(NOW)
    quota.record_outcome(NOW, success=True, retried=True, throttled=False)
    assert quota.tokens == 500


def test_a_first_attempt_success_adds_one_up_to_the_capacity() -> None:
    """A success without a retry adds 1; the bucket never holds more than its capacity."""
    quota = RetryQuotaCore()
    quota.record_outcome(NOW, success=True)
    assert quota.tokens == 500
    quota.try_retry(NOW, throttled=True)
    quota.record_outcome(NOW, success=True)
    assert quota.tokens == 496


def test_an_empty_quota_refuses_and_takes_nothing() -> None:
    """With fewer tokens than the price the retry is refused and nothing is taken;
    a throttled retry, cheaper, may still pass."""
    quota = RetryQuotaCore(capacity=20)
    assert quota.try_retry(NOW)  # 6 left
    assert not quota.try_retry(NOW) and quota.tokens == 6
    assert quota.try_retry(NOW, throttled=True) and quota.tokens == 1


def test_failures_alone_do_not_change_the_quota() -> None:
    """A failure is paid for by the retry it leads to, not by itself."""
    quota = RetryQuotaCore()
    quota.record_outcome(NOW, success=False, failed=True)
    assert quota.tokens == 500


def test_throttling_allows_retries_only_above_half_the_tokens() -> None:
    """gRPC A6 with maxTokens 10, tokenRatio 0.1: five failures bring 10 to 5 (= half),
    and retries stop; retrying itself takes nothing."""
    throttle = RetryThrottlingCore(max_tokens=10, token_ratio=0.1)
    for _ in range(4):
        throttle.record_outcome(NOW, success=False, failed=True)
        assert throttle.try_retry(NOW)
    throttle.record_outcome(NOW, success=False, failed=True)
    assert throttle.tokens == 5 and not throttle.try_retry(NOW)


def test_throttling_recovers_with_successes_and_is_bounded() -> None:
    """Each success adds token_ratio until the count is above half again; never past max."""
    throttle = RetryThrottlingCore(max_tokens=10, token_ratio=0.5)
    for _ in range(5):
        throttle.record_outcome(NOW, success=False, failed=True)
    throttle.record_outcome(NOW, success=True)
    assert throttle.tokens == 5.5 and throttle.try_retry(NOW)
    for _ in range(20):
        throttle.record_outcome(NOW, success=True)
    assert throttle.tokens == 10
    for _ in range(30):
        throttle.record_outcome(NOW, success=False, failed=True)
    assert throttle.tokens == 0


def test_a_malformed_request_moves_no_token() -> None:
    """Neither success nor server failure (INVALID_ARGUMENT): the count stays."""
    throttle = RetryThrottlingCore()
    throttle.record_outcome(NOW, success=False, failed=False)
    assert throttle.tokens == 10


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: RetryQuotaCore(capacity=0), "capacity"),
        (lambda: RetryQuotaCore(retry_cost=-1), "retry_cost"),
        (lambda: RetryQuotaCore(throttling_cost=float("nan")), "throttling_cost"),
        (lambda: RetryThrottlingCore(max_tokens=1001), "max_tokens"),
        (lambda: RetryThrottlingCore(max_tokens=0), "max_tokens"),
        (lambda: RetryThrottlingCore(token_ratio=0), "token_ratio"),
        (lambda: RetryThrottlingCore(token_ratio=True), "token_ratio"),
    ],
)
def test_invalid_settings_fail_naming_the_field(make: object, field: str) -> None:
    """Out-of-range settings raise ConfigError naming the field."""
    with pytest.raises(ConfigError) as info:
        make()  # type: ignore[operator]
    assert info.value.field == field
