"""The HTTP adapters' success path: time each adds to a request that needs no retry.

Only the libraries are timed, never a network: every contender in a table is
handed the same prepared GET (``transport.handle_request(request)``, its async
twin, or ``adapter.send(request)``: the client's own work, identical for all,
is left out) over the same in-process base, and a figure is the time per request
minus the bare base's (µs added), best of 5 rounds of 3,000 requests, the
contenders interleaved within each round so load on the machine hits them alike.

* httpx, sync and async: the base is ``httpx.MockTransport`` answering 200 with a
  two-byte body. Bare: the mock itself. Peer: httpx-retries'
  ``RetryTransport(transport=mock, retry=Retry(total=3, backoff_factor=0.5))``.
  stormguard: ``RetryTransport(mock)`` with all protection off, then with its
  defaults (breaker, budget, bulkhead, cooldown, pacing).
* requests: the base sits *under* urllib3, so urllib3's own retry logic runs in
  every contender: ``HTTPAdapter.send`` asks for a connection pool, and the pool
  given (a real ``HTTPConnectionPool`` whose ``_make_request`` returns a canned
  ``urllib3.HTTPResponse`` instead of writing to a socket) runs ``urlopen`` as it
  would for a real request (the body is read, as a session would). Bare:
  ``HTTPAdapter()`` on that pool (requests' default, ``Retry(0, read=False)``).
  Peer: ``HTTPAdapter(max_retries=Retry(total=3,
  backoff_factor=0.5, status_forcelist=(429, 502, 503, 504)))``. stormguard:
  ``RetryAdapter`` on the same pool (it delegates each attempt to
  ``HTTPAdapter.send``), protection off, then defaults. Note what this shows: a
  ``requests`` call runs urllib3's Retry machinery whether or not the user
  configures it, so the peer's *added* cost is close to zero and within noise;
  its row is printed for completeness and stormguard's figures are also given as
  a share of the bare request. ``RetryAdapter`` also keeps the answer of
  ``HTTPAdapter.request_url`` per URL when no proxy is given (requests parses
  the URL three times there to find that none applies), which saves more than
  its protection costs; the last row puts HTTPAdapter's ``request_url`` back, so
  it shows what the protection alone adds.

Times are the thread's CPU time (``time.thread_time``), not wall time: on a shared
machine a wall clock also counts the time other processes hold the CPU. Ratios
are the figures (absolute times are noise on shared machines).
"""

from __future__ import annotations

import asyncio
import gc
import io
import time
from collections.abc import Awaitable, Callable
from typing import Any

_URL = "http://bench.invalid/items?page=1"


def _best(contenders: dict[str, Callable[[], float]], repeat: int) -> dict[str, float]:
    """Best seconds per request of each contender; contenders interleaved per round."""
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(repeat):
        for name, timed in contenders.items():
            gc.collect()
            best[name] = min(best[name], timed())
    return best


def _sync_timer(get: Callable[[], Any], number: int) -> Callable[[], float]:
    def timed() -> float:
        started = time.thread_time()
        for _ in range(number):
            get()
        return (time.thread_time() - started) / number

    return timed


def _async_timer(
    loop: asyncio.AbstractEventLoop, get: Callable[[], Awaitable[Any]], number: int
) -> Callable[[], float]:
    async def many() -> float:
        started = time.thread_time()
        for _ in range(number):
            await get()
        return (time.thread_time() - started) / number

    def timed() -> float:
        return loop.run_until_complete(many())

    return timed


_OFF: dict[str, Any] = {
    "breaker": False,
    "budget": False,
    "bulkhead": False,
    "cooldown": False,
    "pacing": False,
}


def _report(title: str, times: dict[str, float], peer: str) -> dict[str, float]:
    bare = times["bare"]
    added = {name: t - bare for name, t in times.items() if name != "bare"}
    print(f"\n{title}  (bare: {bare * 1e6:.1f} µs)")
    width = max(24, *map(len, added))
    print(f"  {'contender':<{width}} {'µs added':>9} {'vs peer':>8} {'vs bare':>8}")
    for name, value in added.items():
        versus = value / added[peer] if added[peer] > 0 else float("nan")
        print(f"  {name:<{width}} {value * 1e6:>9.2f} {versus:>7.2f}x {value / bare:>7.1%}")
    return added


