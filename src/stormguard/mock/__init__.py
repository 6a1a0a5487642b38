"""Fault-injection mock server, scenario files and the retry-contract checker.

>>> from stormguard.mock import MockServer, check_journal
>>> with MockServer("examples/payments.yaml") as mock:
...     ...  # point the client under test at mock.url
...     report = check_journal(mock.journal())
>>> report.ok

Needs the ``mock`` extra (``pip install 'stormguard[mock]'``): h11 (via httpx) for
the server, PyYAML for YAML scenarios.
"""

# The names resolve on first use, so that importing this package (as the pytest
# plugin entry point does in every pytest run) never fails without the extra; the
# first use of the server then says which extra to install.
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._checker import Checker, Operation, Report, Violation, check_journal
    from ._scenario import Scenario, load_scenario, parse_scenario, vendor_scenario
    from ._server import MockServer

__all__ = [
    "Checker",
    "MockServer",
    "Operation",
    "Report",
    "Scenario",
    "Violation",
    "check_journal",
    "load_scenario",
    "parse_scenario",
    "vendor_scenario",
]

_WHERE = {
    "Checker": "_checker",
    "MockServer": "_server",
    "Operation": "_checker",
    "Report": "_checker",
    "Scenario": "_scenario",
    "Violation": "_checker",
    "check_journal": "_checker",
    "load_scenario": "_scenario",
    "parse_scenario": "_scenario",
    "vendor_scenario": "_scenario",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'stormguard.mock' has no attribute {name!r}")
    if module == "_server":
        from .._extras import require

        require("h11", "mock")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
