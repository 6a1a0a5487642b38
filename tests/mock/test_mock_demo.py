"""`stormguard demo`: naive vs stormguard client, figures from the mock's records."""

from __future__ import annotations

import io
import threading

import httpx
from click.testing import CliRunner
from rich.console import Console

from stormguard.mock import MockServer
from stormguard.mock._demo import (
    PATH,
    _peak_rate,
    demo_command,
    demo_scenario,
    measure,
    render,
    run_demo,
)


def test_demo_naive_double_charges_and_stormguard_does_not() -> None:
    """On a small workload the naive client double-charges; stormguard's never does."""
    before = threading.active_count()
    console = Console(file=io.StringIO(), width=100)
    naive, guarded = run_demo(payments=40, clients=8, seed=3, console=console)
    assert naive.double_charges >= 1
    assert naive.charges > naive.payments
    assert guarded.double_charges == 0
    assert guarded.charges == guarded.succeeded == 40
    assert sum(guarded.violations.values()) == 0
    assert naive.violations.get("unsafe-retry", 0) >= 1
    assert threading.active_count() == before
    render([naive, guarded], console)
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert "double charges" in output
    assert "stormguard client" in output


def test_measure_reads_only_the_journal_and_ledger() -> None:
    """Figures come from journal entries and the ledger: charges, doubles, successes."""
    journal = [
        {
            "id": 1,
            "time": 10.0,
            "end": 10.1,
            "status": None,
            "outcome": "commit-then-reset",
            "side_effect": "request-1",
            "body_sha256": "a",
            "method": "POST",
            "path": "/p",
            "client": "c",
            "idempotency_key": None,
            "retry_after": None,
        },
        {
            "id": 2,
            "time": 10.2,
            "end": 10.3,
            "status": 201,
            "outcome": "ok",
            "side_effect": "request-2",
            "body_sha256": "a",
            "method": "POST",
            "path": "/p",
            "client": "c",
            "idempotency_key": None,
            "retry_after": None,
        },
        {
            "id": 3,
            "time": 12.0,
            "end": 12.5,
            "status": 201,
            "outcome": "ok",
            "side_effect": "request-3",
            "body_sha256": "b",
            "method": "POST",
            "path": "/p",
            "client": "c",
            "idempotency_key": None,
            "retry_after": None,
        },
    ]
    ledger = {"payments": {"request-1": 1, "request-2": 1, "request-3": 1}}
    result = measure("x", 2, journal, ledger)
    assert (result.requests, result.charges, result.double_charges) == (3, 3, 1)
    assert result.succeeded == 2
    assert result.seconds == 2.5
    assert result.peak_rate == 2


def test_peak_rate_counts_arrivals_within_one_second() -> None:
    """The peak is the most arrivals inside any one-second window."""
    assert _peak_rate([0.0, 0.5, 0.99, 1.0, 1.2, 5.0]) == 4
    assert _peak_rate([]) == 0


def test_demo_command_prints_the_table() -> None:
    """The click command runs end to end and prints the side-by-side table."""
    result = CliRunner().invoke(demo_command, ["--payments", "12", "--clients", "4"])
    assert result.exit_code == 0, result.output
    assert "requests received" in result.output
    assert "time to finish" in result.output


def test_demo_can_refuse_github_style() -> None:
    """`--limit-style github`: past the limit the demo API answers GitHub's primary 403."""
    scenario = demo_scenario(3, rate_limit=1, limit_style="github")
    scenario["routes"][0]["sequence"] = [{"status": 201}]
    with MockServer(scenario) as mock, httpx.Client(base_url=mock.url) as client:
        codes = [client.post(PATH, json={"n": n}) for n in range(2)]
    assert [r.status_code for r in codes] == [201, 403]
    assert codes[1].headers["x-ratelimit-remaining"] == "0"
    assert "retry-after" not in codes[1].headers


def test_demo_command_offers_the_limit_styles() -> None:
    """The demo's help names both refusal styles."""
    result = CliRunner().invoke(demo_command, ["--help"])
    assert "--limit-style [github|stripe]" in result.output


def test_demo_github_style_stormguard_waits_for_the_reset() -> None:
    """Against GitHub-style 403s, stormguard's client waits for the reset and pays everything."""
    console = Console(file=io.StringIO(), width=100)
    _, guarded = run_demo(
        payments=24, clients=6, seed=3, rate_limit=12, limit_style="github", console=console
    )
    assert guarded.succeeded == 24
    assert guarded.double_charges == 0
    assert sum(guarded.violations.values()) == 0
