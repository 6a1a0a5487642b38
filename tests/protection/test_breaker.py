"""CircuitBreaker in one process: forms, state, listeners, and the flaws of other libraries."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from protection_support import run_threads

from stormguard import CircuitOpen, ConfigError
from stormguard.protection import BreakerEvent, CircuitBreaker
from stormguard.testing import FakeClock


class Boom(Exception):
    pass


def boom() -> None:
    raise Boom


def tripped(clock: FakeClock, rng: random.Random, **kwargs: Any) -> CircuitBreaker:
    settings: dict[str, Any] = {"min_calls": 1, "open_for": 5.0, "jitter": 0.0}
    settings.update(kwargs)
    breaker = CircuitBreaker(clock=clock, rng=rng, **settings)
    with pytest.raises(Boom):
        breaker.call(boom)
    assert breaker.state == "open"
    return breaker


def test_call_passes_result_and_counts_failures(clock: FakeClock, rng: random.Random) -> None:
    """call() returns the result; failures trip the breaker at the rate."""
    breaker = CircuitBreaker(min_calls=4, failure_rate=0.5, clock=clock, rng=rng)
    assert breaker.call(lambda x: x + 1, 1) == 2
    assert breaker.call(lambda: 3) == 3
    with pytest.raises(Boom):
        breaker.call(boom)
    assert breaker.state == "closed"
    with pytest.raises(Boom):
        breaker.call(boom)
    assert breaker.state == "open"


def test_is_failure_decides_what_counts(clock: FakeClock, rng: random.Random) -> None:
    """Exceptions that is_failure rejects do not count toward opening."""
    breaker = CircuitBreaker(
        min_calls=1, is_failure=lambda exc: not isinstance(exc, KeyError), clock=clock, rng=rng
    )
    for _ in range(5):
        with pytest.raises(KeyError):
            breaker.call({}.__getitem__, "x")
    assert breaker.state == "closed"


def test_listeners_see_every_state_change(clock: FakeClock, rng: random.Random) -> None:
    """Listeners receive closed->open->half_open->closed in order."""
    events: list[BreakerEvent] = []
    breaker = tripped(clock, rng, listeners=[events.append], name="api")
    clock.advance(5.0)
    breaker.call(lambda: None)
    assert [(e.old_state, e.new_state) for e in events] == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]
    assert {e.name for e in events} == {"api"}


def test_a_failing_listener_is_logged_not_raised(
    clock: FakeClock, rng: random.Random, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener that raises does not break the call path."""

    def bad(event: BreakerEvent) -> None:
        raise RuntimeError("listener bug")

    tripped(clock, rng, listeners=[bad])
    assert "listener" in caplog.text


def test_invalid_settings_raise_config_error() -> None:
    """Bad settings raise ConfigError naming the field."""
    with pytest.raises(ConfigError, match="failure_rate"):
        CircuitBreaker(failure_rate=2.0)
    with pytest.raises(ConfigError, match="name"):
        CircuitBreaker(store=object())


# -- every form checks the state first ---------------------------------------------


def _sync_forms(breaker: CircuitBreaker, body: Callable[[], None]) -> list[Callable[[], Any]]:
    def with_form() -> None:
        with breaker:
            body()

    def permit_form() -> None:
        permit = breaker.acquire()
        body()
        permit.record(failure=False)

    return [lambda: breaker.call(body), breaker(body), with_form, permit_form]


@pytest.mark.parametrize("form", range(4))
def test_every_sync_form_checks_state_first(
    form: int, clock: FakeClock, rng: random.Random
) -> None:
    """call, decorator, `with` and acquire all refuse before running the body when open."""
    breaker = tripped(clock, rng)
    ran: list[int] = []
    with pytest.raises(CircuitOpen):
        _sync_forms(breaker, lambda: ran.append(1))[form]()
    assert ran == []


