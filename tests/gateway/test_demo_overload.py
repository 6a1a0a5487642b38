"""`stormguard demo overload`: an upstream of known capacity at 3x through the gateway,
without and with its overload stage (the short version of bench overload-gateway)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from stormguard.gateway._demo_overload import overload_demo_command


@pytest.mark.stress  # two gateway processes under a 3x load for ~20 s
def test_the_overload_stage_keeps_goodput_where_the_gateway_alone_loses_it() -> None:
    """Without the stage every answer comes after its deadline (goodput near zero,
    nothing refused); with it the excess is refused with 503 + Retry-After and most
    of the capacity is served in time."""
    result = CliRunner().invoke(overload_demo_command, ["--seconds", "3"])
    assert result.exit_code == 0, result.output
    found = re.search(r"(\d+) % with the overload stage, (\d+) % without", result.output)
    assert found is not None, result.output
    with_stage, without = int(found[1]), int(found[2])
    assert without < 30 and with_stage >= without + 40, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if "│" in line}
    assert rows["off"].rstrip("│ ").endswith(" 0 %")  # nothing refused without the stage
    assert not rows["on"].rstrip("│ ").endswith(" 0 %")
