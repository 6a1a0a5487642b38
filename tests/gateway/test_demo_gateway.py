"""`stormguard demo gateway`: its figures, its command line, and one short real run."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stormguard.cli import _build
from stormguard.gateway._demo import GatewayDemoResult, Phases, run_gateway_demo
from stormguard.gateway._demo_plot import timeline


def _result(arrivals: list[tuple[float, str, bool]]) -> GatewayDemoResult:
    return GatewayDemoResult("run", arrivals, outage=(2.0, 4.0))


HEALTHY = [(t / 8, "naive", True) for t in range(16)]  # 8 answers/s before the outage
DOWN = [(2.0 + t / 128, "naive", False) for t in range(256)]  # a storm while it is down


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ([(4.0 + t / 8, "stormguard", True) for t in range(8)], 0.0),
        ([(5.0 + t / 8, "stormguard", True) for t in range(8)], 1.0),
        ([(4.25, "naive", False), (5.5, "naive", True)], None),
    ],
)
def test_time_to_recover_is_half_the_healthy_rate_again(
    after: list[tuple[float, str, bool]], expected: float | None
) -> None:
    """Recovery: the first half-second after the outage with half the healthy successes."""
    assert _result(HEALTHY + DOWN + after).time_to_recover() == expected


def test_counts_come_from_the_upstreams_arrivals() -> None:
    """Totals, per client kind, during the outage, and the peak over any one second."""
    result = _result([*HEALTHY, *DOWN, (4.5, "stormguard", True)])
    assert (result.count(), result.count("naive"), result.count("stormguard")) == (273, 272, 1)
    assert result.during_outage() == 256
    assert result.peak_rate() == 128


def test_demo_group_keeps_the_client_demo_and_adds_gateway() -> None:
    """`stormguard demo` keeps its options; `stormguard demo gateway` is a subcommand."""
    runner = CliRunner()
    top = runner.invoke(_build(), ["demo", "--help"])
    assert top.exit_code == 0
    assert "--payments" in top.output and "gateway" in top.output
    sub = runner.invoke(_build(), ["demo", "gateway", "--help"])
    assert sub.exit_code == 0
    assert "--hold" in sub.output and "--png" in sub.output


@pytest.mark.slow
def test_demo_without_subcommand_still_runs_the_client_demo() -> None:
    """`stormguard demo --payments N` forwards its options to the client demo."""
    result = CliRunner().invoke(_build(), ["demo", "--payments", "4", "--clients", "2"])
    assert result.exit_code == 0, result.output
    assert "4 payments from 2 concurrent clients" in result.output
    assert "payments succeeded" in result.output


@pytest.mark.slow
def test_short_demo_run_protects_the_upstream(tmp_path: Path) -> None:
    """Through the gateway fewer requests reach the failing upstream; refusals carry Retry-After."""
    direct, guarded = run_gateway_demo(phases=Phases(warmup=1.5, outage=3.0, after=1.5))
    assert (direct.label, guarded.label) == ("without gateway", "with gateway")
    # The breaker trips once the outage's failures outweigh the warm-up's successes in
    # its 2 s window, a number of requests that shrinks with a busy machine as much as
    # the naive clients' own rate does; from then on only its probes get through. So
    # compare the outage's last second: the naive stream against a few probes.
    end = guarded.outage[1]
    assert direct.outage[1] == end
    tail = [sum(1 for t, _, _ in run.arrivals if end - 1.0 <= t < end) for run in (direct, guarded)]
    assert tail[1] * 4 < tail[0], tail
    assert guarded.refusals_with_retry_after > 0
    assert direct.refusals_with_retry_after == 0
    assert {state for _, state in guarded.breaker} >= {"closed", "open"}
    png = timeline([direct, guarded], tmp_path / "timeline.png")
    assert png.read_bytes().startswith(b"\x89PNG")
