"""Priority classes, ranks and the shedding line (pure; no clock but the `now` passed in)."""

from __future__ import annotations

import pytest

from stormguard import Priority
from stormguard._errors import ConfigError
from stormguard.core._priority import (
    ADMITTED,
    EVICTED,
    QUEUED,
    REFUSED,
    ClientUsage,
    ShedLine,
    rank_of,
    usage_band,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("critical", Priority.CRITICAL),
        (" Critical ", Priority.CRITICAL),
        ("CRITICAL_PLUS", Priority.CRITICAL),
        ("default", Priority.DEFAULT),
        (b"sheddable", Priority.SHEDDABLE),
        ("best-effort", Priority.SHEDDABLE),
        ("urgent", None),
        ("", None),
        (3, None),
        ("x" * 100, None),
    ],
)
def test_parse(text: object, expected: Priority | None) -> None:
    """Class names parse case-insensitively; anything else is None, never an error."""
    assert Priority.parse(text) is expected


def test_classes_are_ordered_and_named() -> None:
    """critical > default > sheddable; str() is the configuration name."""
    assert Priority.CRITICAL > Priority.DEFAULT > Priority.SHEDDABLE
    assert [str(p) for p in Priority] == ["sheddable", "default", "critical"]


def test_of_names_the_field() -> None:
    """An unknown class in configuration raises ConfigError naming the field."""
    with pytest.raises(ConfigError, match=r"routes\['/x'\]"):
        Priority.of("urgent", "routes['/x']")


def test_rank_order_is_class_then_first_attempt_then_lightness() -> None:
    """Sorted ascending (refused first): by class, then retries, then heavy clients."""
    ranks = {
        "critical retry": rank_of(Priority.CRITICAL, attempt=2),
        "default first light": rank_of(Priority.DEFAULT, 1, share=0.05),
        "default first heavy": rank_of(Priority.DEFAULT, 1, share=0.9),
        "default retry light": rank_of(Priority.DEFAULT, 3, share=0.05),
        "sheddable first": rank_of(Priority.SHEDDABLE, 1),
    }
    order = sorted(ranks, key=ranks.__getitem__)
    assert order == [
        "sheddable first",
        "default retry light",
        "default first heavy",
        "default first light",
        "critical retry",
    ]


def test_usage_decays_with_its_half_life() -> None:
    """Each request adds 1; the total halves every half-life."""
    usage = ClientUsage(half_life=10.0)
    assert usage.touch("a", 0.0) == 1.0
    assert usage.touch("a", 0.0) == 2.0
    assert usage.usage("a", 10.0) == pytest.approx(1.0)
    assert usage.touch("a", 20.0) == pytest.approx(1.5)
    assert usage.usage("b", 20.0) == 0.0


def test_usage_table_is_bounded() -> None:
    """Past max_clients the least recently seen client is forgotten."""
    usage = ClientUsage(max_clients=2)
    for client in ("a", "b", "a", "c"):
        usage.touch(client, 0.0)
    assert len(usage) == 2
    assert usage.usage("b", 0.0) == 0.0 and usage.usage("a", 0.0) == 2.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"half_life": 0}, "half_life"), ({"max_clients": 0}, "max_clients")],
)
def test_usage_validation(kwargs: dict[str, float], field: str) -> None:
    """Invalid settings fail at construction naming the field."""
    with pytest.raises(ConfigError, match=field):
        ClientUsage(**kwargs)  # type: ignore[arg-type]


def test_line_admits_while_a_slot_is_free() -> None:
    """Under the limit with nobody waiting: admitted, in flight counted."""
    line = ShedLine(max_queue=2)
    assert line.arrive("a", rank_of(1), limit=2) == (ADMITTED, None)
    assert line.arrive("b", rank_of(1), limit=2) == (ADMITTED, None)
    assert line.in_flight == 2
    assert line.arrive("c", rank_of(1), limit=2) == (QUEUED, None)


def test_grants_go_best_rank_first_then_newest() -> None:
    """Freed slots go to waiters in shedding order; among equal ranks the newest (LIFO)."""
    line = ShedLine(max_queue=10)
    line.arrive("holder", rank_of(1), limit=1)
    arrivals = [
        ("shed", rank_of(Priority.SHEDDABLE)),
        ("retry", rank_of(Priority.DEFAULT, 2)),
        ("first-1", rank_of(Priority.DEFAULT, 1)),
        ("heavy", rank_of(Priority.DEFAULT, 1, share=0.9)),
        ("critical", rank_of(Priority.CRITICAL, 2)),
        ("first-2", rank_of(Priority.DEFAULT, 1)),
    ]
    for item, rank in arrivals:
        assert line.arrive(item, rank, limit=1)[0] == QUEUED
    order = []
    for _ in arrivals:
        line.leave()
        order += line.grant(limit=1)
    assert order == ["critical", "first-2", "first-1", "heavy", "retry", "shed"]


