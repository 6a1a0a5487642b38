"""Test helpers: a fake clock that never sleeps real time.

>>> clock = FakeClock()
>>> clock.sleep(450.0)      # returns at once
>>> clock.monotonic()
450.0
"""

from __future__ import annotations

import asyncio

__all__ = ["FakeClock"]


class FakeClock:
    """A clock for tests: ``sleep`` advances virtual time instead of waiting.

    Time never goes backwards: :meth:`advance` rejects negative steps. Every wait is
    recorded in :attr:`sleeps` so a test can assert on the exact backoff schedule.
    ``wall_offset`` maps monotonic time to Unix time for HTTP-date tests.
    """

    def __init__(self, start: float = 0.0, *, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self.wall_offset = wall_offset
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self.wall_offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time can't go backwards")
        self._now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))

    async def asleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)
