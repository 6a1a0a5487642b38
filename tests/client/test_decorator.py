"""@stormguard.retry on sync and async callables, with a fake clock."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import stormguard
from stormguard import (
    CircuitOpen,
    ConfigError,
    Constant,
    Exponential,
    GiveUpReason,
    RetryError,
    RetryPolicy,
    RetryRecord,
    retry,
)
from stormguard.testing import FakeClock


class Flaky:
    """Raises the scripted exceptions in order, then returns 'done'."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def run_sync_or_async(kind: str, decorator: Callable[[Any], Any], flaky: Flaky) -> Any:
    """Decorate flaky as a sync or an async function and call it once."""
    if kind == "sync":
        return decorator(lambda: flaky())()

    async def coroutine() -> str:
        await asyncio.sleep(0)
        return flaky()

    return asyncio.run(decorator(coroutine)())


KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


@KINDS
def test_retries_until_success(kind: str) -> None:
    """Two failures then success: three calls, two waits from the backoff."""
    clock = FakeClock()
    flaky = Flaky(OSError("a"), OSError("b"))
    deco = retry(on=OSError, attempts=5, backoff=Exponential(1, 10), clock=clock)
    assert run_sync_or_async(kind, deco, flaky) == "done"
    assert flaky.calls == 3
    assert clock.sleeps == [1, 2]


@KINDS
def test_attempts_exhausted_keeps_the_last_exception(kind: str) -> None:
    """After `attempts` failures RetryError says why and keeps the last exception."""
    last = OSError("third")
    flaky = Flaky(OSError("1"), OSError("2"), last)
    deco = retry(on=OSError, attempts=3, backoff=Constant(1, 1), clock=FakeClock())
    with pytest.raises(RetryError) as info:
        run_sync_or_async(kind, deco, flaky)
    assert info.value.reason == GiveUpReason.ATTEMPTS_EXHAUSTED
    assert info.value.attempts == 3
    assert info.value.last_exception is last and info.value.__cause__ is last
    assert "attempts exhausted" in str(info.value)


@KINDS
def test_other_exceptions_propagate_unchanged(kind: str) -> None:
    """An exception not matched by `on` is raised at once, unwrapped."""
    flaky = Flaky(KeyError("k"))
    deco = retry(on=OSError, clock=FakeClock())
    with pytest.raises(KeyError):
        run_sync_or_async(kind, deco, flaky)
    assert flaky.calls == 1


@KINDS
def test_deadline_stops_the_waiting(kind: str) -> None:
    """With a 10 s deadline, exponential waits 1+2+4 fit and the next one does not."""
    clock = FakeClock()
    flaky = Flaky(*[OSError(str(i)) for i in range(20)])
    deco = retry(on=OSError, attempts=20, deadline=10, backoff=Exponential(1, 100), clock=clock)
    with pytest.raises(RetryError) as info:
        run_sync_or_async(kind, deco, flaky)
    assert info.value.reason == GiveUpReason.DEADLINE
    assert clock.sleeps == [1, 2, 4] and sum(clock.sleeps) < 10


class Throttled(Exception):
    """An exception carrying the server's wait."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"retry after {retry_after}")
        self.retry_after = retry_after


@KINDS
def test_retry_after_attribute_is_the_wait(kind: str) -> None:
    """An exception's retry_after attribute is waited instead of the backoff."""
    clock = FakeClock()
    records: list[RetryRecord] = []
    deco = retry(on=Throttled, backoff=Constant(9, 9), clock=clock, on_retry=records.append)
    assert run_sync_or_async(kind, deco, Flaky(Throttled(2.5))) == "done"
    assert len(clock.sleeps) == 1 and 2.5 <= clock.sleeps[0] <= 2.75  # hint + <= 10 % jitter
    assert records[0].hint_used and records[0].hint == 2.5 and records[0].attempt == 1


@KINDS
def test_hint_too_long_carries_the_hint(kind: str) -> None:
    """A hint over max_wait is not slept: RetryError(hint too long) carries it."""
    clock = FakeClock()
    deco = retry(on=Throttled, max_wait=60, clock=clock)
    with pytest.raises(RetryError) as info:
        run_sync_or_async(kind, deco, Flaky(Throttled(86400)))
    assert info.value.reason == GiveUpReason.HINT_TOO_LONG and info.value.hint == 86400
    assert clock.sleeps == []


