# Counts taken without a lock. A hot path appends to a list (one atomic step under
# the GIL: no count is lost between threads) and the owner, under its lock, takes
# the whole queue at once with drained(): the breaker's queued successes, the
# budget's queued deposits.
from __future__ import annotations

__all__ = ["drained"]


def drained(queue: list[int]) -> int:
    """How many counts were queued; the queue is emptied (the caller holds its lock)."""
    count = len(queue)
    if count:
        del queue[:count]  # appends made meanwhile stay for the next time
    return count
