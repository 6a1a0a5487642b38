"""Circuit breaker and retry budget overhead, against pybreaker and circuitbreaker.

Figures:

* overhead per successful call (time through the breaker minus the bare call),
  as a ratio against pybreaker and circuitbreaker measured in the same run;
  rounds are interleaved and the best of each is kept, so a noisy neighbour
  slows every library alike;
* retry budget overhead per first attempt (``record_request``);
* wall time of 10 threads each making one 0.2 s call through a closed breaker:
  stormguard runs them side by side, a breaker that holds its lock across the
  call (pybreaker) runs them one after the other.

Run: ``python -m bench breaker`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import threading
import time
import timeit
from collections.abc import Callable

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


if __name__ == "__main__":
    main(quick=False)
