"""Issue 15 items 7-8: `mock verify` refuses what is not a journal, and the checker
keys operations by method, path, query and key, so paginating and polling clients
are not flagged while true violations still are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from stormguard.mock import MockServer, check_journal
from stormguard.mock._cli import mock_group


def entry(id: int, time: float, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": id,
        "time": time,
        "end": time + 0.01,
        "method": "GET",
        "path": "/v1/items",
        "query": "",
        "client": "c1",
        "idempotency_key": None,
        "body_sha256": "e3",
        "status": 200,
        "outcome": "ok",
        "retry_after": None,
        "side_effect": None,
    }
    base.update(fields)
    return base


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"not": "a list"}', "expected a list of journal entries, got dict"),
        ('[{"id": 1}]', "entry 0 lacks time, method, path, status, outcome"),
        ("[1, 2]", "entry 0 is int"),
        ('"text"', "got str"),
        ("42", "got int"),
        ("{", "not JSON"),
        (
            '[{"id": 1, "time": "x", "method": "GET", "path": "/", "status": 200, '
            '"outcome": "ok"}]',
            "time is str",
        ),
    ],
)
def test_verify_rejects_files_that_are_not_journals(
    tmp_path: Path, content: str, words: str
) -> None:
    """Anything but a list of journal entries: a clear message and exit status 2."""
    path = tmp_path / "j.json"
    path.write_text(content)
    result = CliRunner().invoke(mock_group, ["verify", str(path)])
    assert result.exit_code == 2
    assert "not a mock journal" in result.output or "not JSON" in result.output
    assert words in result.output
    assert "no violations" not in result.output


def test_verify_binary_file_exits_2(tmp_path: Path) -> None:
    """A binary file is not JSON: exit status 2, no traceback."""
    path = tmp_path / "j.json"
    path.write_bytes(bytes(range(128, 256)))
    result = CliRunner().invoke(mock_group, ["verify", str(path)])
    assert result.exit_code == 2
    assert "not JSON" in result.output


def test_an_empty_journal_is_valid_and_says_so(tmp_path: Path) -> None:
    """`[]` is a journal of no requests: exit 0, and the output says it was empty."""
    path = tmp_path / "j.json"
    path.write_text("[]")
    result = CliRunner().invoke(mock_group, ["verify", str(path)])
    assert result.exit_code == 0
    assert "empty journal" in result.output


def test_check_journal_rejects_a_partial_entry() -> None:
    """The Python API refuses the same non-journals with a ValueError."""
    with pytest.raises(ValueError, match="lacks time"):
        check_journal([{"id": 1}])


def test_a_paginating_client_is_not_flagged() -> None:
    """25 pages are 25 operations; page 2 after a 404 on page 1 is not a retry of it."""
    journal = [entry(1, 100.0, query="page=1", status=404, outcome="error")]
    journal += [entry(n + 1, 100.1 + n * 0.05, query=f"page={n + 1}") for n in range(1, 26)]
    report = check_journal(journal)
    assert report.ok, report.summary()
    assert len(report.operations) == 26
    assert {op.query for op in report.operations} >= {"page=1", "page=2", "page=26"}


def test_a_polling_client_is_not_flagged() -> None:
    """Seven polls of one job, each answered 200 with Retry-After 2: seven operations."""
    journal = [entry(n + 1, 100.0 + n * 0.5, path="/v1/jobs/7", retry_after=2.0) for n in range(7)]
    report = check_journal(journal)
    assert report.ok, report.summary()
    assert len(report.operations) == 7


def test_labelled_first_attempts_start_new_operations() -> None:
    """Polls answered 404 (not ready yet), each labelled attempt 1: no violation."""
    journal = [
        entry(n + 1, 100.0 + n * 0.5, path="/v1/jobs/7", status=404, outcome="error", attempt=1)
        for n in range(5)
    ]
    assert check_journal(journal).ok


def test_labelled_retries_stay_one_operation() -> None:
    """Attempts labelled 1, 2, 3 are one operation: its early retry is still flagged."""
    journal = [
        entry(1, 100.0, status=503, outcome="error", retry_after=2.0, attempt=1),
        entry(2, 100.5, status=503, outcome="error", attempt=2),
        entry(3, 101.0, attempt=3),
    ]
    report = check_journal(journal)
    assert report.kinds() == {"early-retry"}
    assert len(report.operations) == 1


@pytest.mark.parametrize(
    ("kind", "journal"),
    [
        (
            "non-retryable-retried",
            [
                entry(1, 100.0, query="page=1", status=404, outcome="error"),
                entry(2, 100.5, query="page=1"),
            ],
        ),
        (
            "early-retry",
            [
                entry(1, 100.0, query="q=1", status=503, outcome="error", retry_after=2.0),
                entry(2, 100.5, query="q=1"),
            ],
        ),
        (
            "unsafe-retry",
            [
                entry(1, 100.0, method="POST", query="a=1", status=None, outcome="reset"),
                entry(2, 100.5, method="POST", query="a=1"),
            ],
        ),
    ],
)
def test_true_violations_with_a_query_are_still_flagged(
    kind: str, journal: list[dict[str, Any]]
) -> None:
    """The same URL, query included, retried wrongly is still a violation."""
    assert kind in check_journal(journal).kinds()


def test_a_success_ends_an_operation() -> None:
    """A second identical GET after a 200 is a new operation, not a retry."""
    journal = [entry(1, 100.0), entry(2, 100.001)]
    report = check_journal(journal)
    assert report.ok
    assert [len(op.attempts) for op in report.operations] == [1, 1]


@pytest.mark.parametrize(
    ("headers", "attempt"),
    [
        ({"Stormguard-Attempt": "2"}, 2),
        ({"X-Stainless-Retry-Count": "0"}, 1),
        ({"amz-sdk-request": "attempt=3; max=4"}, 3),
        ({"Stormguard-Attempt": "zero"}, None),
        ({}, None),
    ],
)
def test_the_journal_records_attempt_labels(headers: dict[str, str], attempt: int | None) -> None:
    """The server reads the documented attempt headers into the journal's `attempt`."""
    with MockServer({"routes": [{"match": {"path": "/x"}}]}) as mock:
        httpx.get(mock.url + "/x", headers=headers)
        assert mock.journal()[0]["attempt"] == attempt