def _httpx_contenders(mock: Any) -> tuple[dict[str, Any], Any]:
    """The four httpx contenders over ``mock``, and the prepared GET they are handed."""
    import httpx
    import httpx_retries

    from stormguard.httpx import RetryTransport

    transports: dict[str, Any] = {
        "bare": mock,
        "httpx-retries": httpx_retries.RetryTransport(
            transport=mock, retry=httpx_retries.Retry(total=3, backoff_factor=0.5)
        ),
        "stormguard off": RetryTransport(mock, **_OFF),
        "stormguard defaults": RetryTransport(mock),
    }
    with httpx.Client() as client:
        request = client.build_request("GET", _URL)
    return transports, request


def bench_httpx_sync(number: int, repeat: int) -> dict[str, float]:
    import httpx

    mock = httpx.MockTransport(lambda request: httpx.Response(200, content=b"ok"))
    transports, request = _httpx_contenders(mock)
    timers = {
        name: _sync_timer(lambda t=transport: t.handle_request(request), number)
        for name, transport in transports.items()
    }
    times = _best(timers, repeat)
    return _report("httpx sync, per GET", times, "httpx-retries")


def bench_httpx_async(number: int, repeat: int) -> dict[str, float]:
    import httpx

    async def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"ok")

    mock = httpx.MockTransport(answer)
    loop = asyncio.new_event_loop()
    transports, request = _httpx_contenders(mock)
    timers = {
        name: _async_timer(loop, lambda t=transport: t.handle_async_request(request), number)
        for name, transport in transports.items()
    }
    times = _best(timers, repeat)
    loop.close()
    return _report("httpx async, per GET", times, "httpx-retries")


def _canned_pool_adapters() -> dict[str, Any]:
    from requests.adapters import HTTPAdapter
    from urllib3 import HTTPConnectionPool, HTTPResponse
    from urllib3.util.retry import Retry

    from stormguard.requests import RetryAdapter

    class CannedPool(HTTPConnectionPool):
        # urlopen runs as for a real request; only the wire exchange is canned.
        def _make_request(self, conn: Any, method: str, url: str, **kw: Any) -> Any:
            return HTTPResponse(
                body=io.BytesIO(b"ok"),
                headers={"Content-Length": "2", "Content-Type": "text/plain"},
                status=200,
                preload_content=kw.get("preload_content", True),
                decode_content=kw.get("decode_content", True),
                request_method=method,
                request_url=url,
                retries=kw.get("retries"),
                connection=kw.get("response_conn"),
            )

    pool = CannedPool("bench.invalid", 80, maxsize=4)

    class OnCannedPool:
        def get_connection_with_tls_context(self, *args: Any, **kwargs: Any) -> Any:
            return pool

    class Bare(OnCannedPool, HTTPAdapter):
        pass

    class Stormguard(OnCannedPool, RetryAdapter):
        pass

    class StormguardUncached(Stormguard):
        request_url = HTTPAdapter.request_url

    peer_retry = Retry(total=3, backoff_factor=0.5, status_forcelist=(429, 502, 503, 504))
    return {
        "bare": Bare(),
        "urllib3 Retry": Bare(max_retries=peer_retry),
        "stormguard off": Stormguard(**_OFF),
        "stormguard defaults": Stormguard(),
        "stormguard defaults, HTTPAdapter's request_url": StormguardUncached(),
    }


def bench_requests(number: int, repeat: int) -> dict[str, float]:
    import requests

    adapters = _canned_pool_adapters()
    request = requests.Request("GET", _URL).prepare()
    for adapter in adapters.values():
        assert adapter.send(request, timeout=10).content == b"ok"
    timers = {
        name: _sync_timer(lambda a=adapter: a.send(request, timeout=10).content, number)
        for name, adapter in adapters.items()
    }
    times = _best(timers, repeat)
    for adapter in adapters.values():
        adapter.close()
    return _report(
        "requests, per GET (HTTPAdapter.send on a urllib3 pool with a canned exchange)",
        times,
        "urllib3 Retry",
    )


def main(quick: bool = False) -> None:
    # Issue 17's measure: best of 5 rounds of 3,000 GETs, contenders interleaved.
    number, repeat = (100, 3) if quick else (3000, 5)
    bench_httpx_sync(number, repeat)
    bench_httpx_async(number, repeat)
    bench_requests(number, repeat)


if __name__ == "__main__":
    main()