def http_error(status: int, headers: dict[str, str], method: str = "GET") -> httpx.HTTPStatusError:
    """An httpx.HTTPStatusError as raise_for_status() makes it."""
    request = httpx.Request(method, "https://api.example/x")
    response = httpx.Response(status, headers=headers, request=request)
    return httpx.HTTPStatusError("boom", request=request, response=response)


def test_http_status_errors_follow_the_table() -> None:
    """HTTPStatusError: 503 retried with its Retry-After; 404 not retryable."""
    clock = FakeClock()
    flaky = Flaky(http_error(503, {"Retry-After": "3"}))
    assert retry(on=httpx.HTTPStatusError, clock=clock)(flaky)() == "done"
    assert len(clock.sleeps) == 1 and 3.0 <= clock.sleeps[0] <= 3.3  # hint + <= 10 % jitter
    with pytest.raises(RetryError) as info:
        retry(on=httpx.HTTPStatusError, clock=clock)(Flaky(http_error(404, {})))()
    assert info.value.reason == GiveUpReason.NOT_RETRYABLE and info.value.attempts == 1


def test_http_status_error_of_unkeyed_post_is_not_retried() -> None:
    """A 503 to a POST without a key is not retried by the decorator either."""
    with pytest.raises(RetryError) as info:
        retry(on=httpx.HTTPStatusError, clock=FakeClock())(Flaky(http_error(503, {}, "POST")))()
    assert info.value.reason == GiveUpReason.NOT_RETRYABLE


def test_rate_limit_headers_give_the_wait() -> None:
    """An exhausted quota's reset is used as the wait when there is no Retry-After."""
    clock = FakeClock()
    headers = {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "7"}
    assert retry(on=httpx.HTTPStatusError, clock=clock)(Flaky(http_error(429, headers)))() == "done"
    assert len(clock.sleeps) == 1 and 7.0 <= clock.sleeps[0] <= 7.7  # hint + <= 10 % jitter


def test_predicate_filter() -> None:
    """`on` may be a predicate over the exception."""
    clock = FakeClock()
    flaky = Flaky(ValueError("transient"), ValueError("fatal"))
    deco = retry(on=lambda exc: "transient" in str(exc), backoff=Constant(1, 1), clock=clock)
    with pytest.raises(ValueError, match="fatal"):
        deco(flaky)()
    assert flaky.calls == 2


def test_bare_decorator_uses_safe_defaults() -> None:
    """@retry without arguments retries Exception 4 times with full jitter."""
    calls: list[int] = []

    @retry
    def ok() -> int:
        calls.append(1)
        return 7

    assert ok() == 7 and calls == [1]


def test_seeded_rng_makes_waits_reproducible() -> None:
    """The same seed gives the same jittered schedule."""

    def schedule(seed: int) -> list[float]:
        clock = FakeClock()
        deco = retry(on=OSError, attempts=5, clock=clock, rng=random.Random(seed))
        with pytest.raises(RetryError):
            deco(Flaky(*[OSError()] * 5))()
        return clock.sleeps

    assert schedule(1) == schedule(1) != schedule(2)


def test_hook_and_log_see_each_retry(caplog: pytest.LogCaptureFixture) -> None:
    """A frozen record goes to the hook and a line to the 'stormguard' logger."""
    records: list[RetryRecord] = []
    with caplog.at_level(logging.INFO, logger="stormguard"):
        retry(on=OSError, backoff=Constant(1, 1), clock=FakeClock(), on_retry=records.append)(
            Flaky(OSError("x"))
        )()
    assert len(records) == 1
    with pytest.raises(AttributeError):
        records[0].wait = 3  # type: ignore[misc]
    assert "OSError" in caplog.records[0].getMessage()


def test_policy_and_fields_are_exclusive() -> None:
    """Giving both policy= and policy fields is a configuration error."""
    with pytest.raises(ConfigError, match="policy"):
        retry(policy=RetryPolicy(), attempts=3)


@pytest.mark.parametrize("bad", [{"attempts": 0}, {"deadline": -1}, {"on": 5}])
def test_invalid_configuration_fails_at_decoration(bad: dict[str, Any]) -> None:
    """Invalid values fail when the decorator is built, not at the first call."""
    with pytest.raises(ConfigError):
        retry(**bad)


