"""gRPC interceptors (sync and asyncio) against a real gRPC server on loopback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest

from stormguard import Constant, RetryPolicy, RetryRecord
from stormguard.grpc import AsyncRetryInterceptor, RetryInterceptor
from stormguard.testing import FakeClock

METHOD = "/demo.Payments/Charge"
# gRPC's own retries off, so stormguard decides alone (and grpcio passes the
# interceptor's grpc-previous-rpc-attempts on: its own retry filter drops it).
NO_CORE_RETRIES = (("grpc.enable_retries", 0),)


@dataclass
class Script:
    """Status codes (with trailers) to answer in order; the last one repeats."""

    steps: list[tuple[grpc.StatusCode, tuple[tuple[str, str], ...]]] = field(default_factory=list)
    seen: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Server:
    """A gRPC server with one generic unary method that plays a script."""

    def __init__(self) -> None:
        self.script = Script()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))

        def charge(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self.script.lock:
                index = len(self.script.seen)
                self.script.seen.append(dict(context.invocation_metadata()))
                steps = self.script.steps or [(grpc.StatusCode.OK, ())]
                code, trailers = steps[min(index, len(steps) - 1)]
            if trailers:
                context.set_trailing_metadata(trailers)
            if code != grpc.StatusCode.OK:
                context.abort(code, f"scripted {code.name}")
            return b"charged:" + request

        handler = grpc.method_handlers_generic_handler(
            "demo.Payments", {"Charge": grpc.unary_unary_rpc_method_handler(charge)}
        )
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def play(self, *steps: grpc.StatusCode | tuple[grpc.StatusCode, dict[str, str]]) -> None:
        """Script the answers."""
        self.script.steps = [
            (s, ()) if isinstance(s, grpc.StatusCode) else (s[0], tuple(s[1].items()))
            for s in steps
        ]
        self.script.seen.clear()

    def stop(self) -> None:
        """Stop at once."""
        self._server.stop(None)


@pytest.fixture
def server() -> Iterator[Server]:
    """A scripted gRPC server on 127.0.0.1."""
    srv = Server()
    try:
        yield srv
    finally:
        srv.stop()


@dataclass
class Outcome:
    """What the caller saw."""

    code: grpc.StatusCode
    body: bytes | None
    records: list[RetryRecord]


def call_sync(port: int, **kwargs: Any) -> Outcome:
    """One unary call through a sync channel with RetryInterceptor."""
    records: list[RetryRecord] = []
    interceptor = RetryInterceptor(on_retry=records.append, **kwargs)
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=NO_CORE_RETRIES) as channel:
        stub = grpc.intercept_channel(channel, interceptor).unary_unary(METHOD)
        try:
            return Outcome(grpc.StatusCode.OK, stub(b"5", timeout=10), records)
        except grpc.RpcError as exc:
            return Outcome(exc.code(), None, records)


def call_async(port: int, **kwargs: Any) -> Outcome:
    """One unary call through a grpc.aio channel with AsyncRetryInterceptor."""
    records: list[RetryRecord] = []

    async def go() -> Outcome:
        interceptor = AsyncRetryInterceptor(on_retry=records.append, **kwargs)
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=[interceptor], options=NO_CORE_RETRIES
        ) as channel:
            stub = channel.unary_unary(METHOD)
            try:
                return Outcome(grpc.StatusCode.OK, await stub(b"5", timeout=10), records)
            except grpc.aio.AioRpcError as exc:
                return Outcome(exc.code(), None, records)

    return asyncio.run(go())


@pytest.fixture(params=[call_sync, call_async], ids=["sync", "aio"])
def call(request: pytest.FixtureRequest) -> Any:
    """Each interceptor in turn."""
    return request.param


FAST = RetryPolicy(attempts=4, backoff=Constant(0.2, 0.2))
UNAVAILABLE, EXHAUSTED = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED


def test_unavailable_is_retried_for_idempotent_methods(server: Server, call: Any) -> None:
    """UNAVAILABLE, UNAVAILABLE, OK -> OK after three attempts on an idempotent method."""
    server.play(UNAVAILABLE, UNAVAILABLE, grpc.StatusCode.OK)
    clock = FakeClock()
    outcome = call(server.port, policy=FAST, idempotent={METHOD}, clock=clock)
    assert outcome.code == grpc.StatusCode.OK and outcome.body == b"charged:5"
    assert len(server.script.seen) == 3 and clock.sleeps == [0.2, 0.2]


def test_unavailable_is_not_retried_for_unsafe_methods(server: Server, call: Any) -> None:
    """Without idempotency UNAVAILABLE may mean 'processed': one attempt."""
    server.play(UNAVAILABLE, grpc.StatusCode.OK)
    outcome = call(server.port, policy=FAST, clock=FakeClock())
    assert outcome.code == UNAVAILABLE and len(server.script.seen) == 1


def test_resource_exhausted_is_retried_for_any_method(server: Server, call: Any) -> None:
    """RESOURCE_EXHAUSTED (the 429 of gRPC) is retried even for unsafe methods."""
    server.play(EXHAUSTED, grpc.StatusCode.OK)
    outcome = call(server.port, policy=FAST, clock=FakeClock())
    assert outcome.code == grpc.StatusCode.OK and len(server.script.seen) == 2


def test_pushback_trailer_sets_the_wait(server: Server, call: Any) -> None:
    """grpc-retry-pushback-ms replaces the backoff draw."""
    server.play((EXHAUSTED, {"grpc-retry-pushback-ms": "1500"}), grpc.StatusCode.OK)
    clock = FakeClock()
    outcome = call(server.port, policy=FAST, clock=clock)
    assert outcome.code == grpc.StatusCode.OK and len(clock.sleeps) == 1
    assert 1.5 <= clock.sleeps[0] <= 1.65  # the pushback + <= 10 % jitter
    assert outcome.records[0].hint_used


def test_negative_pushback_forbids_retry(server: Server, call: Any) -> None:
    """A negative pushback is the server saying 'do not retry'."""
    server.play((UNAVAILABLE, {"grpc-retry-pushback-ms": "-1"}), grpc.StatusCode.OK)
    outcome = call(server.port, policy=FAST, idempotent=True, clock=FakeClock())
    assert outcome.code == UNAVAILABLE and len(server.script.seen) == 1


def test_other_codes_are_final(server: Server, call: Any) -> None:
    """INVALID_ARGUMENT is returned after one attempt."""
    server.play(grpc.StatusCode.INVALID_ARGUMENT)
    outcome = call(server.port, policy=FAST, idempotent=True, clock=FakeClock())
    assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT and len(server.script.seen) == 1


def test_idempotency_key_is_created_once(server: Server, call: Any) -> None:
    """With idempotency_keys=True one key is sent on every attempt and makes the call safe."""
    server.play(UNAVAILABLE, UNAVAILABLE, grpc.StatusCode.OK)
    outcome = call(server.port, policy=FAST, idempotency_keys=True, clock=FakeClock())
    keys = {seen.get("idempotency-key") for seen in server.script.seen}
    assert outcome.code == grpc.StatusCode.OK
    assert len(server.script.seen) == 3 and len(keys) == 1 and None not in keys


def test_attempts_exhausted_returns_last_status(server: Server, call: Any) -> None:
    """After `attempts` failures the caller gets the last status as gRPC raised it."""
    server.play(UNAVAILABLE)
    outcome = call(server.port, policy=FAST, idempotent=True, clock=FakeClock())
    assert outcome.code == UNAVAILABLE and len(server.script.seen) == 4
    assert [r.attempt for r in outcome.records] == [1, 2, 3]


def test_huge_pushback_is_not_slept(server: Server, call: Any) -> None:
    """A pushback longer than max_wait ends the call at once."""
    server.play((EXHAUSTED, {"grpc-retry-pushback-ms": "86400000"}), grpc.StatusCode.OK)
    clock = FakeClock()
    outcome = call(server.port, policy=FAST, clock=clock)
    assert outcome.code == EXHAUSTED and clock.sleeps == []


def test_breaker_and_budget_plug_in_through_the_policy(server: Server) -> None:
    """A CircuitBreaker in the policy counts UNAVAILABLE and then refuses calls."""
    import stormguard

    server.play(UNAVAILABLE)
    breaker = stormguard.CircuitBreaker(min_calls=2, failure_rate=0.5, open_for=60)
    policy = RetryPolicy(
        attempts=2, backoff=Constant(0.2, 0.2), breaker=breaker, budget=stormguard.RetryBudget()
    )
    outcome = call_sync(server.port, policy=policy, idempotent=True, clock=FakeClock())
    assert outcome.code == UNAVAILABLE and len(server.script.seen) == 2
    assert breaker.state == "open"
    with pytest.raises(stormguard.CircuitOpen):
        call_sync(server.port, policy=policy, idempotent=True, clock=FakeClock())
    assert len(server.script.seen) == 2


@pytest.mark.redis
async def test_async_interceptor_awaits_a_budget_on_an_async_redis_store(
    server: Server, redis_url: str, key_prefix: str
) -> None:
    """Drift bug: AsyncRetryInterceptor used the sync budget/breaker calls (TypeError)."""
    pytest.importorskip("redis")
    import stormguard
    from stormguard.stores import AsyncRedisStore

    store = AsyncRedisStore(redis_url, prefix=key_prefix)
    budget = stormguard.RetryBudget(store=store, name="grpc")
    breaker = stormguard.CircuitBreaker(store=store, name="grpc", min_calls=100)
    policy = RetryPolicy(attempts=3, backoff=Constant(0.0, 0.0), budget=budget, breaker=breaker)
    server.play(UNAVAILABLE, grpc.StatusCode.OK)
    interceptor = AsyncRetryInterceptor(policy=policy, idempotent=True, clock=FakeClock())
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{server.port}", interceptors=[interceptor]
    ) as channel:
        reply = await channel.unary_unary(METHOD)(b"5", timeout=10)
    assert reply == b"charged:5" and len(server.script.seen) == 2
    await store.aclose()


def test_retry_if_makes_a_code_outside_the_table_retryable(server: Server, call: Any) -> None:
    """retry_if sees the failed call and can retry ABORTED on an idempotent method."""
    aborted = grpc.StatusCode.ABORTED
    server.play(aborted, grpc.StatusCode.OK)

    def retry_if(answer: Any) -> bool | None:
        return True if answer.code == aborted else None

    result = call(server.port, policy=FAST, idempotent=True, retry_if=retry_if, clock=FakeClock())
    assert result.code == grpc.StatusCode.OK and len(server.script.seen) == 2


def test_retry_if_cannot_retry_an_unsafe_method(server: Server, call: Any) -> None:
    """retry_if=True does not repeat a non-idempotent call that may have been processed."""
    server.play(UNAVAILABLE, grpc.StatusCode.OK)
    result = call(server.port, policy=FAST, retry_if=lambda outcome: True, clock=FakeClock())
    assert result.code == UNAVAILABLE and len(server.script.seen) == 1


def test_each_retry_says_how_many_attempts_came_before(server: Server, call: Any) -> None:
    """gRPC A6: no grpc-previous-rpc-attempts on the first attempt, then 1 and 2."""
    server.play(UNAVAILABLE, UNAVAILABLE, grpc.StatusCode.OK)
    outcome = call(server.port, policy=FAST, idempotent=True, clock=FakeClock())
    assert outcome.code == grpc.StatusCode.OK
    previous = [seen.get("grpc-previous-rpc-attempts") for seen in server.script.seen]
    assert previous == [None, "1", "2"]
