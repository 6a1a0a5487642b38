"""The idempotency conversation as steps (sans-I/O) and its sync and async drivers."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from stormguard._errors import StoreError
from stormguard.core._idempotency import ClaimOutcome, ClaimResult
from stormguard.server._claims import MemoryClaims, claim_key
from stormguard.server._idempotency import IdempotencyGuard, Replay, Ticket, encode_response
from stormguard.server._refusal import Refusal
from stormguard.server._steps import RUN, Call, Steps, adrive, drive
from stormguard.testing import FakeClock

STORED = encode_response(201, [("X-Order", "7")], b"charged")


def keep(value: Any) -> bytes | None:
    """What a successful run keeps: one fixed stored answer."""
    return STORED


def guard_for(clock: FakeClock) -> IdempotencyGuard:
    """A guard over in-memory claims on a fake clock (lease 30 s, ttl 60 s)."""
    return IdempotencyGuard(store=MemoryClaims(clock=clock.monotonic), lease=30, ttl=60)


# --- the machine alone: effects out, answers in ------------------------------------


def finish(steps: Steps[Any], reply: Any) -> Any:
    """Send the last answer in; return what the conversation returns."""
    with pytest.raises(StopIteration) as stop:
        steps.send(reply)
    return stop.value.value


def test_claimed_call_runs_once_then_completes(clock: FakeClock) -> None:
    """CLAIMED: RUN, then complete(key, owner, stored, ttl); the run's value is returned."""
    guard = guard_for(clock)
    steps = guard.once("tenant", "k", "fp", keep)
    claim = next(steps)
    assert claim.target is guard.claims and claim.name == "claim"
    key, fp, owner, lease = claim.args
    assert (key, fp, lease) == (claim_key("tenant", "k"), "fp", 30.0)
    assert steps.send(ClaimResult(ClaimOutcome.CLAIMED)) is RUN
    assert steps.send(b"body") == Call(guard.claims, "complete", (key, owner, STORED, 60.0))
    assert finish(steps, True) == b"body"


@pytest.mark.parametrize(
    ("result", "status", "reason"),
    [
        (ClaimResult(ClaimOutcome.IN_FLIGHT, retry_after=12.0), 409, "idempotency_conflict"),
        (ClaimResult(ClaimOutcome.MISMATCH), 422, "key_reused"),
    ],
)
def test_taken_key_is_refused_without_running(
    clock: FakeClock, result: ClaimResult, status: int, reason: str
) -> None:
    """IN_FLIGHT answers 409 (Retry-After at most in_flight_retry_after), MISMATCH 422."""
    steps = guard_for(clock).once("", "k", "fp", keep)
    next(steps)
    refusal = finish(steps, result)
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.reason) == (status, reason)
    if status == 409:
        assert refusal.retry_after == 1.0


def test_done_key_replays_without_running(clock: FakeClock) -> None:
    """REPLAY: the stored status, headers and body, marked Idempotent-Replayed."""
    steps = guard_for(clock).once("", "k", "fp", keep)
    next(steps)
    replay = finish(steps, ClaimResult(ClaimOutcome.REPLAY, response=STORED))
    assert replay == Replay(201, [("X-Order", "7"), ("Idempotent-Replayed", "true")], b"charged")


def test_store_down_refuses_with_503_and_runs_nothing(clock: FakeClock) -> None:
    """A StoreError on the claim: 503 + Retry-After, nothing run."""
    steps = guard_for(clock).once("", "k", "fp", keep)
    next(steps)
    with pytest.raises(StopIteration) as stop:
        steps.throw(StoreError("down"))
    refusal = stop.value.value
    assert isinstance(refusal, Refusal) and (refusal.status, refusal.retry_after) == (503, 1.0)


def test_failing_run_releases_the_claim_and_raises(clock: FakeClock) -> None:
    """An exception from RUN: release(key, owner), then the same exception goes on."""
    guard = guard_for(clock)
    steps = guard.once("", "k", "fp", keep)
    _, _, owner, _ = next(steps).args
    assert steps.send(ClaimResult(ClaimOutcome.CLAIMED)) is RUN
    error = ValueError("handler failed")
    release = steps.throw(error)
    assert release == Call(guard.claims, "release", (claim_key("", "k"), owner))
    with pytest.raises(ValueError) as raised:
        steps.send(True)
    assert raised.value is error


def test_conversation_dropped_mid_run_keeps_the_claim(clock: FakeClock) -> None:
    """Closed at RUN (its driver went away): no more effects; the lease ends the claim."""
    steps = guard_for(clock).once("", "k", "fp", keep)
    next(steps)
    assert steps.send(ClaimResult(ClaimOutcome.CLAIMED)) is RUN
    steps.close()  # raises if the conversation tried to yield a release
    assert steps.gi_frame is None


def test_unkept_answer_releases_the_claim(clock: FakeClock) -> None:
    """``stored`` returning None (an error status): release instead of complete."""
    steps = guard_for(clock).once("", "k", "fp", lambda value: None)
    next(steps)
    steps.send(ClaimResult(ClaimOutcome.CLAIMED))
    assert steps.send(b"error").name == "release"
    assert finish(steps, True) == b"error"


