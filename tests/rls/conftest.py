"""Rate-limit service fixtures: service processes started per test or per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rls_process import Service, ServiceFactory, factory


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[ServiceFactory]:
    """Start services from config texts (one domain each); all stopped after the test."""
    started: list[Service] = []
    yield factory(tmp_path, started)
    for service in started:
        service.stop()


@pytest.fixture(scope="module")
def module_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceFactory]:
    """:func:`service_factory` whose services live for the whole test module."""
    started: list[Service] = []
    yield factory(tmp_path_factory.mktemp("rls"), started)
    for service in started:
        service.stop()
