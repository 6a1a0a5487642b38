"""The retry-contract checker on crafted journals: each violation is flagged, a
clean journal passes."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stormguard.mock import Checker, check_journal
from stormguard.mock._cli import mock_group


def entry(id: int, time: float, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": id,
        "time": time,
        "end": time + 0.01,
        "method": "POST",
        "path": "/v1/payments",
        "client": "c1",
        "idempotency_key": "k1",
        "body_sha256": "aa",
        "status": 201,
        "outcome": "ok",
        "retry_after": None,
        "side_effect": None,
    }
    base.update(fields)
    return base


def clean_journal() -> list[dict[str, Any]]:
    return [
        entry(1, 100.0, status=None, outcome="commit-then-reset", side_effect="k1"),
        entry(2, 100.4, status=503, outcome="error", retry_after=1.0),
        entry(3, 101.5, status=201, outcome="replayed"),
        entry(
            4,
            100.0,
            client="c2",
            idempotency_key=None,
            body_sha256="bb",
            status=429,
            outcome="rate-limited",
            retry_after=2.0,
        ),
        entry(
            5, 102.2, client="c2", idempotency_key=None, body_sha256="bb", side_effect="request-5"
        ),
        entry(
            6,
            103.0,
            method="GET",
            path="/v1/items",
            idempotency_key=None,
            status=503,
            outcome="error",
        ),
        entry(7, 103.3, method="GET", path="/v1/items", idempotency_key=None, status=200),
    ]


def test_clean_journal_passes() -> None:
    """Keyed retries after faults, obeyed Retry-After and a GET retry: no violation."""
    report = check_journal(clean_journal())
    assert report.ok, report.summary()
    assert report.requests == 7
    payment = next(op for op in report.operations if op.idempotency_key == "k1")
    assert len(payment.attempts) == 3
    assert payment.gaps == pytest.approx((0.39, 1.09))
    assert payment.side_effects == 1


@pytest.mark.parametrize(
    ("kind", "journal"),
    [
        (
            "early-retry",
            [
                entry(1, 100.0, status=503, outcome="error", retry_after=2.0),
                entry(2, 100.5),
            ],
        ),
        (
            "non-retryable-retried",
            [entry(1, 100.0, status=400, outcome="error"), entry(2, 101.0)],
        ),
        (
            "unsafe-retry",
            [
                entry(1, 100.0, idempotency_key=None, status=None, outcome="reset"),
                entry(2, 100.5, idempotency_key=None),
            ],
        ),
        (
            "unsafe-retry",
            [
                entry(1, 100.0, idempotency_key=None, status=504, outcome="commit-then-504"),
                entry(2, 100.5, idempotency_key=None),
            ],
        ),
        (
            "body-changed",
            [entry(1, 100.0, status=503, outcome="error"), entry(2, 101.0, body_sha256="cc")],
        ),
        (
            "key-changed",
            [
                entry(1, 100.0, status=None, outcome="empty"),
                entry(2, 101.0, idempotency_key="k2"),
            ],
        ),
        (
            "duplicate-side-effect",
            [
                entry(
                    1,
                    100.0,
                    idempotency_key=None,
                    status=None,
                    outcome="commit-then-reset",
                    side_effect="request-1",
                ),
                entry(2, 100.01, idempotency_key=None, side_effect="request-2"),
            ],
        ),
    ],
)
def test_each_violation_is_flagged(kind: str, journal: list[dict[str, Any]]) -> None:
    """Each crafted journal breaks one rule and the checker names it."""
    report = check_journal(journal)
    assert not report.ok
    assert kind in report.kinds(), report.summary()
    assert kind in report.summary()


def test_429_may_be_retried_without_a_key() -> None:
    """A 429 proves the request was not processed: retrying a keyless POST is fine."""
    journal = [
        entry(1, 100.0, idempotency_key=None, status=429, outcome="rate-limited"),
        entry(2, 100.5, idempotency_key=None),
    ]
    assert check_journal(journal).ok


def test_retry_after_tolerance() -> None:
    """An attempt within the tolerance of Retry-After is not early."""
    journal = [
        entry(1, 100.0, end=100.0, status=503, outcome="error", retry_after=1.0),
        entry(2, 100.97),
    ]
    assert check_journal(journal).ok
    assert not Checker(tolerance=0.0).check(journal).ok


def fleet(gap: Any, clients: int = 10) -> list[dict[str, Any]]:
    journal = []
    for n in range(clients):
        start = 100.0 + n * 0.001
        journal.append(
            entry(
                2 * n + 1,
                start,
                end=start,
                client=f"c{n}",
                idempotency_key=f"k{n}",
                status=503,
                outcome="error",
            )
        )
        journal.append(entry(2 * n + 2, start + gap(), client=f"c{n}", idempotency_key=f"k{n}"))
    return journal


def test_synchronized_retries_are_flagged() -> None:
    """Clients that all wait exactly one second (no jitter) retry in lockstep."""
    report = check_journal(fleet(lambda: 1.0))
    assert report.kinds() == {"synchronized-retries"}


def test_immediate_retries_across_a_fleet_are_flagged() -> None:
    """Immediate retries from many clients cluster at zero."""
    rng = random.Random(1)
    assert "synchronized-retries" in check_journal(fleet(lambda: rng.uniform(0, 0.002))).kinds()


def test_jittered_retries_pass() -> None:
    """Full-jitter gaps spread out and are not reported."""
    rng = random.Random(1)
    assert check_journal(fleet(lambda: rng.uniform(0, 1.0), clients=30)).ok


def test_too_few_clients_are_not_judged() -> None:
    """Fewer than three clients say nothing about synchronisation."""
    assert check_journal(fleet(lambda: 1.0, clients=2)).ok


def test_report_round_trips_to_json() -> None:
    """to_dict() is JSON-serialisable and says ok/violations."""
    data = json.loads(json.dumps(check_journal(clean_journal()).to_dict()))
    assert data["ok"] is True
    assert data["violations"] == []
    assert len(data["operations"]) == 3


def test_cli_verify_exit_status(tmp_path: Path) -> None:
    """`stormguard mock verify` exits 0 on a clean journal, 1 on violations."""
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps(clean_journal()))
    dirty = tmp_path / "dirty.json"
    dirty.write_text(
        json.dumps({"journal": [entry(1, 1.0, status=404, outcome="error"), entry(2, 2.0)]})
    )
    runner = CliRunner()
    ok = runner.invoke(mock_group, ["verify", str(clean)])
    bad = runner.invoke(mock_group, ["verify", str(dirty)])
    as_json = runner.invoke(mock_group, ["verify", "--json", str(dirty)])
    assert (ok.exit_code, bad.exit_code, as_json.exit_code) == (0, 1, 1)
    assert "no violations" in ok.output
    assert "non-retryable-retried" in bad.output
    assert json.loads(as_json.output)["by_kind"] == {"non-retryable-retried": 1}


def test_cli_rejects_an_invalid_scenario(tmp_path: Path) -> None:
    """`stormguard mock --scenario` with a broken file exits with its errors."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes:\n  - match: {path: /x}\n    sequence: [{fault: nope}]\n")
    result = CliRunner().invoke(mock_group, ["--scenario", str(bad)])
    assert result.exit_code == 1
    assert "bad.yaml:3: routes[0].sequence[0].fault" in result.output


def test_cli_without_a_scenario_shows_usage() -> None:
    """`stormguard mock` alone prints its help."""
    result = CliRunner().invoke(mock_group, [])
    assert result.exit_code == 2
    assert "verify" in result.output


def test_retryable_statuses_follow_the_decision_table() -> None:
    """A retried 500 is flagged by default; a custom retryable set accepts it."""
    journal = [
        entry(1, 100.0, method="GET", idempotency_key=None, status=500, outcome="error"),
        entry(2, 100.5, method="GET", idempotency_key=None),
    ]
    assert check_journal(journal).kinds() == {"non-retryable-retried"}
    assert Checker(retryable_statuses={500, 503}).check(journal).ok