@pytest.mark.parametrize("failure", ["refused", "store_error"])
def test_lost_completion_is_logged_and_the_answer_still_returned(
    clock: FakeClock, caplog: pytest.LogCaptureFixture, failure: str
) -> None:
    """A late (refused) completion or a store failure on it is logged, never raised."""
    steps = guard_for(clock).once("", "k", "fp", keep)
    next(steps)
    steps.send(ClaimResult(ClaimOutcome.CLAIMED))
    assert steps.send(b"body").name == "complete"
    with caplog.at_level(logging.WARNING, logger="stormguard"):
        if failure == "refused":
            value = finish(steps, False)
        else:
            with pytest.raises(StopIteration) as stop:
                steps.throw(StoreError("down"))
            value = stop.value.value
    assert value == b"body"
    assert "idempotency" in caplog.text


def test_finishing_a_5xx_releases(clock: FakeClock) -> None:
    """finish with a 5xx releases the claim (the retry runs again), never stores it."""
    guard = guard_for(clock)
    steps = guard.finishing(Ticket("key", "owner"), 503, STORED)
    assert next(steps) == Call(guard.claims, "release", ("key", "owner"))
    assert finish(steps, True) is None


# --- the two drivers over a real claim store ---------------------------------------

Perform = Callable[..., Awaitable[Any]]


@pytest.fixture(params=["sync", "async"])
def perform(request: pytest.FixtureRequest) -> Perform:
    """Drive a conversation with drive() or adrive(); ``run`` is a plain function."""
    if request.param == "sync":

        async def sync(steps: Steps[Any], run: Callable[[], Any] | None = None) -> Any:
            return drive(steps) if run is None else drive(steps, run)

        return sync

    async def asynchronous(steps: Steps[Any], run: Callable[[], Any] | None = None) -> Any:
        if run is None:
            return await adrive(steps)

        async def arun() -> Any:
            return run()

        return await adrive(steps, arun)

    return asynchronous


async def test_first_call_runs_and_a_retry_replays(clock: FakeClock, perform: Perform) -> None:
    """The first call claims and runs; the same key again replays without running."""
    guard, runs = guard_for(clock), []

    def run() -> bytes:
        runs.append(1)
        return b"body"

    first = await perform(guard.once("", "k", "fp", keep), run)
    again = await perform(guard.once("", "k", "fp", keep), run)
    assert first == b"body" and isinstance(again, Replay) and again.body == b"charged"
    assert runs == [1]


async def test_duplicate_while_in_flight_is_409(clock: FakeClock, perform: Perform) -> None:
    """While another request holds the key, a duplicate gets 409 (Retry-After: the
    rest of the holder's lease, at most in_flight_retry_after) and does not run."""
    claims = MemoryClaims(clock=clock.monotonic)
    guard = IdempotencyGuard(store=claims, lease=30, in_flight_retry_after=10)
    held = await perform(guard.claiming("", "k", "fp"))
    assert isinstance(held, Ticket)
    waits = []
    for seconds in (0, 27.5):
        clock.advance(seconds)
        duplicate = await perform(guard.once("", "k", "fp", keep), lambda: pytest.fail("ran"))
        assert isinstance(duplicate, Refusal) and duplicate.status == 409
        waits.append(duplicate.retry_after)
    assert waits == [10.0, 3.0]


async def test_failed_call_releases_so_the_retry_runs(clock: FakeClock, perform: Perform) -> None:
    """A run that raises lets the exception through and frees the key for the retry."""
    guard = guard_for(clock)

    def boom() -> bytes:
        raise ConnectionResetError("upstream reset")

    with pytest.raises(ConnectionResetError):
        await perform(guard.once("", "k", "fp", keep), boom)
    assert await perform(guard.once("", "k", "fp", keep), lambda: b"second") == b"second"


async def test_error_answer_releases_so_the_retry_runs(clock: FakeClock, perform: Perform) -> None:
    """An answer the front end does not keep (error status) frees the key."""
    guard = guard_for(clock)
    assert await perform(guard.once("", "k", "fp", lambda v: None), lambda: b"bad") == b"bad"
    assert await perform(guard.once("", "k", "fp", keep), lambda: b"good") == b"good"
    replay = await perform(guard.once("", "k", "fp", keep), lambda: b"third")
    assert isinstance(replay, Replay)


class _Broken:
    """A claim store whose sync and async claims both fail."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def claim(self, *args: Any) -> Any:
        raise self.error

    async def aclaim(self, *args: Any) -> Any:
        raise self.error


async def test_store_errors_are_answered_others_raise(perform: Perform) -> None:
    """A StoreError becomes a 503 Refusal; any other store exception leaves unchanged."""
    guard = IdempotencyGuard(store=MemoryClaims())
    guard.claims = _Broken(StoreError("down"))  # type: ignore[assignment]
    refusal = await perform(guard.claiming("", "k", "fp"))
    assert isinstance(refusal, Refusal) and refusal.status == 503
    error = KeyError("bug")
    guard.claims = _Broken(error)  # type: ignore[assignment]
    with pytest.raises(KeyError) as raised:
        await perform(guard.claiming("", "k", "fp"))
    assert raised.value is error


async def test_a_conversation_without_run_refuses_to_run(perform: Perform) -> None:
    """A conversation that asks to RUN when the driver was given nothing fails loudly."""

    def wants_run() -> Steps[Any]:
        return (yield RUN)

    with pytest.raises(RuntimeError, match="nothing to run"):
        await perform(wants_run())
