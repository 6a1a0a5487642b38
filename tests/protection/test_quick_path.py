"""The lock-free first attempt (protection/_quick.py): the same protection as the general path."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from protection_support import run_threads

from net_support import POLL_INTERVAL
from stormguard import CircuitOpen, RetryPolicy
from stormguard.client import _front
from stormguard.client._front import _General
from stormguard.httpx import RetryTransport
from stormguard.protection import Bulkhead, OriginGuards, RetryBudget, _tally
from stormguard.protection._quick import QuickGuard
from stormguard.testing import FakeClock

ORIGIN = "http://api.test"
ONE_ATTEMPT = RetryPolicy(attempts=1, deadline=None)


def _transport(answer: Any, clock: FakeClock | None = None, **kwargs: Any) -> RetryTransport:
    clock = clock or FakeClock()
    guards = kwargs.pop("guards", None) or OriginGuards(clock=clock, **kwargs.pop("parts", {}))
    policy = kwargs.pop("policy", ONE_ATTEMPT)
    return RetryTransport(
        httpx.MockTransport(answer), policy=policy, guards=guards, clock=clock, **kwargs
    )


def _statuses(*statuses: int) -> Any:
    queue = list(statuses)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(queue.pop(0) if len(queue) > 1 else queue[0])

    return answer


def _lane(transport: RetryTransport) -> Any:
    return transport.lane_of(ORIGIN, httpx.URL(ORIGIN), str)


def _gate(transport: RetryTransport) -> Any:
    return transport.lane_of(ORIGIN, httpx.URL(ORIGIN), str).gate


def test_default_parts_on_one_clock_get_the_lock_free_gate() -> None:
    """Every part local and on the transport's clock: the lane's gate is a QuickGuard."""
    assert isinstance(_gate(_transport(_statuses(200))), QuickGuard)


def test_parts_on_another_clock_take_the_general_path() -> None:
    """Guards on another clock than the transport's: the general path, same answers."""
    guards = OriginGuards(clock=FakeClock(), breaker={"min_calls": 2}, budget=False)
    transport = RetryTransport(
        httpx.MockTransport(_statuses(500)), policy=ONE_ATTEMPT, guards=guards
    )
    assert isinstance(_gate(transport), _General)
    with httpx.Client(transport=transport) as client:
        assert client.get(ORIGIN).status_code == 500
        assert client.get(ORIGIN).status_code == 500
        with pytest.raises(CircuitOpen):
            client.get(ORIGIN)


def test_the_breaker_counts_every_lock_free_success() -> None:
    """30 successes then 5xx: the breaker opens at the 30th failure (50 % of 60), not before."""
    parts = {"breaker": {"min_calls": 10, "failure_rate": 0.5}, "budget": False}
    transport = _transport(_statuses(*[200] * 30, 500), parts=parts)
    with httpx.Client(transport=transport) as client:
        for _ in range(30):
            assert client.get(ORIGIN).status_code == 200
        for _ in range(30):
            assert client.get(ORIGIN).status_code == 500
        with pytest.raises(CircuitOpen):
            client.get(ORIGIN)


def test_lock_free_successes_from_threads_are_all_counted() -> None:
    """8 threads x 200 successes: all 1,600 land in the breaker's window."""
    parts = {"breaker": {"min_calls": 10}, "budget": False, "bulkhead": {"limit": 4}}
    guards = OriginGuards(**parts)  # type: ignore[arg-type]
    transport = RetryTransport(httpx.MockTransport(_statuses(200)), guards=guards)

    def many(_: int) -> None:
        with httpx.Client(transport=transport) as client:
            for _ in range(200):
                client.get(ORIGIN)

    run_threads(many, 8, timeout=60)
    breaker = guards.get(ORIGIN).breaker
    assert breaker is not None and breaker.local_state() == "closed"  # drains the queue
    assert breaker._core._ring is not None and breaker._core._ring.a_total == 1600
    assert guards.get(ORIGIN).bulkhead.in_flight == 0  # type: ignore[union-attr]


def test_deposits_on_the_lock_free_path_earn_retries() -> None:
    """ratio 0.5, no reserve: 4 successes and the failing request's own deposit earn 2 retries."""
    sent: list[int] = []
    answers = _statuses(200, 200, 200, 200, 503)

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(1)
        return answers(request)  # type: ignore[no-any-return]

    parts = {"breaker": False, "budget": {"ratio": 0.5, "min_per_second": 0}}
    policy = RetryPolicy(attempts=6, deadline=None)
    transport = _transport(answer, parts=parts, policy=policy)
    with httpx.Client(transport=transport) as client:
        for _ in range(4):
            assert client.get(ORIGIN).status_code == 200
        assert client.get(ORIGIN).status_code == 503
    assert len(sent) == 4 + 3  # the first attempt and two retries; then the budget is spent


