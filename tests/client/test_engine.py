"""The retry conversation (core/_engine.py) and its two drivers (client/_driver.py)."""

from __future__ import annotations

import ast
import asyncio
import inspect
import random
from typing import Any

import pytest

import stormguard
from stormguard import CircuitOpen, Constant, GiveUpReason, RetryPolicy
from stormguard.core import _engine
from stormguard.core._engine import Conversation, Finish, Outcome
from stormguard.core._policy import RetryFailure
from stormguard.testing import FakeClock

RETRYABLE = RetryFailure(True, "status 503")


class Breaker:
    """A breaker stand-in: admits (or refuses) and reports how long it stays open."""

    def __init__(self, open_for: float = 0.0) -> None:
        self.open_for = open_for

    def acquire(self) -> str:
        """Not used by the pure machine."""
        return "permit"


class Budget:
    """A budget stand-in for the pure machine."""

    def record_request(self) -> None:
        """Not used by the pure machine."""

    def try_retry(self) -> bool:
        """Not used by the pure machine."""
        return True


def play(conversation: Conversation, answers: dict[str, list[Any]]) -> tuple[list[str], Finish]:
    """Run the machine, answering each effect from ``answers`` in order; list the effects."""
    steps = conversation.steps()
    effects: list[str] = []
    reply: Any = None
    while True:
        try:
            effect, _ = steps.send(reply)
        except StopIteration as stop:
            return effects, stop.value
        effects.append(effect)
        queue = answers.get(effect)
        reply = queue.pop(0) if queue else None


def conversation(**policy: Any) -> Conversation:
    """A conversation starting at 0 with a seeded RNG."""
    settings: dict[str, Any] = {"backoff": Constant(1, 1)}
    settings.update(policy)
    return Conversation(RetryPolicy(**settings), started_at=0.0, rng=random.Random(1))


def test_the_order_of_the_conversation_is_written_once() -> None:
    """count, admit, send, record, peek, spend, notify, discard, sleep — then success."""
    conv = conversation(breaker=Breaker(), budget=Budget())
    failed = Outcome(RETRYABLE, True, "503 response")
    effects, finish = play(
        conv,
        {
            "admit": ["p1", "p2"],
            "send": [(failed, 1.0), (Outcome(None, False, "200 response"), 3.0)],
            "peek": [0.0],
            "spend": [True],
        },
    )
    assert effects == [
        "count",
        "admit",
        "send",
        "record",
        "peek",
        "spend",
        "notify",
        "discard",
        "sleep",
        "admit",
        "send",
        "record",
    ]
    assert finish.give_up is None and finish.outcome is not None
    assert finish.outcome.value == "200 response" and finish.attempts == 2


def test_without_breaker_or_budget_there_is_nothing_to_ask() -> None:
    """A bare policy only sends: no count, admit, record, peek or spend."""
    effects, finish = play(conversation(), {"send": [(Outcome(None, False, 1), 0.0)]})
    assert effects == ["send"] and finish.outcome is not None and finish.outcome.value == 1


def test_refusal_of_the_first_attempt_is_the_answer() -> None:
    """The breaker refusing the first attempt ends the call with the refusal itself."""
    refusal = CircuitOpen("api", 5.0)
    effects, finish = play(conversation(breaker=Breaker()), {"admit": [refusal]})
    assert effects == ["admit"]
    assert finish.outcome is None and finish.refusal is refusal and finish.attempts == 0
    with pytest.raises(CircuitOpen):
        finish.result()


def test_refusal_of_a_retry_gives_up_with_the_last_outcome() -> None:
    """A refusal after a failed attempt ends the call: circuit open, last outcome kept."""
    failed = Outcome(RETRYABLE, True, "503 response")
    _, finish = play(
        conversation(breaker=Breaker()),
        {
            "admit": ["p1", CircuitOpen("api", 7.0)],
            "send": [(failed, 1.0)],
            "peek": [0.0],
        },
    )
    assert finish.give_up is not None and finish.give_up.reason == GiveUpReason.CIRCUIT_OPEN
    assert finish.give_up.hint == 7.0 and finish.outcome is failed and finish.attempts == 1


def test_breaker_open_past_the_wait_ends_the_call_before_sleeping() -> None:
    """PEEK says the breaker stays open longer than the wait: give up, no sleep, no spend."""
    failed = Outcome(RETRYABLE, True)
    effects, finish = play(
        conversation(breaker=Breaker(), budget=Budget()),
        {"admit": ["p1"], "send": [(failed, 1.0)], "peek": [30.0]},
    )
    assert "sleep" not in effects and "spend" not in effects
    assert finish.give_up is not None and finish.give_up.reason == GiveUpReason.CIRCUIT_OPEN


