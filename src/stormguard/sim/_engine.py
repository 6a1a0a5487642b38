# Shared machinery of the simulator: seeding, the optional extras, and progress.
#
# Reproducibility: every independent piece of work (one occ configuration, one
# storm strategy, one budget client ...) gets its own generator seeded from
# (seed, *keys). The result is then the same whatever the order in which pieces
# run, and whatever the number of worker processes.
from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from .._extras import require

__all__ = ["Ticker", "numpy", "progress", "py_rng", "seed_words"]


def numpy() -> Any:
    """The numpy module, or MissingExtra naming ``stormguard[sim]``."""
    return require("numpy", "sim")


def seed_words(seed: int, *keys: object) -> list[int]:
    """Four 32-bit words derived from ``seed`` and ``keys`` (stable across runs)."""
    text = repr((int(seed), *(str(k) for k in keys))).encode()
    digest = hashlib.blake2b(text, digest_size=16).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]


def py_rng(seed: int, *keys: object) -> random.Random:
    """A ``random.Random`` for one piece of work, seeded from ``seed`` and ``keys``."""
    words = seed_words(seed, *keys)
    return random.Random(sum(w << (32 * i) for i, w in enumerate(words)))


class Ticker(Protocol):
    """Advances a progress display by a number of units of work."""

    def __call__(self, units: float = 1.0) -> None: ...


@contextmanager
def progress(label: str, total: float, *, enabled: bool | None = None) -> Iterator[Ticker]:
    """A rich progress bar for long runs; silent when disabled or not on a terminal."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield _noop
        return
    rich_progress = require("rich.progress", "sim")
    rich_console = require("rich.console", "sim")
    bar = rich_progress.Progress(
        rich_progress.TextColumn("[bold]{task.description}"),
        rich_progress.BarColumn(),
        rich_progress.TaskProgressColumn(),
        rich_progress.TimeElapsedColumn(),
        console=rich_console.Console(stderr=True),
        transient=False,
        # No refresh thread: the bar redraws on each tick, so the process stays
        # single-threaded and the occ sweep can fork its workers safely.
        auto_refresh=False,
    )
    with bar:
        task = bar.add_task(label, total=total)

        def tick(units: float = 1.0) -> None:
            bar.advance(task, units)
            bar.refresh()

        yield tick


def _noop(units: float = 1.0) -> None:
    return None
