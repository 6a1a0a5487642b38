"""A blip must not become an outage; a sustained outage must still open the breaker.

Both scenarios run the httpx adapter with its default protection against a real
HTTP server on loopback. Waits run on an injected fake clock (the outage scenario
spans a minute).
"""

from __future__ import annotations

import asyncio
import heapq
import random
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest

from stormguard import CircuitOpen, RetryError
from stormguard.httpx import RetryTransport
from stormguard.testing import FakeClock


class _Flaky(BaseHTTPRequestHandler):
    """Per path: attempt 1 resets the connection, attempt 2 answers 503, then 200.

    In ``outage`` mode every request gets a 503.
    """

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # one response, one segment: no delayed-ACK stalls
    attempts: ClassVar[dict[str, int]] = {}
    outage: ClassVar[bool] = False
    hits: ClassVar[int] = 0
    lock: ClassVar[threading.Lock] = threading.Lock()

    def log_message(self, format: str, *args: object) -> None:
        """Silence the default stderr logging."""

    def do_GET(self) -> None:
        with self.lock:
            type(self).hits += 1
            seen = self.attempts[self.path] = self.attempts.get(self.path, 0) + 1
        if not self.outage and seen == 1:
            # A connection reset: RST instead of a response.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        status = 503 if self.outage or seen == 2 else 200
        body = b"down" if status == 503 else b"ok"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def finish(self) -> None:
        try:
            super().finish()
        except (OSError, ValueError):
            pass  # the socket was reset on purpose


@pytest.fixture
def flaky() -> Iterator[tuple[str, type[_Flaky]]]:
    """A loopback server playing reset -> 503 -> 200 per path (or a full outage)."""

    class Handler(_Flaky):
        attempts: ClassVar[dict[str, int]] = {}
        outage = False
        hits = 0
        lock = threading.Lock()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", Handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


async def test_blip_20_concurrent_gets_all_end_200(
    flaky: tuple[str, type[_Flaky]], clock: FakeClock
) -> None:
    """Reset, then 503, then 200 for each of 20 concurrent GETs: all 20 end 200 by default."""
    url, _ = flaky
    transport = RetryTransport(clock=clock)
    async with httpx.AsyncClient(transport=transport) as client:
        results = await asyncio.gather(
            *(client.get(f"{url}/item/{i}") for i in range(20)), return_exceptions=True
        )
    statuses = [
        r.status_code if isinstance(r, httpx.Response) else type(r).__name__ for r in results
    ]
    assert statuses == [200] * 20
    assert transport.guards.for_url(url).breaker.state == "closed"  # type: ignore[union-attr]


class VirtualTime:
    """A clock whose async sleeps wait for the test to move time on (a tiny scheduler).

    ``run(seconds, every, start)`` starts ``start()`` as a task every ``every``
    seconds of virtual time; before each step it lets every task run until it
    sleeps on this clock or ends, so the load is steady in virtual time whatever
    the real speed of the machine.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0
        self._changed = asyncio.Event()

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + 1_700_000_000.0

    def sleep(self, seconds: float) -> None:
        raise AssertionError("the async scenario never sleeps synchronously")

    async def asleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._sleepers, (self.now + max(0.0, seconds), self._seq, future))
        self._changed.set()
        await future

    async def _settle(self, tasks: set[asyncio.Task[Any]]) -> None:
        # Until every live task sleeps on this clock (HTTP round trips are real I/O).
        while True:
            tasks -= {task for task in tasks if task.done()}
            if len(self._sleepers) >= len(tasks):
                return
            self._changed.clear()
            done = asyncio.ensure_future(asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED))
            changed = asyncio.ensure_future(self._changed.wait())
            await asyncio.wait({done, changed}, return_when=asyncio.FIRST_COMPLETED)
            done.cancel()
            changed.cancel()

    async def run(self, seconds: float, every: float, start: Callable[[], Awaitable[Any]]) -> None:
        """Start ``start()`` every ``every`` virtual seconds for ``seconds``; then drain."""
        tasks: set[asyncio.Task[Any]] = set()
        starts = round(seconds / every)
        while starts or tasks:
            if starts:
                starts -= 1
                tasks.add(asyncio.ensure_future(start()))
            await self._settle(tasks)
            self.now += every
            while self._sleepers and self._sleepers[0][0] <= self.now:
                heapq.heappop(self._sleepers)[2].set_result(None)


async def _steady_load(url: str, seconds: float, **settings: Any) -> tuple[int, int]:
    """Five new GETs per virtual second against ``url``: (requests refused, requests made)."""
    clock = VirtualTime()
    transport = RetryTransport(clock=clock, rng=random.Random(5), **settings)
    refused = made = 0

    async with httpx.AsyncClient(transport=transport) as client:

        async def one() -> None:
            nonlocal refused, made
            made += 1
            try:
                await client.get(f"{url}/load/{made}")
            except (CircuitOpen, RetryError):
                refused += 1

        await clock.run(seconds, 0.2, one)
    return refused, made


async def test_sustained_outage_still_opens_the_breaker(flaky: tuple[str, type[_Flaky]]) -> None:
    """A server failing everything for 30 s under steady load sees far fewer attempts."""
    url, handler = flaky
    handler.outage = True
    refused, made = await _steady_load(url, 30.0)
    with_breaker = handler.hits
    handler.hits = 0
    await _steady_load(url, 30.0, breaker=False)
    without_breaker = handler.hits
    assert made == 150 and refused > 100
    assert with_breaker * 3 < without_breaker
