"""The approximate mode's lease table spends a reservation's units oldest chunk first
(what is given back when a chunk expires depends on it), whichever way a take goes."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from stormguard import FixedWindow
from stormguard.stores._lease import LeaseTable, _Lease


def _table(chunks: list[float]) -> tuple[LeaseTable, _Lease]:
    table = LeaseTable(store=None, clock=lambda: 0.0)
    algorithm = FixedWindow(1000, 60)
    lease = _Lease(algorithm, "g", "k", 5.0)
    lease.chunks = [[units, 10.0 + i, i] for i, units in enumerate(chunks)]
    lease.units = sum(chunks)
    lease.size = 0.0  # never half spent: no reservation is asked for
    table._leases[("g", "k")] = lease
    table._next_sweep = float("inf")
    return table, lease


def _reference(chunks: list[float], cost: float) -> list[float]:
    # oldest first; a chunk left with (next to) nothing goes
    left = []
    for units in chunks:
        used = min(cost, units)
        cost -= used
        if units - used > 1e-9:
            left.append(units - used)
    return left


def test_takes_within_the_oldest_chunk_and_across_chunks() -> None:
    table, lease = _table([3.0, 5.0])
    algorithm: Any = lease.algorithm
    assert table.take(algorithm, "g", "k", 1.0, 5.0, reserve=False) is True
    assert [c[0] for c in lease.chunks] == [2.0, 5.0] and lease.units == 7.0
    assert table.take(algorithm, "g", "k", 2.0, 5.0, reserve=False) is True  # all of it
    assert [c[0] for c in lease.chunks] == [5.0] and lease.units == 5.0
    assert table.take(algorithm, "g", "k", 4.0, 5.0, reserve=False) is True
    assert [c[0] for c in lease.chunks] == [1.0] and lease.units == 1.0
    assert table.take(algorithm, "g", "k", 2.0, 5.0, reserve=False) is None  # too few held


@given(
    chunks=st.lists(st.integers(1, 8).map(float), min_size=1, max_size=5),
    costs=st.lists(st.integers(1, 6).map(float), min_size=1, max_size=12),
)
def test_every_take_spends_as_the_oldest_first_model(
    chunks: list[float], costs: list[float]
) -> None:
    table, lease = _table(chunks)
    model = list(chunks)
    for cost in costs:
        got = table.take(lease.algorithm, "g", "k", cost, 5.0, reserve=False)
        if sum(model) >= cost:
            assert got is True
            model = _reference(model, cost)
        else:
            assert got is None
        assert [c[0] for c in lease.chunks] == model
        assert abs(lease.units - sum(model)) < 1e-9
