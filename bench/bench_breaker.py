"""Circuit breaker and retry budget overhead, against pybreaker and circuitbreaker.

Figures:

* overhead per successful call (time through the breaker minus the bare call),
  as a ratio against pybreaker and circuitbreaker measured in the same run;
  rounds are interleaved and the best of each is kept, so a noisy neighbour
  slows every library alike;
* retry budget overhead per first attempt (``record_request``);
* wall time of 10 threads each making one 0.2 s call through a closed breaker:
  stormguard runs them side by side, a breaker that holds its lock across the
  call (pybreaker) runs them one after the other;
* a breaker shared through Redis: round trips per call (requests redis-py
  writes to its sockets: a command, a pipeline or an EVALSHA is one) and time per
  call, at the bench's full call rate, stormguard with its near cache
  (default ``staleness=0.1``), without it (``staleness=0``: admit + record per
  call), and pybreaker's ``CircuitRedisStorage``. Redis: ``REDIS_URL``, else a
  ``redis-server`` started on a free loopback port for the run.

Run: ``python -m bench breaker`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import timeit
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from stormguard.protection import CircuitBreaker, RetryBudget


def _work() -> int:
    return 1


def _best(fn: Callable[[], object], number: int) -> float:
    return timeit.timeit(fn, number=number) / number


def _overheads(number: int, rounds: int) -> dict[str, float]:
    candidates: dict[str, Callable[[], object]] = {}
    ours = CircuitBreaker()
    candidates["stormguard"] = lambda: ours.call(_work)
    permit_breaker = CircuitBreaker()

    def via_permit() -> None:
        permit_breaker.acquire().record(failure=False)

    candidates["stormguard acquire/record"] = via_permit
    budget = RetryBudget()
    candidates["stormguard budget"] = budget.record_request
    try:
        import pybreaker

        theirs = pybreaker.CircuitBreaker()
        candidates["pybreaker"] = lambda: theirs.call(_work)
    except ImportError:
        print("pybreaker not installed: pip install 'stormguard[bench]'")
    try:
        import circuitbreaker  # type: ignore[import-untyped]

        decorated = circuitbreaker.CircuitBreaker()(_work)
        candidates["circuitbreaker"] = lambda: decorated()
    except ImportError:
        print("circuitbreaker not installed: pip install 'stormguard[bench]'")
    bare: Callable[[], object] = lambda: _work()  # noqa: E731 - same call depth as the others
    best = {name: float("inf") for name in [*candidates, "bare"]}
    for _ in range(rounds):
        best["bare"] = min(best["bare"], _best(bare, number))
        for name, fn in candidates.items():
            best[name] = min(best[name], _best(fn, number))
    base = best.pop("bare")
    overhead = {name: max(t - base, 1e-9) for name, t in best.items()}
    overhead["stormguard budget"] = best["stormguard budget"]  # no wrapped call
    return overhead


def _parallel(breaker_call: Callable[[Callable[[], None]], object], threads: int) -> float:
    def slow() -> None:
        time.sleep(0.2)

    workers = [threading.Thread(target=breaker_call, args=(slow,)) for _ in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - start


@contextlib.contextmanager
def _redis() -> Iterator[str | None]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    exe = shutil.which("redis-server")
    if exe is None:
        yield None
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="stormguard-bench-redis-")
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def _counting_round_trips() -> Iterator[list[int]]:
    # Every request redis-py writes to a socket (a command, a pipeline, an EVALSHA)
    # goes through Connection.send_packed_command once: one round trip each.
    from redis.connection import Connection

    sent = [0]
    original = Connection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        sent[0] += 1
        original(self, command, check_health)

    Connection.send_packed_command = counted  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        Connection.send_packed_command = original  # type: ignore[method-assign]


def _per_call(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """(round trips per call, seconds per call) of ``calls`` calls of ``fn``."""
    with _counting_round_trips() as sent:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
    return sent[0] / calls, elapsed / calls


def _shared(url: str, calls: int) -> dict[str, tuple[float, float]]:
    import redis

    from stormguard.stores import RedisStore

    client = redis.Redis.from_url(url)
    token = uuid.uuid4().hex[:8]
    store = RedisStore(url, prefix=f"sgbench-{token}:")
    results: dict[str, tuple[float, float]] = {}
    for label, staleness in (("stormguard (near cache)", 0.1), ("stormguard staleness=0", 0.0)):
        breaker = CircuitBreaker(store=store, name=f"b{staleness}", staleness=staleness)
        breaker.call(_work)  # scripts loaded, connection open
        results[label] = _per_call(lambda b=breaker: b.call(_work), calls)
    try:
        import pybreaker

        storage = pybreaker.CircuitRedisStorage(
            pybreaker.STATE_CLOSED, client, namespace=f"sgbench-pyb-{token}"
        )
        theirs = pybreaker.CircuitBreaker(state_storage=storage)
        theirs.call(_work)
        results["pybreaker (CircuitRedisStorage)"] = _per_call(lambda: theirs.call(_work), calls)
    except ImportError:
        pass
    store.close()
    for key in client.scan_iter(f"sgbench-*{token}*"):
        client.delete(key)
    client.close()
    return results


def main(quick: bool) -> None:
    """Print overhead ratios and the parallel wall-time comparison."""
    number, rounds = (20_000, 3) if quick else (200_000, 7)
    overhead = _overheads(number, rounds)
    print(f"overhead per successful call (best of {rounds} x {number:,}):")
    for name, seconds in overhead.items():
        print(f"  {name:28s} {seconds * 1e9:8.0f} ns")
    ours = overhead["stormguard"]
    for peer in ("pybreaker", "circuitbreaker"):
        if peer in overhead:
            print(f"  {peer} / stormguard overhead: {overhead[peer] / ours:.2f}x")
    if "pybreaker" in overhead:
        budget = overhead["stormguard budget"]
        print(
            f"  pybreaker / stormguard budget.record_request: {overhead['pybreaker'] / budget:.2f}x"
        )

    _shared_report(quick)
    threads = 10
    breaker = CircuitBreaker()
    wall = _parallel(breaker.call, threads)
    print(f"\n{threads} threads x one 0.2 s call through a closed breaker:")
    print(f"  stormguard      {wall:.2f} s")
    try:
        import pybreaker
    except ImportError:
        return
    theirs = pybreaker.CircuitBreaker()
    their_wall = _parallel(theirs.call, threads)
    print(f"  pybreaker       {their_wall:.2f} s")
    print(f"  pybreaker / stormguard wall time: {their_wall / wall:.1f}x")


def _shared_report(quick: bool) -> None:
    try:
        import redis  # noqa: F401
    except ImportError:
        print("\nredis not installed: shared-breaker figures skipped")
        return
    with _redis() as url:
        if url is None:
            print("\nno REDIS_URL and no redis-server: shared-breaker figures skipped")
            return
        calls = 2_000 if quick else 20_000
        results = _shared(url, calls)
    print(f"\nbreaker shared through Redis, closed, {calls:,} calls:")
    for name, (trips, seconds) in results.items():
        print(f"  {name:34s} {trips:7.4f} round trips/call {seconds * 1e6:8.1f} us/call")
    ours_trips, ours_time = results["stormguard (near cache)"]
    theirs = results.get("pybreaker (CircuitRedisStorage)")
    if theirs is not None:
        print(f"  pybreaker / stormguard time per call: {theirs[1] / ours_time:.1f}x")
        print(f"  pybreaker round trips/call: {theirs[0]:.2f} vs stormguard {ours_trips:.4f}")
    before = results["stormguard staleness=0"]
    print(f"  staleness=0 / near cache time per call: {before[1] / ours_time:.1f}x")


if __name__ == "__main__":
    main(quick=False)
