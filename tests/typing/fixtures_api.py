"""Typing checks of a user's test file using the pytest plugin's fixtures: checked by
mypy --strict (make types), never run. No `type: ignore` anywhere."""

from __future__ import annotations

import pytest

from stormguard.mock import Report
from stormguard.testing import FakeClock, MockFactory, MockServer


def test_payment_is_charged_once(stormguard_mock: MockFactory) -> None:
    mock: MockServer = stormguard_mock({"routes": [{"match": {"path": "/"}}]}, seed=1)
    from_file: MockServer = stormguard_mock("scenarios/payments.yaml")
    url: str = mock.url + from_file.url
    report: Report = mock.check()
    assert report.ok and url


@pytest.mark.stormguard_scenario({"routes": [{"match": {"path": "/"}}]})
def test_root(stormguard_server: MockServer) -> None:
    ledger: dict[str, dict[str, int]] = stormguard_server.ledger()
    assert ledger is not None


def test_fake_clock(clock: FakeClock) -> None:
    clock.advance(1.5)
    assert clock.monotonic() == 1.5