@pytest.mark.parametrize("form", range(4))
async def test_every_async_form_checks_state_first(
    form: int, clock: FakeClock, rng: random.Random
) -> None:
    """acall, async decorator, `async with` and aacquire refuse before the body runs."""
    breaker = tripped(clock, rng)
    ran: list[int] = []

    async def body() -> None:
        ran.append(1)

    async def with_form() -> None:
        async with breaker:
            await body()

    async def permit_form() -> None:
        permit = await breaker.aacquire()
        await body()
        await permit.arecord(failure=False)

    forms = [lambda: breaker.acall(body), breaker(body), with_form, permit_form]
    with pytest.raises(CircuitOpen):
        await forms[form]()
    assert ran == []


def test_context_manager_records_outcomes(clock: FakeClock, rng: random.Random) -> None:
    """`with breaker:` counts an exception leaving the block as a failure."""
    breaker = CircuitBreaker(min_calls=2, clock=clock, rng=rng)
    for _ in range(2):
        with pytest.raises(Boom), breaker:
            raise Boom
    assert breaker.state == "open"


def test_nested_context_managers_on_two_breakers(clock: FakeClock, rng: random.Random) -> None:
    """Nested `with` blocks on different breakers each record their own permit."""
    outer = CircuitBreaker(min_calls=1, clock=clock, rng=rng)
    inner = CircuitBreaker(min_calls=1, clock=clock, rng=rng)

    def scenario() -> None:
        with outer:
            with inner:
                pass
            raise Boom

    with pytest.raises(Boom):
        scenario()
    assert inner.state == "closed"
    assert outer.state == "open"


# -- known flaws of other libraries ---------------------------------------------------


async def test_flaw_async_decorator_protects_the_coroutine(
    clock: FakeClock, rng: random.Random
) -> None:
    """pybreaker flaw: a decorated async function is protected, failures of its body count."""
    breaker = CircuitBreaker(min_calls=2, clock=clock, rng=rng)
    calls: list[int] = []

    @breaker
    async def fetch() -> None:
        calls.append(1)
        await asyncio.sleep(0)
        raise Boom

    for _ in range(2):
        with pytest.raises(Boom):
            await fetch()
    assert breaker.state == "open"
    with pytest.raises(CircuitOpen):
        await fetch()
    assert len(calls) == 2


def test_flaw_sync_call_of_a_coroutine_is_refused_loudly(
    clock: FakeClock, rng: random.Random
) -> None:
    """An async function through the sync form raises TypeError instead of passing silently."""
    breaker = CircuitBreaker(clock=clock, rng=rng)

    async def fetch() -> None:
        raise Boom

    with pytest.raises(TypeError, match="acall"):
        breaker.call(fetch)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_flaw_context_manager_checks_state(
    kind: str, clock: FakeClock, rng: random.Random
) -> None:
    """circuitbreaker flaw: the context-manager form must refuse when open."""
    breaker = CircuitBreaker(clock=clock, rng=rng)
    breaker.force_open()
    entered = False

    async def scenario() -> None:
        nonlocal entered
        if kind == "sync":
            with breaker:
                entered = True
        else:
            async with breaker:
                entered = True

    with pytest.raises(CircuitOpen):
        await scenario()
    assert not entered


def test_flaw_no_lock_held_across_the_call(clock: FakeClock, rng: random.Random) -> None:
    """pybreaker flaw: 10 calls rendezvous inside the breaker (a held lock would deadlock)."""
    breaker = CircuitBreaker(clock=clock, rng=rng)
    barrier = threading.Barrier(10, timeout=10)
    errors: list[BaseException] = []

    def worker(_: int) -> None:
        try:
            breaker.call(barrier.wait)
        except BaseException as exc:  # pragma: no cover - only on failure
            errors.append(exc)

    run_threads(worker, 10, timeout=20)
    assert errors == []
    assert not barrier.broken


def test_flaw_no_lock_held_across_the_permit_form(clock: FakeClock, rng: random.Random) -> None:
    """Between acquire() and record() no lock is held: probes rendezvous too."""
    breaker = tripped(clock, rng, half_open_probes=4)
    clock.advance(5.0)
    barrier = threading.Barrier(4, timeout=10)

    def worker() -> None:
        permit = breaker.acquire()
        barrier.wait()
        permit.record(failure=False)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not barrier.broken
    assert breaker.state == "closed"


