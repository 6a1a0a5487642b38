"""`stormguard demo overload`: an upstream of known capacity at 3x through the gateway,
without and with its overload stage (the short version of bench overload-gateway)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from stormguard.gateway._demo_overload import overload_demo_command


@pytest.mark.stress  # two gateway processes under a 3x load for ~20 s
def test_the_overload_demo_runs_both_ways() -> None:
    """Both runs and the summary: without the stage every answer comes after its
    deadline (goodput near zero, nothing refused); with it the stage refuses with
    503 + Retry-After. (How much goodput the stage keeps depends on the machine's
    load while it runs: it is the bench's figure, not this test's.)"""
    result = CliRunner().invoke(overload_demo_command, ["--seconds", "3"])
    assert result.exit_code == 0, result.output
    found = re.search(r"(\d+) % with the overload stage, (\d+) % without", result.output)
    assert found is not None, result.output
    assert int(found[2]) < 30, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if "│" in line}
    assert rows["off"].rstrip("│ ").endswith(" 0 %")  # nothing refused without the stage
    assert not rows["on"].rstrip("│ ").endswith(" 0 %"), result.output