def test_the_bulkhead_limit_holds_on_the_lock_free_path() -> None:
    """6 threads through a bulkhead of 2: at most 2 requests inside the inner transport."""
    inside = peak = 0
    lock = threading.Lock()
    release = threading.Event()

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal inside, peak
        with lock:
            inside += 1
            peak = max(peak, inside)
        release.wait(10)
        with lock:
            inside -= 1
        return httpx.Response(200)

    parts = {"bulkhead": {"limit": 2, "max_wait": 30.0}}
    guards = OriginGuards(**parts)  # type: ignore[arg-type]
    transport = RetryTransport(httpx.MockTransport(answer), guards=guards)
    statuses: list[int] = []

    def get() -> None:
        with httpx.Client(transport=transport) as client:
            statuses.append(client.get(ORIGIN).status_code)

    threads = [threading.Thread(target=get) for _ in range(6)]
    for thread in threads:
        thread.start()
    bulkhead = guards.get(ORIGIN).bulkhead
    assert bulkhead is not None
    deadline = time.monotonic() + 10
    while bulkhead.waiting < 4 and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
    assert bulkhead.in_flight == 2 and bulkhead.waiting == 4
    release.set()
    for thread in threads:
        thread.join(30)
    assert statuses == [200] * 6 and peak == 2 and bulkhead.in_flight == 0


async def test_a_cancelled_lock_free_attempt_gives_its_slot_back() -> None:
    """A task cancelled while its request is inside: the bulkhead slot is free again."""
    entered = asyncio.Event()

    async def answer(request: httpx.Request) -> httpx.Response:
        entered.set()
        await asyncio.sleep(3600)
        return httpx.Response(200)

    guards = OriginGuards()
    transport = RetryTransport(httpx.MockTransport(answer), guards=guards)
    async with httpx.AsyncClient(transport=transport) as client:
        task = asyncio.create_task(client.get(ORIGIN))
        await entered.wait()
        bulkhead = guards.get(ORIGIN).bulkhead
        assert bulkhead is not None and bulkhead.in_flight == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert bulkhead.in_flight == 0


def test_a_pause_sends_the_next_request_down_the_general_path() -> None:
    """A 429 with Retry-After pauses the origin: the next request waits (on the fake clock)."""
    clock = FakeClock()
    answers = [httpx.Response(429, headers={"retry-after": "2"}), httpx.Response(200)]

    def answer(request: httpx.Request) -> httpx.Response:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    transport = _transport(answer, clock, policy=RetryPolicy(attempts=1, deadline=30.0))
    with httpx.Client(transport=transport) as client:
        assert client.get(ORIGIN).status_code == 429
        assert client.get(ORIGIN).status_code == 200
    assert clock.sleeps and clock.sleeps[0] >= 2.0


def test_timeouts_found_fitting_do_not_let_a_longer_one_through() -> None:
    """deadline 3 s: a 1 s timeout passes as it is; a later request without one gets 3 s."""
    seen: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.extensions["timeout"]))
        return httpx.Response(200)

    transport = _transport(answer, policy=RetryPolicy(deadline=3.0))
    with httpx.Client(transport=transport, timeout=1.0) as client:
        client.get(ORIGIN)
        client.get(ORIGIN)
        client.get(ORIGIN, timeout=None)
    assert seen[0] == seen[1] == dict.fromkeys(("connect", "read", "write", "pool"), 1.0)
    assert seen[2] == dict.fromkeys(("connect", "read", "write", "pool"), 3.0)


def test_budget_deposits_from_threads_are_all_counted() -> None:
    """8 threads x 1,000 lock-free deposits: the balance counts every one."""
    clock = FakeClock()
    budget = RetryBudget(ratio=0.5, min_per_second=0, window=10.0, clock=clock)

    def deposits(_: int) -> None:
        for _ in range(1000):
            budget.deposit(clock.monotonic())

    run_threads(deposits, 8)
    assert budget.balance() == pytest.approx(4000.0)


def test_deposits_queued_in_a_bucket_expire_with_it() -> None:
    """Deposits made lock-free leave the window with their bucket, as locked ones do."""
    clock = FakeClock()
    budget = RetryBudget(ratio=1.0, min_per_second=0, window=10.0, clock=clock)
    budget.record_request()  # opens the newest bucket
    for _ in range(5):
        budget.deposit(clock.monotonic())
    assert budget.balance() == pytest.approx(6.0)
    clock.advance(11.0)
    assert budget.balance() == pytest.approx(0.0)
    assert not budget.try_retry()


def test_try_acquire_takes_only_a_free_slot_nobody_waits_for() -> None:
    """try_acquire: True while a slot is free; False when full or when a caller is queued."""
    bulkhead = Bulkhead(1, max_wait=30.0)
    assert bulkhead.try_acquire() and not bulkhead.try_acquire()
    waiter = threading.Thread(target=bulkhead.acquire)
    waiter.start()
    deadline = time.monotonic() + 10
    while not bulkhead.waiting and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
    bulkhead.release()  # handed to the queued thread, not left for a newcomer
    waiter.join(10)
    assert not bulkhead.try_acquire() and bulkhead.in_flight == 1
    bulkhead.release()
    assert bulkhead.try_acquire()