async def test_flaw_no_lock_held_across_acall(clock: FakeClock, rng: random.Random) -> None:
    """Ten tasks rendezvous inside acall (a lock held across the await would deadlock)."""
    breaker = CircuitBreaker(clock=clock, rng=rng)
    barrier = asyncio.Barrier(10)
    async with asyncio.timeout(10):
        await asyncio.gather(*(breaker.acall(barrier.wait) for _ in range(10)))


def test_flaw_no_self_deadlock_from_callbacks(clock: FakeClock, rng: random.Random) -> None:
    """Read-then-write self-deadlock flaw: callbacks may use the breaker during a transition."""
    seen: list[str] = []
    holder: list[CircuitBreaker] = []

    def listener(event: BreakerEvent) -> None:
        seen.append(holder[0].state)  # reads the state while it changes
        holder[0].force_open() if event.new_state == "half_open" else None

    def is_failure(exc: BaseException) -> bool:
        seen.append(holder[0].state)  # reads the state while recording
        return True

    breaker = CircuitBreaker(
        min_calls=1, jitter=0.0, clock=clock, rng=rng, listeners=[listener], is_failure=is_failure
    )
    holder.append(breaker)
    done = threading.Event()

    def scenario() -> None:
        with pytest.raises(Boom):
            breaker.call(boom)
        clock.advance(5.0)
        # Admitted as the probe; the listener forces the breaker open meanwhile, so
        # the probe's success belongs to an old generation and changes nothing.
        breaker.call(lambda: None)
        done.set()

    thread = threading.Thread(target=scenario)
    thread.start()
    thread.join(10)
    assert done.is_set(), "deadlocked"
    assert breaker.state == "open"
    assert "closed" in seen


# -- half-open admission under concurrency ----------------------------------------------


