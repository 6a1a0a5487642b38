# State of the protection objects kept "in" a MemoryStore.
#
# A breaker, budget or cooldown given `store=MemoryStore()` keeps its state in
# this process, like one without a store, but every object with the same name on
# the same MemoryStore shares it, as they would share it on Redis: one contract,
# whatever the store. The state lives in a side table keyed by the store (weakly:
# it goes with the store) and by (kind, name); the first object creates it, so the
# first object's settings win, as with a breaker already in Redis.
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["memory_cell"]

T = TypeVar("T")

_CELLS: weakref.WeakKeyDictionary[object, dict[tuple[str, str], Any]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def memory_cell(store: object, kind: str, name: str, create: Callable[[], T]) -> T:
    """The state of ``(kind, name)`` on ``store``, created by ``create()`` on first use."""
    with _LOCK:
        cells = _CELLS.get(store)
        if cells is None:
            cells = _CELLS[store] = {}
        cell = cells.get((kind, name))
        if cell is None:
            cell = cells[(kind, name)] = create()
        return cell
