"""The pytest plugin's fixtures have exported types (stormguard.testing)."""

from __future__ import annotations

from stormguard.testing import MockFactory, MockServer


def test_fixture_types_are_exported_and_match_the_fixtures(stormguard_mock: MockFactory) -> None:
    """stormguard_mock is a MockFactory and the servers it starts are MockServers."""
    mock = stormguard_mock({"routes": [{"match": {"path": "/"}}]}, seed=1)
    assert isinstance(mock, MockServer) and mock.url.startswith("http://127.0.0.1:")
