"""The public names of stormguard.mock are pinned."""

from __future__ import annotations

import stormguard.mock


def test_public_names() -> None:
    """stormguard.mock exports exactly its documented API, sorted."""
    assert stormguard.mock.__all__ == [
        "Checker",
        "MockServer",
        "Operation",
        "Report",
        "Scenario",
        "Violation",
        "check_journal",
        "load_scenario",
        "parse_scenario",
    ]
    for name in stormguard.mock.__all__:
        assert getattr(stormguard.mock, name).__module__.startswith("stormguard.mock.")