def test_threads_mixing_lock_free_and_waiting_acquires_lose_no_slot() -> None:
    """16 threads x 500 rounds through a limit of 3: never more than 3 inside, no slot lost,
    no waiter left asleep with a free slot (each wait would then run out)."""
    bulkhead = Bulkhead(3, max_wait=20.0)
    inside = peak = 0
    lock = threading.Lock()
    failures: list[BaseException] = []

    def rounds(index: int) -> None:
        nonlocal inside, peak
        try:
            for _ in range(500):
                if index % 2 == 0:
                    bulkhead.acquire()
                elif not bulkhead.try_acquire():
                    continue
                with lock:
                    inside += 1
                    peak = max(peak, inside)
                with lock:
                    inside -= 1
                bulkhead.release()
        except BaseException as exc:  # a BulkheadFull here is a lost wake-up
            failures.append(exc)

    run_threads(rounds, 16, timeout=120)
    assert not failures
    assert peak <= 3 and bulkhead.in_flight == 0 and bulkhead.waiting == 0


class _MissesOnce(Bulkhead):
    """A bulkhead whose first lock-free look misses a slot (as if freed just after it)."""

    missed = False

    def try_acquire(self) -> bool:
        if not self.missed:
            self.missed = True
            return False
        return super().try_acquire()


def test_a_caller_that_just_missed_a_free_slot_gets_it_once_queued() -> None:
    """The free slot goes to the queue's head as the caller joins it: no wait, no refusal."""
    bulkhead = _MissesOnce(1)  # max_wait=0: a caller left queued would be refused
    bulkhead.acquire()
    assert bulkhead.in_flight == 1 and bulkhead.waiting == 0


def test_a_slow_call_breaker_judges_each_duration_through_the_gate() -> None:
    """slow_call set: the lock-free gate settles through CircuitBreaker.settle, which
    judges each duration, so successes slower than it still open the breaker."""
    clock = FakeClock()

    def slow(request: httpx.Request) -> httpx.Response:
        clock.advance(2.0)
        return httpx.Response(200)

    parts = {"breaker": {"slow_call": 1.0, "min_calls": 3}, "budget": False}
    transport = _transport(slow, clock, parts=parts)
    assert isinstance(_gate(transport), QuickGuard)
    with httpx.Client(transport=transport) as client:
        for _ in range(3):
            assert client.get(ORIGIN).status_code == 200
        with pytest.raises(CircuitOpen):
            client.get(ORIGIN)


def test_drained_counts_the_credits_taken_and_puts_them_back() -> None:
    """A batch of credits: what was taken is counted once, and the batch is full again."""
    credits = _tally.credits()
    assert len(credits) == _tally.BATCH
    for _ in range(5):
        credits.pop()
    assert _tally.drained(credits) == 5
    assert len(credits) == _tally.BATCH
    assert _tally.drained(credits) == 0


def test_a_lock_free_lane_tells_the_registry_when_its_batch_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The inline gate marks its origin recently used when it counts its budget's
    batch (every 2 deposits here), not on the requests in between."""
    monkeypatch.setattr(_tally, "BATCH", 2)
    transport = _transport(_statuses(200), policy=RetryPolicy())
    guards = transport.guards
    with httpx.Client(transport=transport) as client:
        client.get(ORIGIN)  # the lane is made, the budget's first bucket opened
        assert isinstance(_lane(transport).quick, QuickGuard)
        guards.get("http://old.test")
        client.get(ORIGIN)
        client.get(ORIGIN)  # the batch's last credit: nothing told yet
        assert list(guards.origins()) == [ORIGIN, "http://old.test"]
        client.get(ORIGIN)  # the batch is spent: counted, and the registry told
        assert list(guards.origins()) == ["http://old.test", ORIGIN]


def test_a_lane_without_the_lock_free_gate_tells_the_registry_every_so_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gate missing a part (no budget): the lane itself counts its requests."""
    monkeypatch.setattr(_front, "_TOUCH_EVERY", 4)
    transport = _transport(_statuses(200), parts={"budget": False}, policy=RetryPolicy())
    guards = transport.guards
    with httpx.Client(transport=transport) as client:
        client.get(ORIGIN)  # the lane is made
        assert _lane(transport).quick is None
        guards.get("http://old.test")
        client.get(ORIGIN)  # its third request (from the one that made it) tells
        assert list(guards.origins()) == [ORIGIN, "http://old.test"]
        client.get(ORIGIN)
        assert list(guards.origins()) == ["http://old.test", ORIGIN]


def test_touch_marks_a_known_origin_recently_used_and_creates_nothing() -> None:
    guards = OriginGuards()
    guards.get("http://a.test")
    guards.get("http://b.test")
    guards.touch("http://a.test")
    guards.touch("http://unknown.test")
    assert list(guards.origins()) == ["http://b.test", "http://a.test"]
