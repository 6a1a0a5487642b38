# Clocks. The core never reads time; adapters take a Clock so tests can inject a
# fake one. `monotonic()` measures deadlines and waits; `time()` is the wall clock
# (Unix seconds) that HTTP dates and epoch resets are compared against.
from __future__ import annotations

import asyncio
import time as _time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "SystemClock", "SYSTEM_CLOCK", "monotonic_of"]


class Clock(Protocol):
    """What adapters need from time: two readings and two ways to wait."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    async def asleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    __slots__ = ()

    def monotonic(self) -> float:
        return _time.monotonic()

    def time(self) -> float:
        return _time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            _time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


SYSTEM_CLOCK = SystemClock()


def monotonic_of(clock: Clock | None) -> Callable[[], float]:
    """The monotonic reading of ``clock`` (None: the system's), without a method hop
    for the system clock (``time.monotonic`` itself)."""
    if clock is None or clock is SYSTEM_CLOCK:
        return _time.monotonic
    return clock.monotonic
