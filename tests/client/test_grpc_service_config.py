"""The interceptors read a channel's gRPC service config as gRPC does (A6):
retryPolicy per method, retryThrottling for every call; against a real server."""

from __future__ import annotations

import json
import random
from typing import Any

import grpc
import pytest
from test_grpc import METHOD, Server, call_async, call_sync

from stormguard import ConfigError
from stormguard.client._grpc_config import A6Backoff, ServiceConfig
from stormguard.grpc import RetryInterceptor, channel_options
from stormguard.testing import FakeClock

UNAVAILABLE, ABORTED = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED
OK = grpc.StatusCode.OK


def config(**retry_policy: Any) -> dict[str, Any]:
    """A service config retrying demo.Payments (every method) by ``retry_policy``."""
    policy = {
        "maxAttempts": 3,
        "initialBackoff": "0.1s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
        **retry_policy,
    }
    return {"methodConfig": [{"name": [{"service": "demo.Payments"}], "retryPolicy": policy}]}


@pytest.fixture(params=[call_sync, call_async], ids=["sync", "aio"])
def call(request: pytest.FixtureRequest) -> Any:
    """Each interceptor in turn."""
    return request.param


@pytest.fixture
def server() -> Any:
    """A scripted gRPC server on 127.0.0.1."""
    srv = Server()
    try:
        yield srv
    finally:
        srv.stop()


def test_a_methods_retry_policy_retries_its_codes(server: Server, call: Any) -> None:
    """retryableStatusCodes are retried for the method even though the interceptor
    was not told it is idempotent (the service owner chose them), up to maxAttempts."""
    server.play(UNAVAILABLE, UNAVAILABLE, OK)
    clock = FakeClock()
    outcome = call(server.port, service_config=json.dumps(config()), clock=clock)
    assert outcome.code == OK and len(server.script.seen) == 3
    assert len(clock.sleeps) == 2 and 0 <= clock.sleeps[0] <= 0.1 and 0 <= clock.sleeps[1] <= 0.2


def test_max_attempts_bounds_the_call(server: Server, call: Any) -> None:
    """maxAttempts 2: one retry, then the last status."""
    server.play(UNAVAILABLE)
    outcome = call(server.port, service_config=config(maxAttempts=2), clock=FakeClock())
    assert outcome.code == UNAVAILABLE and len(server.script.seen) == 2


def test_codes_outside_the_policy_are_not_retried(server: Server, call: Any) -> None:
    """ABORTED is not in retryableStatusCodes: one attempt."""
    server.play(ABORTED, OK)
    outcome = call(server.port, service_config=config(), clock=FakeClock())
    assert outcome.code == ABORTED and len(server.script.seen) == 1


def test_a_method_the_config_gives_no_policy_is_not_retried(server: Server, call: Any) -> None:
    """Named without a retryPolicy: as in gRPC, not retried (even an idempotent one)."""
    document = {"methodConfig": [{"name": [{"service": "demo.Payments"}], "timeout": "5s"}]}
    server.play(UNAVAILABLE, OK)
    outcome = call(server.port, service_config=document, idempotent=True, clock=FakeClock())
    assert outcome.code == UNAVAILABLE and len(server.script.seen) == 1


def test_retry_throttling_stops_a_calls_retries(server: Server, call: Any) -> None:
    """retryThrottling maxTokens 3: two failed attempts bring 3 to 1 (<= 1.5), so the
    call stops after them although maxAttempts allows a third."""
    document = {**config(), "retryThrottling": {"maxTokens": 3, "tokenRatio": 0.1}}
    server.play(UNAVAILABLE)
    outcome = call(server.port, service_config=document, clock=FakeClock())
    assert outcome.code == UNAVAILABLE and len(server.script.seen) == 2