class FakeBudget:
    """A budget allowing a fixed number of retries."""

    def __init__(self, retries: int) -> None:
        self.retries = retries
        self.requests = 0

    def record_request(self) -> None:
        self.requests += 1

    def try_retry(self) -> bool:
        self.retries -= 1
        return self.retries >= 0


def test_budget_seam_stops_retries() -> None:
    """When the budget refuses, the call ends with 'retry budget exhausted'."""
    budget = FakeBudget(1)
    deco = retry(on=OSError, attempts=5, budget=budget, clock=FakeClock())
    with pytest.raises(RetryError) as info:
        deco(Flaky(OSError(), OSError(), OSError()))()
    assert info.value.reason == GiveUpReason.BUDGET_EXHAUSTED
    assert info.value.attempts == 2 and budget.requests == 1


class FakeBreaker:
    """A breaker that opens after `allow` admissions and records outcomes."""

    def __init__(self, allow: int) -> None:
        self.allow = allow
        self.outcomes: list[bool] = []

    def acquire(self) -> FakeBreaker:
        if self.allow <= 0:
            raise CircuitOpen("svc", 4.0)
        self.allow -= 1
        return self

    def record(self, *, failure: bool) -> None:
        self.outcomes.append(failure)


def test_breaker_seam() -> None:
    """Each attempt is admitted and recorded; a refused retry ends with 'circuit open'."""
    breaker = FakeBreaker(2)
    deco = retry(on=OSError, attempts=5, breaker=breaker, clock=FakeClock())
    with pytest.raises(RetryError) as info:
        deco(Flaky(OSError(), OSError(), OSError()))()
    assert info.value.reason == GiveUpReason.CIRCUIT_OPEN and info.value.attempts == 2
    assert isinstance(info.value.__cause__, CircuitOpen)
    assert breaker.outcomes == [True, True]
    with pytest.raises(CircuitOpen):
        deco(Flaky())()


def test_public_names_are_exported() -> None:
    """The decorator and its companions are reachable from the package root."""
    assert stormguard.retry is retry and "RetryPolicy" in stormguard.__all__


@KINDS
def test_reraise_raises_the_last_exception_itself(kind: str) -> None:
    """reraise=True: when attempts run out the last exception comes out, not RetryError."""
    flaky = Flaky(ConnectionError("a"), ConnectionError("b"), ConnectionError("last"))
    decorator = retry(on=ConnectionError, attempts=3, reraise=True, clock=FakeClock())
    with pytest.raises(ConnectionError, match="last"):
        run_sync_or_async(kind, decorator, flaky)
    assert flaky.calls == 3


@KINDS
def test_reraise_keeps_except_httpx_connect_error_working(kind: str) -> None:
    """The tenacity/stamina habit: `except httpx.ConnectError` still catches a given-up call."""
    request = httpx.Request("GET", "http://127.0.0.1:9")
    flaky = Flaky(*[httpx.ConnectError("refused", request=request)] * 2)
    decorator = retry(on=httpx.ConnectError, attempts=2, reraise=True, clock=FakeClock())
    with pytest.raises(httpx.ConnectError):
        run_sync_or_async(kind, decorator, flaky)


@KINDS
def test_retry_if_false_stops_what_the_table_would_retry(kind: str) -> None:
    """retry_if returning False ends the call at once; None leaves it to the table."""
    seen: list[BaseException] = []

    def retry_if(exc: BaseException) -> bool | None:
        seen.append(exc)
        return False if "fatal" in str(exc) else None

    flaky = Flaky(OSError("blip"), OSError("fatal"), OSError("never reached"))
    decorator = retry(on=OSError, retry_if=retry_if, backoff=Constant(0, 0), clock=FakeClock())
    with pytest.raises(RetryError) as info:
        run_sync_or_async(kind, decorator, flaky)
    assert info.value.reason == GiveUpReason.NOT_RETRYABLE
    assert flaky.calls == 2 and [str(e) for e in seen] == ["blip", "fatal"]


@KINDS
def test_retry_if_true_retries_a_409_on_get(kind: str) -> None:
    """An HTTPStatusError 409 on GET is final by the table; retry_if can make it retryable."""
    request = httpx.Request("GET", "https://api.example/x")
    conflict = httpx.HTTPStatusError(
        "409", request=request, response=httpx.Response(409, request=request)
    )
    flaky = Flaky(conflict)

    def retry_if(exc: BaseException) -> bool | None:
        response = getattr(exc, "response", None)
        return True if getattr(response, "status_code", None) == 409 else None

    decorator = retry(retry_if=retry_if, backoff=Constant(0, 0), clock=FakeClock())
    assert run_sync_or_async(kind, decorator, flaky) == "done" and flaky.calls == 2


