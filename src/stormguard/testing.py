"""Test helpers: a fake clock that never sleeps real time, and the types of the
pytest plugin's fixtures.

>>> clock = FakeClock()
>>> clock.sleep(450.0)      # returns at once
>>> clock.monotonic()
450.0

Annotate the plugin's fixtures in a typed test file (``mypy --strict``)::

    from stormguard.testing import MockFactory, MockServer

    def test_charged_once(stormguard_mock: MockFactory) -> None:
        mock: MockServer = stormguard_mock("scenarios/payments.yaml", seed=1)

    def test_root(stormguard_server: MockServer) -> None: ...
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .mock._server import MockServer

__all__ = ["FakeClock", "MockFactory", "MockServer"]


class MockFactory(Protocol):
    """The type of the ``stormguard_mock`` fixture: scenario in, started server out.

    ``scenario`` is a dict or a path to a YAML/TOML scenario (relative paths are
    looked up next to the test file first); ``seed`` fixes the mock's randomness.
    """

    def __call__(
        self, scenario: Mapping[str, Any] | str | Path, *, seed: int | None = None
    ) -> MockServer: ...


def __getattr__(name: str) -> Any:
    # MockServer (the type of the ``stormguard_server`` fixture) is imported on
    # first use, so that this module never needs the mock extra.
    if name == "MockServer":
        from .mock import MockServer

        return MockServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