def test_a_real_paginating_and_polling_client_pass() -> None:
    """Against the server: pages with a 404 first, then polls of one job: zero violations."""
    scenario = {
        "routes": [
            {"match": {"path": "/v1/items"}, "sequence": [{"status": 404}, {"status": 200}]},
            {
                "match": {"path": "/v1/jobs/7"},
                "sequence": [{"status": 202, "headers": {"Retry-After": "5"}}],
            },
        ]
    }
    with MockServer(scenario) as mock, httpx.Client(base_url=mock.url) as client:
        codes = [client.get("/v1/items", params={"page": n}).status_code for n in range(1, 26)]
        polls = [client.get("/v1/jobs/7").status_code for _ in range(7)]
        report = mock.check()
    assert codes[:2] == [404, 200]
    assert polls == [202] * 7
    assert report.ok, report.summary()
    assert len(report.operations) == 32


@pytest.mark.parametrize(
    ("first", "flagged"),
    [
        ({"status": 403, "outcome": "rate-limited", "retry_after": 1.0}, False),
        ({"status": 403, "outcome": "error", "retry_after": 2.0}, False),
        ({"status": 403, "outcome": "error"}, True),
    ],
)
def test_a_github_rate_limit_403_may_be_retried(first: dict[str, Any], flagged: bool) -> None:
    """A 403 refusing for a rate limit counts as 429; "Bad credentials" must not be retried."""
    journal = [entry(1, 100.0, method="POST", **first), entry(2, 103.0, method="POST")]
    report = check_journal(journal)
    assert ("non-retryable-retried" in report.kinds()) is flagged
    assert "unsafe-retry" not in report.kinds()
