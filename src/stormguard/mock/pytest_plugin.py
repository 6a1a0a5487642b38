"""pytest plugin (entry point ``stormguard``): fault-injection mocks as fixtures.

``stormguard_mock`` is a factory: call it with a scenario (a dict, or a path to a
YAML/TOML file) and get a started :class:`stormguard.mock.MockServer` on a free
loopback port, stopped when the test ends. Each test gets its own server, so
sequences, ledger and rate limits are never shared between tests::

    def test_payment_is_charged_once(stormguard_mock):
        mock = stormguard_mock("scenarios/payments.yaml")
        pay(mock.url + "/v1/payments")
        assert mock.check().ok, mock.check().summary()
        assert sum(mock.ledger()["payments"].values()) == 1

``stormguard_server`` is the same for one scenario given by a marker::

    @pytest.mark.stormguard_scenario({"routes": [{"match": {"path": "/"}}]})
    def test_root(stormguard_server): ...

A relative scenario path is looked up next to the test file first, then in the
current directory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ._server import MockServer

__all__ = ["stormguard_mock", "stormguard_server"]

MockFactory = Callable[..., "MockServer"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "stormguard_scenario(scenario, seed=None): the scenario (dict or file) that the "
        "stormguard_server fixture serves",
    )


def _server_class() -> type[MockServer]:
    """MockServer, or MissingExtra naming ``stormguard[mock]`` when h11 is missing."""
    from .._extras import require

    require("h11", "mock")
    from ._server import MockServer

    return MockServer


def _resolve(scenario: Any, test_path: Path) -> Any:
    if isinstance(scenario, str | Path) and not Path(scenario).is_absolute():
        beside = test_path.parent / scenario
        if beside.exists():
            return beside
    return scenario


@pytest.fixture
def stormguard_mock(request: pytest.FixtureRequest) -> Iterator[MockFactory]:
    """Factory: ``stormguard_mock(scenario, *, seed=None)`` -> a started MockServer."""
    # Imported here so that merely having stormguard installed never breaks a
    # pytest run that lacks the mock extra; a test that asks for the fixture on a
    # core install gets MissingExtra naming it, not h11's ModuleNotFoundError.
    server_class = _server_class()

    servers: list[MockServer] = []

    def start(scenario: Mapping[str, Any] | str | Path, *, seed: int | None = None) -> MockServer:
        server = server_class(_resolve(scenario, request.path), seed=seed)
        server.start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def stormguard_server(request: pytest.FixtureRequest, stormguard_mock: MockFactory) -> MockServer:
    """A started MockServer for the test's ``@pytest.mark.stormguard_scenario``."""
    marker = request.node.get_closest_marker("stormguard_scenario")
    if marker is None or not marker.args:
        raise pytest.UsageError(
            "stormguard_server needs @pytest.mark.stormguard_scenario(scenario)"
        )
    return stormguard_mock(marker.args[0], **marker.kwargs)
