"""Bulkhead: a concurrency limit for threads and tasks with a bounded wait."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stormguard import BulkheadFull, ConfigError
from stormguard.protection import Bulkhead


def test_limit_then_full_without_waiting() -> None:
    """With max_wait=0 the (limit+1)-th caller is refused at once."""
    bulkhead = Bulkhead(2)
    bulkhead.acquire()
    bulkhead.acquire()
    with pytest.raises(BulkheadFull) as info:
        bulkhead.acquire()
    assert info.value.limit == 2
    bulkhead.release()
    bulkhead.acquire()
    assert bulkhead.in_flight == 2


def test_waiter_gets_the_released_slot() -> None:
    """A waiting thread takes the slot as soon as it is released."""
    bulkhead = Bulkhead(1, max_wait=10.0)
    bulkhead.acquire()
    got = threading.Event()

    def waiter() -> None:
        with bulkhead:
            got.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert not got.wait(0.05)
    bulkhead.release()
    thread.join(10)
    assert got.is_set()
    assert bulkhead.in_flight == 0


def test_wait_is_bounded() -> None:
    """No slot within max_wait raises BulkheadFull with the time waited."""
    bulkhead = Bulkhead(1, max_wait=0.05)
    bulkhead.acquire()
    with pytest.raises(BulkheadFull) as info:
        bulkhead.acquire()
    assert info.value.waited >= 0.04


def test_threads_never_exceed_limit() -> None:
    """32 threads through a limit of 4: at most 4 inside at once, all served."""
    bulkhead = Bulkhead(4, max_wait=30.0)
    inside = peak = served = 0
    lock = threading.Lock()
    barrier = threading.Barrier(4, timeout=10)

    def body() -> None:
        nonlocal inside, peak, served
        with lock:
            inside += 1
            peak = max(peak, inside)
        barrier.wait()  # 4 at once really are inside together
        with lock:
            inside -= 1
            served += 1

    threads = [threading.Thread(target=bulkhead.call, args=(body,)) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert peak == 4
    assert served == 32


async def test_tasks_never_exceed_limit() -> None:
    """100 tasks through a limit of 5 (decorator form): at most 5 at once."""
    bulkhead = Bulkhead(5, max_wait=30.0)
    inside = peak = 0

    @bulkhead
    async def body() -> None:
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        await asyncio.sleep(0)  # let the others in, if the bulkhead allowed it
        inside -= 1

    await asyncio.gather(*(body() for _ in range(100)))
    assert peak == 5
    assert bulkhead.in_flight == 0


async def test_async_full_without_waiting() -> None:
    """async with refuses at once with max_wait=0 (waits on the clock: test_protection_seams)."""
    now = Bulkhead(1)
    async with now:
        with pytest.raises(BulkheadFull):
            await now.aacquire()


async def test_async_slot_taken_without_looking_up_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A free slot is taken without asyncio.get_running_loop() (a getpid() syscall on
    Python 3.11); only a caller that must queue looks the loop up."""
    from stormguard.protection import _bulkhead

    looked: list[object] = []
    real = asyncio.get_running_loop

    def counting() -> asyncio.AbstractEventLoop:
        looked.append(None)
        return real()

    monkeypatch.setattr(_bulkhead.asyncio, "get_running_loop", counting)
    bulkhead = Bulkhead(1, max_wait=30.0)
    await bulkhead.aacquire()
    assert looked == []
    waiting = asyncio.ensure_future(bulkhead.aacquire())
    await asyncio.sleep(0)
    assert len(looked) == 1 and not waiting.done()  # queued on this loop
    bulkhead.release()
    await waiting
    bulkhead.release()
    assert bulkhead.in_flight == 0


async def test_cancelled_waiter_does_not_lose_a_slot() -> None:
    """A task cancelled while waiting leaves the slots as they were."""
    bulkhead = Bulkhead(1, max_wait=30.0)
    await bulkhead.aacquire()
    task = asyncio.create_task(bulkhead.aacquire())
    await asyncio.sleep(0)  # the task runs until it waits for a slot
    assert bulkhead.waiting == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    bulkhead.release()
    assert bulkhead.in_flight == 0
    await bulkhead.aacquire()
    assert bulkhead.in_flight == 1


async def test_sync_release_wakes_async_waiter() -> None:
    """A slot released by a thread goes to a waiting task."""
    bulkhead = Bulkhead(1, max_wait=10.0)
    bulkhead.acquire()
    timer = threading.Timer(0.02, bulkhead.release)
    timer.start()
    async with bulkhead:
        assert bulkhead.in_flight == 1
    timer.join()


def test_release_without_acquire_raises() -> None:
    """Releasing more than acquired is a bug and says so."""
    with pytest.raises(RuntimeError):
        Bulkhead(1).release()


@pytest.mark.parametrize(("limit", "max_wait"), [(0, 0.0), (True, 0.0), (1, -1.0)])
def test_invalid_settings(limit: int, max_wait: float) -> None:
    """A limit under 1 or a negative wait is refused."""
    with pytest.raises(ConfigError):
        Bulkhead(limit, max_wait=max_wait)
