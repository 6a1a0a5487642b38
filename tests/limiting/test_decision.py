"""Decision: header rendering, combining limits, and the round trip through our parser."""

from __future__ import annotations

import math

import pytest

from stormguard import Decision, parse_rate_limits, wait_hint
from stormguard.core._decision import combine


def test_allowed_headers_use_the_current_draft_shape() -> None:
    """RateLimit-Policy carries q and w; RateLimit carries r and t; no Retry-After."""
    decision = Decision(True, 100, 50.7, 29.2, 0.0, name="api", window=60)
    assert decision.headers() == {
        "RateLimit-Policy": '"api";q=100;w=60',
        "RateLimit": '"api";r=50;t=30',
        "X-RateLimit-Limit": "100",
        "X-RateLimit-Remaining": "50",
        "X-RateLimit-Reset": "30",
    }


def test_denied_headers_round_up_retry_after() -> None:
    """Retry-After is rounded up and at least one second, so clients never come early."""
    assert Decision(False, 10, 0, 5.0, 0.2).headers()["Retry-After"] == "1"
    assert Decision(False, 10, 0, 5.0, 2.0).headers()["Retry-After"] == "2"
    assert Decision(False, 10, 0, 5.0, 2.001).headers()["Retry-After"] == "3"


def test_policy_names_are_escaped() -> None:
    """Names are sf-strings: quotes and backslashes are escaped."""
    headers = Decision(True, 1, 1, 0, 0, name='a"b\\c').headers()
    assert headers["RateLimit"].startswith('"a\\"b\\\\c";')


def test_decision_is_immutable_and_truthy_when_allowed() -> None:
    """A Decision cannot be changed in place; bool() is `allowed`."""
    decision = Decision(False, 1, 0, 1, 1)
    with pytest.raises(AttributeError):
        decision.allowed = True  # type: ignore[misc]
    assert not decision
    assert decision._replace(allowed=True)


def test_combine_takes_the_longest_denial() -> None:
    """The combined decision is denied if any part is, with the longest wait."""
    parts = [
        Decision(True, 10, 3, 4, 0, name="a"),
        Decision(False, 5, 0, 9, 7, name="b"),
        Decision(False, 2, 0, 3, 2, name="c"),
    ]
    combined = combine(parts)
    assert not combined.allowed
    assert (combined.name, combined.retry_after) == ("b", 7)
    assert combined.parts == tuple(parts)


def test_combine_of_allowed_parts_reports_the_tightest() -> None:
    """When all allow, the part with least remaining is the binding one."""
    combined = combine([Decision(True, 10, 3, 4, 0, name="a"), Decision(True, 5, 1, 1, 0, "b")])
    assert combined.allowed
    assert combined.name == "b"


@pytest.mark.parametrize(
    "decision",
    [
        Decision(True, 100, 42, 17, 0, name="per-client", window=60),
        Decision(False, 5, 0, 9.5, 3.2, name="burst", window=1),
        combine(
            [
                Decision(True, 100, 99, 60, 0, name="client", window=60),
                Decision(False, 1000, 0, 0.4, 0.4, name="global", window=1),
            ]
        ),
    ],
)
def test_headers_round_trip_through_parse_rate_limits(decision: Decision) -> None:
    """stormguard's own parser reads the rendered headers back to the same numbers."""
    headers = decision.headers()
    quotas = parse_rate_limits(headers, now=1_700_000_000.0)
    parts = decision.parts or (decision,)
    by_name = {q.name: q for q in quotas if q.name is not None}
    for part in parts:
        quota = by_name[part.name]
        assert quota.limit == math.floor(part.limit)
        assert quota.remaining == math.floor(part.remaining)
        assert quota.reset_after == part.reset_seconds()  # a denial's t is its Retry-After
        assert quota.window == part.window
    hint = wait_hint(429, headers, now=1_700_000_000.0)
    if decision.allowed:
        assert hint is None or hint >= 0
    else:
        assert hint == max(1, math.ceil(decision.retry_after))
