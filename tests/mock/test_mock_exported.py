"""The public names of stormguard.mock are pinned."""

from __future__ import annotations

import subprocess
import sys

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
        "vendor_scenario",
    ]
    for name in stormguard.mock.__all__:
        assert getattr(stormguard.mock, name).__module__.startswith("stormguard.mock.")


def test_plugin_loads_without_the_extra() -> None:
    """Without h11 the pytest plugin still imports; the server names the extra."""
    code = (
        "import sys; sys.modules['h11'] = None\n"
        "import stormguard.mock.pytest_plugin\n"
        "from stormguard.mock import check_journal\n"
        "try:\n"
        "    from stormguard.mock import MockServer\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "MissingExtra" in result.stdout
    assert "pip install 'stormguard[mock]'" in result.stdout
