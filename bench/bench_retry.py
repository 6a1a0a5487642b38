"""Success-path overhead of retrying wrappers, as ratios against peers.

Overhead = time per call of the wrapped no-op function minus the bare call, so a
ratio of 10x means the peer adds ten times more time to each successful call.
Peers: tenacity, stamina, backoff (the 'bench' extra). Also RetryTransport
against the inner httpx transport it wraps.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any


def _per_call(fn: Callable[[], Any], number: int, repeat: int) -> float:
    """Best-of-`repeat` median-free timing: seconds per call."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - started) / number)
    return best


def _contenders() -> dict[str, Callable[[], Any]]:
    import backoff
    import stamina
    import tenacity

    import stormguard

    def noop() -> int:
        return 1

    stamina.instrumentation.set_on_retry_hooks([])
    return {
        "bare call": noop,
        "stormguard": stormguard.retry(on=Exception)(noop),
        "tenacity": tenacity.retry(
            stop=tenacity.stop_after_attempt(4),
            wait=tenacity.wait_random_exponential(multiplier=0.5, max=30),
        )(noop),
        "stamina": stamina.retry(on=Exception, attempts=4)(noop),
        "backoff": backoff.on_exception(backoff.expo, Exception, max_tries=4)(noop),
    }


def _async_contenders() -> dict[str, Callable[[], Any]]:
    import backoff
    import stamina
    import tenacity

    import stormguard

    async def noop() -> int:
        return 1

    return {
        "bare call": noop,
        "stormguard": stormguard.retry(on=Exception)(noop),
        "tenacity": tenacity.retry(stop=tenacity.stop_after_attempt(4))(noop),
        "stamina": stamina.retry(on=Exception, attempts=4)(noop),
        "backoff": backoff.on_exception(backoff.expo, Exception, max_tries=4)(noop),
    }


def _report(title: str, times: dict[str, float]) -> dict[str, float]:
    bare = times.pop("bare call")
    overhead = {name: max(t - bare, 1e-9) for name, t in times.items()}
    ours = overhead["stormguard"]
    print(f"\n{title}  (bare call {bare * 1e6:.3f} µs)")
    print(f"  {'wrapper':<12} {'overhead µs':>12} {'vs stormguard':>14}")
    for name, value in sorted(overhead.items(), key=lambda item: item[1]):
        ratio = value / ours
        print(f"  {name:<12} {value * 1e6:>12.3f} {ratio:>13.1f}x")
    return overhead


def bench_decorators(quick: bool) -> dict[str, float]:
    number, repeat = (20_000, 3) if quick else (200_000, 7)
    times = {name: _per_call(fn, number, repeat) for name, fn in _contenders().items()}
    return _report("@retry, sync, success path", times)


def bench_async_decorators(quick: bool) -> dict[str, float]:
    number, repeat = (5_000, 3) if quick else (50_000, 5)
    contenders = _async_contenders()

    async def measure(fn: Callable[[], Any]) -> float:
        best = float("inf")
        for _ in range(repeat):
            gc.collect()
            started = time.perf_counter()
            for _ in range(number):
                await fn()
            best = min(best, (time.perf_counter() - started) / number)
        return best

    async def run_all() -> dict[str, float]:
        return {name: await measure(fn) for name, fn in contenders.items()}

    return _report("@retry, async, success path", asyncio.run(run_all()))


def bench_transport(quick: bool) -> None:
    import httpx

    from stormguard.httpx import RetryTransport

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"ok")

    number, repeat = (2_000, 3) if quick else (20_000, 5)
    bare = httpx.Client(transport=httpx.MockTransport(handler))
    wrapped = httpx.Client(transport=RetryTransport(httpx.MockTransport(handler)))
    samples: dict[str, list[float]] = {"bare": [], "wrapped": []}
    for _ in range(repeat):
        samples["bare"].append(_per_call(lambda: bare.get("http://bench/x"), number, 1))
        samples["wrapped"].append(_per_call(lambda: wrapped.get("http://bench/x"), number, 1))
    t_bare, t_wrapped = min(samples["bare"]), min(samples["wrapped"])
    print("\nhttpx.Client.get through MockTransport, success path")
    print(f"  bare transport      {t_bare * 1e6:8.2f} µs/request")
    print(
        f"  RetryTransport      {t_wrapped * 1e6:8.2f} µs/request "
        f"(+{(t_wrapped - t_bare) * 1e6:.2f} µs, {t_wrapped / t_bare:.3f}x the bare request; "
        f"spread {statistics.pstdev(samples['wrapped']) * 1e6:.2f} µs)"
    )


def main(quick: bool = False) -> None:
    sync = bench_decorators(quick)
    bench_async_decorators(quick)
    bench_transport(quick)
    ours = sync["stormguard"]
    print(
        "\ntargets (sync): tenacity/stormguard >= 10x: "
        f"{sync['tenacity'] / ours:.1f}x; backoff/stormguard >= 2x: {sync['backoff'] / ours:.1f}x"
    )


if __name__ == "__main__":
    main()