def test_full_line_evicts_the_lowest_for_a_better_newcomer() -> None:
    """A full line: a better newcomer pushes out the lowest waiter; a worse one is refused."""
    line = ShedLine(max_queue=2)
    line.arrive("holder", rank_of(1), limit=1)
    line.arrive("retry", rank_of(Priority.DEFAULT, 2), limit=1)
    line.arrive("first", rank_of(Priority.DEFAULT, 1), limit=1)
    assert line.arrive("critical", rank_of(Priority.CRITICAL), limit=1) == (EVICTED, "retry")
    assert line.arrive("shed", rank_of(Priority.SHEDDABLE), limit=1) == (REFUSED, None)
    # an equal rank pushes out the older waiter (the oldest is shed first)
    assert line.arrive("first-2", rank_of(Priority.DEFAULT, 1), limit=1) == (EVICTED, "first")
    assert line.lowest() == rank_of(Priority.DEFAULT, 1)
    line.leave()
    assert line.grant(limit=1) == ["critical"]


def test_no_line_refuses_at_once() -> None:
    """max_queue 0: a full limit refuses every newcomer, whatever its class."""
    line = ShedLine(max_queue=0)
    line.arrive("holder", rank_of(0), limit=1)
    assert line.arrive("critical", rank_of(Priority.CRITICAL), limit=1) == (REFUSED, None)


def test_a_risen_limit_admits_waiters() -> None:
    """When the limit grows, grant() admits as many waiters as now fit."""
    line = ShedLine(max_queue=5)
    line.arrive("holder", rank_of(1), limit=1)
    for item in ("a", "b", "c"):
        line.arrive(item, rank_of(1), limit=1)
    assert line.grant(limit=3) == ["c", "b"]
    assert line.in_flight == 3 and line.waiting == 1


def test_withdraw_takes_a_waiter_out() -> None:
    """A waiter whose wait ended leaves the line; one already granted is not waiting."""
    line = ShedLine(max_queue=5)
    line.arrive("holder", rank_of(1), limit=1)
    line.arrive("a", rank_of(1), limit=1)
    line.arrive("b", rank_of(1), limit=1)
    assert line.withdraw("b") is True
    assert line.withdraw("b") is False
    line.leave()
    assert line.grant(limit=1) == ["a"]
    assert line.withdraw("a") is False


def test_leave_without_admission_is_an_error() -> None:
    """leave() more often than admissions raises instead of corrupting the count."""
    with pytest.raises(RuntimeError):
        ShedLine(max_queue=0).leave()


def test_usage_ranks_by_half_octave_bands_of_the_share() -> None:
    """Shares close together tie; shares several times apart are ordered."""
    assert rank_of(Priority.DEFAULT, 1, share=0.50) == rank_of(Priority.DEFAULT, 1, share=0.52)
    assert rank_of(Priority.DEFAULT, 1, share=0.5) < rank_of(Priority.DEFAULT, 1, share=0.1)
    assert [usage_band(s) for s in (0, 1 / 64, 0.1, 0.5, 1.0)] == [0, 2, 5, 10, 12]
    assert usage_band(-5) == 0 and usage_band(7) == 12


def test_a_lone_clients_band_stays_while_its_traffic_ramps_up() -> None:
    """One client: its share is 1 whatever its rate, so its requests keep one band."""
    usage = ClientUsage(half_life=10.0)
    bands = {usage.band("only", i * 0.01) for i in range(2000)}
    assert bands == {12}


def test_heavy_and_light_clients_get_their_share_bands() -> None:
    """Nine requests of one client for each of another's: the light one's band is that
    of share 0.1; the heavy one keeps band 12 (its share, 0.9, is within half a band
    of the 12 it had alone)."""
    usage = ClientUsage(half_life=1e9)
    for _ in range(100):
        for _ in range(9):
            heavy = usage.band("heavy", 0.0)
        light = usage.band("light", 0.0)
    assert (heavy, light) == (12, usage_band(0.1)) == (12, 5)
    assert rank_of(1, band=heavy) < rank_of(1, band=light)


def test_a_share_hovering_at_a_band_edge_keeps_its_band() -> None:
    """A client's band moves only once its share is half a band past the edge."""
    usage = ClientUsage(half_life=1e9)
    usage.band("a", 0.0)  # share 1: band 12
    seen = []
    for _ in range(30):  # "b" grows from share 1/2 to 30/31 of the total...
        seen.append(usage.band("b", 0.0))
    assert seen[0] == usage_band(0.5) == 10  # a new client takes its exact band
    assert seen[-1] == 11  # 2*log2(1 + 64*30/31) = 11.96: within half a band of 11