@pytest.mark.parametrize("probes", [1, 3])
def test_half_open_50_threads_at_most_probes_reach_backend(
    probes: int, clock: FakeClock, rng: random.Random
) -> None:
    """circuitbreaker flaw (20 of 20 let through): of 50 threads only `probes` reach it."""
    breaker = tripped(clock, rng, half_open_probes=probes)
    clock.advance(5.0)
    reached = 0
    refused = 0
    lock = threading.Lock()
    all_refused = threading.Event()
    start = threading.Barrier(50, timeout=10)

    def backend() -> None:
        nonlocal reached
        with lock:
            reached += 1
        all_refused.wait(5)  # "takes 200 ms": busy until every other caller was answered
        raise Boom

    def caller() -> None:
        nonlocal refused
        start.wait()
        try:
            breaker.call(backend)
        except CircuitOpen:
            with lock:
                refused += 1
                if refused == 50 - probes:
                    all_refused.set()
        except Boom:
            pass

    threads = [threading.Thread(target=caller) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert reached == probes
    assert refused == 50 - probes
    assert breaker.state == "open"


async def test_half_open_50_tasks_at_most_one_reaches_backend(
    clock: FakeClock, rng: random.Random
) -> None:
    """aiobreaker/purgatory flaw (50 of 50): of 50 tasks only one probe reaches the backend."""
    breaker = tripped(clock, rng)
    clock.advance(5.0)
    reached = refused = 0
    others_refused = asyncio.Event()

    async def backend() -> None:
        nonlocal reached
        reached += 1
        await others_refused.wait()  # the probe stays in flight meanwhile
        raise Boom

    async def attempt() -> None:
        nonlocal refused
        try:
            await breaker.acall(backend)
        except CircuitOpen:
            refused += 1
            if refused == 49:
                others_refused.set()
            raise

    results = await asyncio.gather(*(attempt() for _ in range(50)), return_exceptions=True)
    assert reached == 1
    assert sum(isinstance(r, CircuitOpen) for r in results) == 49


async def test_cancelled_probe_gives_its_slot_back(clock: FakeClock, rng: random.Random) -> None:
    """A probe cancelled mid-call frees half-open for the next caller instead of wedging it."""
    breaker = tripped(clock, rng)
    clock.advance(5.0)
    started = asyncio.Event()

    async def hang() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(breaker.acall(hang))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await breaker.acall(asyncio.sleep, 0) is None
    assert breaker.state == "closed"


# -- stress ---------------------------------------------------------------------------


@pytest.mark.stress
def test_stress_32_threads_10000_calls_counts_add_up() -> None:
    """32 threads x 10,000 mixed calls: every call is accounted for, nothing deadlocks."""
    breaker = CircuitBreaker(min_calls=20, failure_rate=0.5, open_for=0.001, open_for_max=0.002)
    per_thread = 10_000
    totals = {"ok": 0, "failed": 0, "refused": 0, "ran": 0}
    lock = threading.Lock()

    def worker(seed: int) -> None:
        draw = random.Random(seed).random
        counts = {"ok": 0, "failed": 0, "refused": 0, "ran": 0}

        def backend(fail: bool) -> None:
            counts["ran"] += 1
            if fail:
                raise Boom

        for _ in range(per_thread):
            try:
                breaker.call(backend, draw() < 0.6)
                counts["ok"] += 1
            except Boom:
                counts["failed"] += 1
            except CircuitOpen:
                counts["refused"] += 1
        with lock:
            for key, value in counts.items():
                totals[key] += value

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert totals["ok"] + totals["failed"] + totals["refused"] == 32 * per_thread
    assert totals["ran"] == totals["ok"] + totals["failed"]
    assert totals["refused"] > 0
    assert totals["ok"] > 0


@pytest.mark.stress
async def test_stress_1000_tasks_counts_add_up() -> None:
    """1,000 asyncio tasks x 20 mixed calls: every call is accounted for."""
    breaker = CircuitBreaker(min_calls=20, failure_rate=0.5, open_for=0.001, open_for_max=0.002)
    totals = {"ok": 0, "failed": 0, "refused": 0, "ran": 0}

    async def backend(fail: bool) -> None:
        totals["ran"] += 1
        await asyncio.sleep(0)
        if fail:
            raise Boom

    async def worker(seed: int) -> None:
        draw = random.Random(seed).random
        for _ in range(20):
            try:
                await breaker.acall(backend, draw() < 0.6)
                totals["ok"] += 1
            except Boom:
                totals["failed"] += 1
            except CircuitOpen:
                totals["refused"] += 1
            await asyncio.sleep(0)

    async with asyncio.timeout(60):
        await asyncio.gather(*(worker(i) for i in range(1000)))
    assert totals["ok"] + totals["failed"] + totals["refused"] == 20_000
    assert totals["ran"] == totals["ok"] + totals["failed"]


def test_lock_free_successes_are_all_counted(clock: FakeClock, rng: random.Random) -> None:
    """Successes batched without the lock still count: 300 ok then 300 failures to open."""
    breaker = CircuitBreaker(min_calls=10, failure_rate=0.5, clock=clock, rng=rng)
    for _ in range(300):
        breaker.call(lambda: None)
    for _ in range(299):
        with pytest.raises(Boom):
            breaker.call(boom)
    assert breaker.state == "closed"
    with pytest.raises(Boom):
        breaker.call(boom)
    assert breaker.state == "open"


def test_permit_successes_are_counted_too(clock: FakeClock, rng: random.Random) -> None:
    """acquire()/record() successes take the same batched path and count."""
    breaker = CircuitBreaker(min_calls=4, failure_rate=0.5, clock=clock, rng=rng)
    for _ in range(3):
        breaker.acquire().record(failure=False)
    for _ in range(2):
        breaker.acquire().record(failure=True)
    assert breaker.state == "closed"  # 2 of 5
    breaker.acquire().record(failure=True)
    assert breaker.state == "open"  # 3 of 6
