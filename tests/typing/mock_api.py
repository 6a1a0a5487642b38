"""Typing checks of stormguard.mock: checked by mypy --strict (make types), never run."""

from __future__ import annotations

from pathlib import Path

from stormguard.mock import (
    Checker,
    MockServer,
    Operation,
    Report,
    Scenario,
    Violation,
    check_journal,
    load_scenario,
    parse_scenario,
)

scenario: Scenario = load_scenario(Path("examples/payments.yaml"))
same: Scenario = parse_scenario({"routes": [{"match": {"path": "/"}}]})
from_text: Scenario = parse_scenario("routes: [{match: {path: /}}]", source="inline.yaml")

with MockServer(scenario, host="127.0.0.1", port=0, seed=1) as mock:
    url: str = mock.url
    journal: list[dict[str, object]] = mock.journal()
    ledger: dict[str, dict[str, int]] = mock.ledger()
    mock.reset()

server: MockServer = MockServer("examples/payments.yaml").start()
server.stop()

report: Report = check_journal(journal)
report = check_journal("journal.json", tolerance=0.1)
report = Checker(tolerance=0.05, min_clients=3, retryable_statuses={503}).check(journal)
ok: bool = report.ok
kinds: set[str] = report.kinds()
text: str = report.summary(limit=5)
first: Violation = report.violations[0]
kind: str = first.kind
entries: tuple[int, ...] = first.entries
operation: Operation = report.operations[0]
gaps: tuple[float, ...] = operation.gaps