def test_spent_budget_ends_the_call() -> None:
    """SPEND answered False: the call ends with 'retry budget exhausted'."""
    failed = Outcome(RETRYABLE, True)
    effects, finish = play(
        conversation(budget=Budget()), {"send": [(failed, 1.0)], "spend": [False]}
    )
    assert effects == ["count", "send", "spend", "give up"]
    assert finish.give_up is not None and finish.give_up.reason == GiveUpReason.BUDGET_EXHAUSTED


def test_pacing_comes_before_every_attempt() -> None:
    """A paced conversation asks PACE before each attempt and sleeps a positive answer."""
    conv = Conversation(
        RetryPolicy(backoff=Constant(1, 1)), started_at=0.0, rng=random.Random(1), paced=True
    )
    failed = Outcome(RETRYABLE, True)
    effects, _ = play(conv, {"pace": [0.0, 2.0], "send": [(failed, 1.0), (Outcome(None), 4.0)]})
    assert effects == ["pace", "send", "notify", "sleep", "pace", "sleep", "send"]


def test_the_machine_has_no_io() -> None:
    """core/_engine.py imports no clock, sleep, thread, socket or asyncio module."""
    tree = ast.parse(inspect.getsource(_engine))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0
    }
    assert imported.isdisjoint({"time", "asyncio", "threading", "socket", "httpx", "redis"})


class AsyncOnlyBudget:
    """A budget whose sync forms fail, as one shared through an AsyncRedisStore does."""

    def __init__(self) -> None:
        self.requests = 0
        self.retries = 0

    def record_request(self) -> None:
        """The sync form is refused."""
        raise TypeError("sync form used from async code")

    def try_retry(self) -> bool:
        """The sync form is refused."""
        raise TypeError("sync form used from async code")

    async def arecord_request(self) -> None:
        """Count a first attempt."""
        self.requests += 1

    async def atry_retry(self) -> bool:
        """Allow every retry."""
        self.retries += 1
        return True


class AsyncOnlyBreaker:
    """A breaker whose sync forms fail; its permits likewise."""

    def __init__(self) -> None:
        self.outcomes: list[bool] = []

    def acquire(self) -> Any:
        """The sync form is refused."""
        raise TypeError("sync form used from async code")

    def open_remaining(self) -> float:
        """The sync form is refused."""
        raise TypeError("sync form used from async code")

    async def aacquire(self) -> Any:
        """A permit reporting to this breaker."""
        breaker = self

        class Permit:
            def record(self, *, failure: bool) -> None:
                raise TypeError("sync form used from async code")

            async def arecord(self, *, failure: bool) -> None:
                breaker.outcomes.append(failure)

        return Permit()

    async def aopen_remaining(self) -> float:
        """Closed."""
        return 0.0


async def test_every_async_front_end_awaits_the_async_forms() -> None:
    """Decorator and `async for` drive breaker and budget only through their async forms."""
    budget, breaker = AsyncOnlyBudget(), AsyncOnlyBreaker()
    policy = RetryPolicy(attempts=3, backoff=Constant(0, 0), budget=budget, breaker=breaker)
    calls = 0

    @stormguard.retry(on=OSError, policy=policy, clock=FakeClock())
    async def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls < 2:
            raise OSError("flaky")
        return calls

    assert await flaky() == 2
    async for attempt in stormguard.retrying(on=OSError, policy=policy, clock=FakeClock()):
        with attempt:
            calls += 1
            if calls < 4:
                raise OSError("flaky")
    assert budget.requests == 2 and budget.retries == 2
    assert breaker.outcomes == [True, False, True, False]


def test_the_sync_driver_never_awaits() -> None:
    """A sync call with the same objects uses the sync forms (and so fails loudly here)."""
    policy = RetryPolicy(budget=AsyncOnlyBudget())

    @stormguard.retry(policy=policy)
    def work() -> int:
        return 1

    with pytest.raises(TypeError, match="sync form"):
        work()
    assert not asyncio.iscoroutinefunction(work)


class RecordingBreaker:
    """A breaker stand-in whose permits say how they ended."""

    def __init__(self) -> None:
        self.ends: list[str] = []

    def acquire(self) -> Any:
        """A permit reporting to this breaker."""
        ends = self.ends

        class Permit:
            def record(self, *, failure: bool) -> None:
                ends.append("failure" if failure else "success")

            def release(self) -> None:
                ends.append("released")

        return Permit()


def test_a_permit_is_given_back_when_the_attempt_is_interrupted() -> None:
    """An attempt that raises past the front end (KeyboardInterrupt) releases its permit."""
    breaker = RecordingBreaker()

    @stormguard.retry(breaker=breaker, clock=FakeClock())
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert breaker.ends == ["released"]


def test_an_exception_not_ours_reports_a_success_to_the_breaker() -> None:
    """An exception not matched by `on` propagates, and the breaker hears no failure."""
    breaker = RecordingBreaker()

    @stormguard.retry(on=OSError, breaker=breaker, clock=FakeClock())
    def buggy() -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        buggy()
    assert breaker.ends == ["success"]
