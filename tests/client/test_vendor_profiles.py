"""RetryPolicy.for_api(vendor) against the mock server playing that vendor's answers
(stormguard.mock.vendor_scenario): the statuses, hints, waits and attempts of each
vendor's own SDK -- and the unkeyed-POST rule no profile loosens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from stormguard import ConfigError, RetryPolicy, RetryQuota
from stormguard.httpx import RetryTransport
from stormguard.mock import MockServer, vendor_scenario
from stormguard.testing import FakeClock

Mock = Callable[..., MockServer]


class Call:
    """One request through a RetryTransport with a profile, on a fake clock."""

    def __init__(self, mock: MockServer, policy: RetryPolicy, **options: Any) -> None:
        self.mock = mock
        self.clock = FakeClock()
        self.policy = policy
        transport = RetryTransport(policy=policy, clock=self.clock, breaker=False, **options)
        self.client = httpx.Client(transport=transport, base_url=mock.url, timeout=10)

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The caller's answer."""
        return self.client.request(method, path, **kwargs)

    def attempts(self, path: str) -> int:
        """Requests the mock saw for ``path``."""
        return sum(1 for entry in self.mock.journal() if entry["path"] == path)


@pytest.fixture
def vendor(stormguard_mock: Mock) -> Callable[..., Call]:
    """A Call against the mock playing ``name`` with RetryPolicy.for_api(name)."""

    def make(name: str, **options: Any) -> Call:
        return Call(stormguard_mock(vendor_scenario(name)), RetryPolicy.for_api(name), **options)

    return make


def test_openai_retries_what_its_sdk_retries(vendor: Callable[..., Call]) -> None:
    """A 500 with x-should-retry: true, then a 429 with retry-after-ms: 250, then 200:
    three attempts (the SDK's 2 retries), the backoff 0.375-0.5 s, then 0.25 s."""
    call = vendor("openai")
    answer = call.send("POST", "/v1/chat/completions", json={"model": "gpt-4o"})
    assert answer.status_code == 200 and call.attempts("/v1/chat/completions") == 3
    first, second = call.clock.sleeps
    assert 0.375 <= first <= 0.5 and 0.25 <= second <= 0.275


def test_openai_get_retries_a_503(vendor: Callable[..., Call]) -> None:
    """GET /v1/models: 503 then 200."""
    call = vendor("openai")
    assert call.send("GET", "/v1/models").status_code == 200
    assert call.attempts("/v1/models") == 2


def test_no_profile_loosens_the_unkeyed_post_rule(vendor: Callable[..., Call]) -> None:
    """A POST 500 without x-should-retry may have been processed: one attempt (the
    OpenAI SDK would repeat it); with idempotency_keys=True it is retried."""
    call = vendor("openai")
    assert call.send("POST", "/v1/embeddings", json={}).status_code == 500
    assert call.attempts("/v1/embeddings") == 1
    keyed = vendor("openai", idempotency_keys=True)
    assert keyed.send("POST", "/v1/embeddings", json={}).status_code == 200
    assert keyed.attempts("/v1/embeddings") == 2


def test_openai_final_answers_are_returned(vendor: Callable[..., Call]) -> None:
    """400 with x-should-retry: false: one attempt."""
    call = vendor("openai")
    assert call.send("POST", "/v1/files").status_code == 400 and call.attempts("/v1/files") == 1


def test_the_default_policy_stops_at_the_first_500(stormguard_mock: Mock) -> None:
    """Without the profile a GET 500 is final (the gap the profiles fill)."""
    call = Call(stormguard_mock(vendor_scenario("anthropic")), RetryPolicy())
    assert call.send("GET", "/v1/models").status_code == 500


def test_anthropic_retries_529_overloaded_and_429(vendor: Callable[..., Call]) -> None:
    """529 overloaded (x-should-retry: true), then 429 with Retry-After: 1, then 200."""
    call = vendor("anthropic")
    answer = call.send("POST", "/v1/messages", json={"model": "claude"})
    assert answer.status_code == 200 and call.attempts("/v1/messages") == 3
    first, second = call.clock.sleeps
    assert 0.375 <= first <= 0.5 and 1.0 <= second <= 1.1


def test_anthropic_retries_a_500_on_get(vendor: Callable[..., Call]) -> None:
    """500 is retryable for Anthropic (>= 500); a 400 is final."""
    call = vendor("anthropic")
    assert call.send("GET", "/v1/models").status_code == 200
    assert call.send("POST", "/v1/messages/batches").status_code == 400
    assert call.attempts("/v1/messages/batches") == 1


