"""A gateway served inside the test's own event loop, on a clock the test drives.

``open_gateway`` (the function the gateway process serves with) opens the same
listeners here, on free loopback ports, with ``clock=``: the runtime's one clock for
its limits, breakers, bulkheads, budgets, ejections and shaping waits. The tests talk
to it over real sockets (``httpx.AsyncClient``) and move time with
``clock.advance()`` instead of sleeping through a cooldown or a window.

:class:`StepClock` is a :class:`~stormguard.testing.FakeClock` whose ``asleep``
waits until the test advances past its end, so concurrent waits (three shaped
requests held at once) overlap as they do on a real clock instead of adding up.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import yaml

from net_support import free_port
from stormguard.gateway._config import parse_config
from stormguard.gateway._serve import OpenGateway, open_gateway
from stormguard.testing import FakeClock

__all__ = ["LocalGateway", "StepClock", "start_local_gateway", "until"]


class StepClock(FakeClock):
    """A FakeClock whose ``asleep(s)`` returns once :meth:`advance` has moved the
    clock ``s`` seconds past the call (every wait is still recorded in ``sleeps``)."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(start)
        self._waiting: list[tuple[float, asyncio.Future[None]]] = []

    @property
    def sleepers(self) -> int:
        """Waits in progress."""
        return len(self._waiting)

    def advance(self, seconds: float) -> None:
        super().advance(seconds)
        now = self.monotonic()
        due = [fut for end, fut in self._waiting if end <= now]
        self._waiting = [(end, fut) for end, fut in self._waiting if end > now]
        for fut in due:
            if not fut.done():
                fut.set_result(None)

    async def asleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut = asyncio.get_running_loop().create_future()
        entry = (self.monotonic() + seconds, fut)
        self._waiting.append(entry)
        try:
            await fut
        finally:
            if entry in self._waiting:
                self._waiting.remove(entry)


async def until(condition: Callable[[], Any], *, within: float = 10.0) -> None:
    """Poll ``condition`` on the real clock (something real, a socket or a process,
    has to happen first) until it holds; fail after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not reached within {within} s: {condition}")
        await asyncio.sleep(0.01)


@dataclass
class LocalGateway:
    """An open in-process gateway, its ports and its clock."""

    opened: OpenGateway
    clock: FakeClock
    http_port: int
    admin_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def runtime(self) -> Any:
        return self.opened.gateway.runtime

    async def status(self) -> dict[str, Any]:
        """The admin listener's /status, with the gauges refreshed first (the gateway
        refreshes them every 0.25 s on its own)."""
        gateway = self.opened.gateway
        gateway.metrics.flush()
        await gateway.runtime.refresh_gauges()
        async with httpx.AsyncClient() as client:
            r = await client.get(f"http://127.0.0.1:{self.admin_port}/status")
        return json.loads(r.content)  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        await self.opened.drain(0.5)
        await self.opened.close()


async def start_local_gateway(config: dict[str, Any], clock: FakeClock) -> LocalGateway:
    """Open the gateway of ``config`` (a config dict; ``listen`` is filled in) in this
    event loop on ``clock``."""
    for tries_left in reversed(range(3)):
        http_port, admin_port = free_port(), free_port()
        full = {
            "listen": {"http": f"127.0.0.1:{http_port}", "admin": f"127.0.0.1:{admin_port}"},
            "access_log": False,
            **config,
        }
        parsed = parse_config(yaml.safe_dump(full), "gateway.yaml")
        try:
            opened = await open_gateway(parsed, clock=clock)
        except OSError:  # another process took a "free" port between probe and bind
            if not tries_left:
                raise
            continue
        return LocalGateway(opened, clock, http_port, admin_port)
    raise AssertionError("unreachable")