@KINDS
def test_giving_up_is_logged_once_with_the_reason(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Attempts exhausted: two INFO retry lines, then one WARNING give-up line."""
    flaky = Flaky(*[ConnectionError("down")] * 3)
    decorator = retry(on=ConnectionError, attempts=3, backoff=Constant(0, 0), clock=FakeClock())
    with caplog.at_level(logging.INFO, logger="stormguard"), pytest.raises(RetryError):
        run_sync_or_async(kind, decorator, flaky)
    levels = [r.levelno for r in caplog.records if r.name == "stormguard"]
    assert levels == [logging.INFO, logging.INFO, logging.WARNING]
    last = caplog.records[-1]
    assert "attempts exhausted" in last.getMessage()
    assert last.stormguard["attempts"] == 3  # type: ignore[attr-defined]


def test_a_final_failure_on_the_first_attempt_is_not_a_give_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failure the table never retries, on the first attempt, logs nothing."""
    request = httpx.Request("POST", "https://api.example/pay")
    error = httpx.HTTPStatusError(
        "502", request=request, response=httpx.Response(502, request=request)
    )
    decorator = retry(clock=FakeClock())
    with caplog.at_level(logging.INFO, logger="stormguard"), pytest.raises(RetryError):
        run_sync_or_async("sync", decorator, Flaky(error))
    assert [r for r in caplog.records if r.name == "stormguard"] == []


class Results:
    """Returns the scripted values in order (the last one repeats)."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


def run_results(kind: str, decorator: Callable[[Any], Any], results: Results) -> Any:
    """Decorate ``results`` as a sync or an async function and call it once."""
    if kind == "sync":
        return decorator(lambda: results())()

    async def coroutine() -> Any:
        await asyncio.sleep(0)
        return results()

    return asyncio.run(decorator(coroutine)())


@KINDS
def test_retry_if_true_on_a_result_retries_the_call(kind: str) -> None:
    """tenacity's retry_if_result: a value retry_if says True of is retried; the
    first value it says False or None of is returned."""
    results = Results({"status": "pending"}, {"status": "pending"}, {"status": "done"})
    clock = FakeClock()

    def retry_if(value: Any) -> bool | None:
        return isinstance(value, dict) and value.get("status") == "pending"

    decorator = retry(retry_if=retry_if, backoff=Constant(1, 1), clock=clock)
    assert run_results(kind, decorator, results) == {"status": "done"}
    assert results.calls == 3 and clock.sleeps == [1.0, 1.0]


@KINDS
def test_a_result_retried_until_attempts_run_out_is_kept_in_the_error(kind: str) -> None:
    """Attempts exhausted on a value: RetryError, its last_result the last value."""
    results = Results(None)
    decorator = retry(
        retry_if=lambda value: value is None, attempts=3, backoff=Constant(0, 0), clock=FakeClock()
    )
    with pytest.raises(RetryError) as info:
        run_results(kind, decorator, results)
    assert info.value.reason == GiveUpReason.ATTEMPTS_EXHAUSTED
    assert results.calls == 3 and info.value.last_result is None and info.value.attempts == 3
    assert info.value.last_exception is None


@KINDS
def test_without_retry_if_a_result_is_returned_at_once(kind: str) -> None:
    """No retry_if: whatever the function returns ends the call (one call)."""
    results = Results(None, "later")
    decorator = retry(backoff=Constant(0, 0), clock=FakeClock())
    assert run_results(kind, decorator, results) is None and results.calls == 1


@KINDS
def test_retry_if_on_results_works_with_a_budget(kind: str) -> None:
    """With a budget (the engine's general lane, not the fast one) results are judged too."""
    results = Results(0, 0, 7)
    budget = stormguard.RetryBudget(clock=FakeClock())
    decorator = retry(
        retry_if=lambda value: value == 0, budget=budget, backoff=Constant(0, 0), clock=FakeClock()
    )
    assert run_results(kind, decorator, results) == 7 and results.calls == 3