def test_stripe_retries_a_lock_timeout_and_a_500_of_a_keyed_post(
    vendor: Callable[..., Call],
) -> None:
    """Keyed POST (as Stripe's SDK keys every POST): 409 lock_timeout
    (Stripe-Should-Retry: true), 500, then the object; waits of Stripe's backoff
    (0.5 s, then 0.5-1 s); the payment is created once."""
    call = vendor("stripe", idempotency_keys=True)
    answer = call.send("POST", "/v1/payment_intents", data={"amount": "100"})
    assert answer.status_code == 200 and call.attempts("/v1/payment_intents") == 3
    first, second = call.clock.sleeps
    assert first == 0.5 and 0.5 <= second <= 1.0
    assert sum(call.mock.ledger()["payment_intents"].values()) == 1


def test_stripe_decline_is_final_and_a_503_get_is_retried(vendor: Callable[..., Call]) -> None:
    """402 with Stripe-Should-Retry: false is the answer; GET 503 then 200."""
    call = vendor("stripe", idempotency_keys=True)
    assert call.send("POST", "/v1/charges").status_code == 402
    assert call.attempts("/v1/charges") == 1
    assert call.send("GET", "/v1/customers/cus_1").status_code == 200


def test_github_waits_as_octokit_and_its_rate_limits(vendor: Callable[..., Call]) -> None:
    """502 (1 s, octokit's first wait), a secondary limit 403 + Retry-After: 1, a
    primary 429 waiting for x-ratelimit-reset, then the repo: 4 attempts."""
    call = vendor("github")
    answer = call.send("GET", "/repos/octo/hello")
    assert answer.status_code == 200 and call.attempts("/repos/octo/hello") == 4
    backoff, secondary, primary = call.clock.sleeps
    assert backoff == 1.0 and 1.0 <= secondary <= 1.1
    elapsed_before = backoff + secondary
    assert 10 - elapsed_before <= primary <= (10 - elapsed_before) * 1.1


def test_github_bad_credentials_are_final(vendor: Callable[..., Call]) -> None:
    """A 403 without rate-limit headers is never retried."""
    call = vendor("github")
    assert call.send("GET", "/user").status_code == 403 and call.attempts("/user") == 1


def test_aws_throttle_costs_five_waits_x_amz_retry_after_and_is_refunded(
    vendor: Callable[..., Call],
) -> None:
    """DynamoDB POST throttled (400 ThrottlingException, x-amz-retry-after: 100):
    retried after 0.1 s (a throttle is a refusal, so even a POST), the quota pays 5
    and gets them back on the success."""
    call = vendor("aws")
    quota = call.policy.budget
    assert isinstance(quota, RetryQuota)
    answer = call.send("POST", "/dynamodb", json={"TableName": "t"})
    assert answer.status_code == 200 and call.attempts("/dynamodb") == 2
    assert 0.1 <= call.clock.sleeps[0] <= 0.11
    assert quota.balance == 500


def test_aws_transient_put_backs_off_from_fifty_ms(vendor: Callable[..., Call]) -> None:
    """S3 PUT 500: retried after at most 50 ms (the transient base), then stored."""
    call = vendor("aws")
    assert call.send("PUT", "/bucket/key", content=b"data").status_code == 200
    assert 0.0 <= call.clock.sleeps[0] <= 0.05


def test_aws_unkeyed_post_500_and_validation_are_answers(vendor: Callable[..., Call]) -> None:
    """A JSON-protocol 500 (a POST that may have written) and a ValidationException
    (a 400) are returned after one attempt."""
    call = vendor("aws")
    assert call.send("POST", "/dynamodb/write").status_code == 500
    assert call.send("POST", "/dynamodb/bad").status_code == 400
    assert call.attempts("/dynamodb/write") == call.attempts("/dynamodb/bad") == 1


def test_each_aws_profile_gets_its_own_quota() -> None:
    """Two for_api("aws") policies do not share a quota (share the policy to share it)."""
    assert RetryPolicy.for_api("aws").budget is not RetryPolicy.for_api("aws").budget


def test_a_profile_takes_changes_and_refuses_unknown_apis() -> None:
    """for_api(name, **changes) replaces fields; an unknown name fails naming `api`."""
    assert RetryPolicy.for_api("stripe", attempts=5).attempts == 5
    with pytest.raises(ConfigError) as info:
        RetryPolicy.for_api("acme")
    assert info.value.field == "api"
