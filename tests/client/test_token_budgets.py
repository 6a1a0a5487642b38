"""The AWS retry quota and gRPC retry throttling as a policy's budget, through the
engine: what each retry costs, what answers give back, and the throttle backoff."""

from __future__ import annotations

import grpc
import pytest
from http_support import (
    ScriptedServer,
    Sender,
    Step,
)

from stormguard import (
    Constant,
    GiveUpReason,
    RetryError,
    RetryPolicy,
    RetryQuota,
    RetryThrottling,
    retry,
)
from stormguard.testing import FakeClock


def test_transient_retries_stop_when_the_quota_cannot_pay(clock: FakeClock) -> None:
    """A quota of 30: two retries after transient failures cost 28; a third is refused."""
    quota = RetryQuota(capacity=30)
    calls = []

    @retry(on=OSError, attempts=10, budget=quota, backoff=Constant(0, 0), clock=clock)
    def flaky() -> None:
        calls.append(1)
        raise OSError("reset")

    with pytest.raises(RetryError) as info:
        flaky()
    assert info.value.reason == GiveUpReason.BUDGET_EXHAUSTED
    assert len(calls) == 3 and quota.balance == 2


def test_a_retry_that_succeeds_refunds_its_price(clock: FakeClock) -> None:
    """Fail once, then succeed: the retry's 14 tokens come back, the quota is whole."""
    quota = RetryQuota()
    outcomes = iter([OSError("reset"), None])

    @retry(on=OSError, budget=quota, backoff=Constant(0, 0), clock=clock)
    def once() -> str:
        error = next(outcomes)
        if error is not None:
            raise error
        return "ok"

    assert once() == "ok" and quota.balance == 500


def test_throttled_retries_cost_five_and_back_off_from_the_throttle_base(
    server: ScriptedServer, send: Sender
) -> None:
    """429, 429, 200 over HTTP: each retry costs 5 (not 14) and waits the
    throttle_backoff, not the transient backoff; the success refunds the last 5."""
    server.script(Step(429), Step(429), Step(200))
    quota = RetryQuota()
    clock = FakeClock()
    policy = RetryPolicy(
        attempts=4, backoff=Constant(0.05, 0.05), throttle_backoff=Constant(1, 1), budget=quota
    )
    result = send(server.url, policy=policy, clock=clock)
    assert result.status == 200 and len(server.received) == 3
    assert clock.sleeps == [1.0, 1.0]
    assert quota.balance == 495


def test_a_first_attempt_success_over_http_adds_a_token(
    server: ScriptedServer, send: Sender
) -> None:
    """A plain success through an adapter tells the quota (+1, here back to full)."""
    quota = RetryQuota()
    assert quota.try_retry(throttled=True) and quota.balance == 495
    server.script(Step(200))
    policy = RetryPolicy(budget=quota)
    assert send(server.url, policy=policy, clock=FakeClock()).status == 200
    assert quota.balance == 496


def test_retry_throttling_stops_retries_after_failures(clock: FakeClock) -> None:
    """gRPC A6 throttling (maxTokens 4): each failed attempt takes a token; at half
    (2 tokens) retries stop, whatever attempts the policy allows."""
    throttle = RetryThrottling(max_tokens=4, token_ratio=0.5)
    calls = []

    @retry(on=OSError, attempts=10, budget=throttle, backoff=Constant(0, 0), clock=clock)
    def down() -> None:
        calls.append(1)
        raise OSError("unavailable")

    with pytest.raises(RetryError) as info:
        down()
    assert info.value.reason == GiveUpReason.BUDGET_EXHAUSTED
    assert len(calls) == 2 and throttle.balance == 2


def test_a_final_grpc_answer_moves_no_throttling_token() -> None:
    """INVALID_ARGUMENT is neither a success nor a server failure for A6 throttling."""
    from stormguard.client._grpc import _Base  # the interceptors' shared judgement
    from stormguard.core._engine import verdict

    judged = _Base()._judge(None, grpc.StatusCode.INVALID_ARGUMENT, (), None, True)
    assert verdict(judged) == (False, False, False, False)
    unavailable = _Base()._judge(None, grpc.StatusCode.UNAVAILABLE, (), None, True)
    assert verdict(unavailable).failed
