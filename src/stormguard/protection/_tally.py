# Counts taken without a lock. A counter is a list of BATCH credits: a hot path
# counts one by taking a credit with list.pop() (one atomic step under the GIL:
# no count is lost between threads), and IndexError says the batch is spent. The
# owner, under its lock, counts what was taken with drained(), which puts as many
# credits back: the breaker's lock-free successes, the budget's lock-free
# deposits. (A pop and its IndexError cost less than an append and a len().)
from __future__ import annotations

__all__ = ["BATCH", "credits", "drained"]

BATCH = 256  # counts taken without the lock before the owner counts them


def credits() -> list[None]:
    """A full batch of credits."""
    return [None] * BATCH


def drained(credits: list[None]) -> int:
    """How many credits were taken; as many are put back (the caller holds its lock).

    A credit taken while this runs is left out of the count and stays taken: the
    next call counts it.
    """
    count = BATCH - len(credits)
    if count:
        credits.extend([None] * count)  # (one atomic step, as the pops are)
    return count