def test_one_interceptor_throttles_its_calls_together(server: Server) -> None:
    """The same interceptor (one server name): the second call's retries are throttled."""
    document = {**config(), "retryThrottling": {"maxTokens": 3, "tokenRatio": 0.1}}
    interceptor = RetryInterceptor(service_config=document, clock=FakeClock())
    server.play(UNAVAILABLE)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", options=channel_options()) as channel:
        stub = grpc.intercept_channel(channel, interceptor).unary_unary(METHOD)
        for _ in range(2):
            with pytest.raises(grpc.RpcError):
                stub(b"5", timeout=10)
    # call 1: 2 attempts (3 -> 2 -> 1 tokens); call 2: its first attempt, no retry.
    assert len(server.script.seen) == 3


def test_channel_options_turn_grpcs_retries_off_and_keep_the_rest() -> None:
    """The channel keeps the config without what the interceptor performs."""
    document = {
        **config(),
        "retryThrottling": {"maxTokens": 3, "tokenRatio": 0.1},
        "loadBalancingConfig": [{"round_robin": {}}],
    }
    document["methodConfig"][0]["timeout"] = "2s"
    options = dict(channel_options(document))
    assert options["grpc.enable_retries"] == 0
    kept = json.loads(options["grpc.service_config"])
    assert "retryThrottling" not in kept and kept["loadBalancingConfig"] == [{"round_robin": {}}]
    assert kept["methodConfig"] == [{"name": [{"service": "demo.Payments"}], "timeout": "2s"}]


def test_the_most_specific_name_wins() -> None:
    """Method entry, then service entry, then the default one ({})."""
    document = {
        "methodConfig": [
            {"name": [{}], "timeout": "9s"},
            {"name": [{"service": "a.S"}], "timeout": "2s"},
            {"name": [{"service": "a.S", "method": "M"}], "timeout": "1s"},
        ]
    }
    parsed = ServiceConfig(document)
    assert parsed.for_method("/a.S/M").timeout == 1.0  # type: ignore[union-attr]
    assert parsed.for_method("/a.S/Other").timeout == 2.0  # type: ignore[union-attr]
    assert parsed.for_method("/b.T/X").timeout == 9.0  # type: ignore[union-attr]


def test_max_attempts_above_five_counts_as_five() -> None:
    """A6's client-side ceiling: maxAttempts 9 is read as 5."""
    parsed = ServiceConfig(config(maxAttempts=9)).for_method(METHOD)
    assert parsed is not None and parsed.attempts == 5


def test_the_a6_backoff_grows_by_the_multiplier_up_to_the_cap() -> None:
    """The n-th retry waits uniform(0, min(initial * multiplier**(n-1), max))."""
    backoff = A6Backoff(initial=0.1, cap=1.0, multiplier=3.0)

    class Top(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b

    assert [round(backoff.delay(n, Top()), 6) for n in (1, 2, 3, 4)] == [0.1, 0.3, 0.9, 1.0]


@pytest.mark.parametrize(
    ("document", "field"),
    [
        (config(maxAttempts=1), "service_config.methodConfig[0].retryPolicy.maxAttempts"),
        (
            config(initialBackoff="fast"),
            "service_config.methodConfig[0].retryPolicy.initialBackoff",
        ),
        (
            config(retryableStatusCodes=[]),
            "service_config.methodConfig[0].retryPolicy.retryableStatusCodes",
        ),
        (
            config(retryableStatusCodes=["NOPE"]),
            "service_config.methodConfig[0].retryPolicy.retryableStatusCodes",
        ),
        (
            {"retryThrottling": {"maxTokens": 5000, "tokenRatio": 0.1}},
            "service_config.retryThrottling.maxTokens",
        ),
        ("{not json", "service_config"),
    ],
)
def test_an_invalid_config_fails_naming_the_field(document: Any, field: str) -> None:
    """Invalid service configs raise ConfigError naming the field, at construction."""
    with pytest.raises(ConfigError) as info:
        RetryInterceptor(service_config=document)
    assert info.value.field == field
