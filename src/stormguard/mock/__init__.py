"""Fault-injection mock server, scenario files and the retry-contract checker.

>>> from stormguard.mock import MockServer, check_journal
>>> with MockServer("examples/payments.yaml") as mock:
...     ...  # point the client under test at mock.url
...     report = check_journal(mock.journal())
>>> report.ok

Needs the ``mock`` extra (``pip install 'stormguard[mock]'``): h11 (via httpx) for
the server, PyYAML for YAML scenarios.
"""

from __future__ import annotations

from .._extras import require

require("h11", "mock")

from ._checker import Checker, Operation, Report, Violation, check_journal  # noqa: E402
from ._scenario import Scenario, load_scenario, parse_scenario  # noqa: E402
from ._server import MockServer  # noqa: E402

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
]
