"""wait_hint: Retry-After first, then the longest reset among exhausted quotas."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import stormguard
from stormguard.core._headers import wait_hint

NOW = 1_700_000_000.0


@pytest.mark.parametrize("status", [429, 503, 200, 301])
def test_retry_after_comes_first(status: int) -> None:
    """Retry-After wins over an exhausted quota's reset, whatever the status."""
    headers = {"Retry-After": "5", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60"}
    assert wait_hint(status, headers, now=NOW) == 5.0


@pytest.mark.parametrize(
    ("retry_after", "expected"),
    [
        ("86400", 86400.0),
        ("9999999999", 9999999999.0),
        ("Tue, 14 Nov 2023 22:14:20 GMT", 60.0),
        ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),
        ("Fri, 01 Jan 2100 00:00:00 GMT", 4102444800.0 - NOW),
        ("120, 120", 120.0),
        ("0", 0.0),
    ],
    ids=["a-day", "huge", "date", "past-date", "year-2100", "merged-repeat", "zero"],
)
def test_retry_after_values(retry_after: str, expected: float) -> None:
    """Retry-After seconds and dates are returned as they are, past dates as 0."""
    assert wait_hint(429, {"Retry-After": retry_after}, now=NOW) == expected


@pytest.mark.parametrize("retry_after", ["-1", "soon", "", "1" * 10_000, "Sun, 06 Nov 1994"])
def test_unusable_retry_after_falls_through(retry_after: str) -> None:
    """A negative, garbage, empty or 10 kB Retry-After is skipped for the quota reset."""
    headers = {"Retry-After": retry_after, "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60"}
    assert wait_hint(429, headers, now=NOW) == 60.0


def test_first_parseable_of_repeated_retry_after() -> None:
    """Of repeated Retry-After fields the first one that parses counts."""
    headers = [("Retry-After", "later"), ("retry-after", "7"), ("RETRY-AFTER", "9")]
    assert wait_hint(503, headers, now=NOW) == 7.0


def test_longest_reset_among_exhausted_quotas() -> None:
    """With requests and tokens both exhausted, the later reset is the wait."""
    headers = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    assert wait_hint(429, headers, now=NOW) == 360.0


def test_quota_with_room_is_not_a_hint() -> None:
    """Only exhausted quotas count: a later reset on a pool with room is ignored."""
    headers = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "10",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    assert wait_hint(429, headers, now=NOW) == 1.0


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "60"},
        {"X-RateLimit-Remaining": "0"},
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "whenever"},
        {"Retry-After": "-1"},
        {"content-type": "text/plain"},
    ],
    ids=["empty", "room-left", "no-reset", "bad-reset", "negative-retry-after", "unrelated"],
)
def test_no_hint(headers: dict[str, str]) -> None:
    """Without a usable Retry-After or an exhausted quota with a reset, the answer is None."""
    assert wait_hint(429, headers, now=NOW) is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"RateLimit": '"daily";r=0;t=4000, "burst";r=3;t=2'}, 4000.0),
        ({"RateLimit": "limit=10, remaining=0, reset=7"}, 7.0),
        (
            {
                "anthropic-ratelimit-output-tokens-remaining": "0",
                "anthropic-ratelimit-output-tokens-reset": "2023-11-14T22:14:20Z",
            },
            60.0,
        ),
        (
            {
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset-After": "1.250",
                "X-RateLimit-Reset": "1700000100",
            },
            1.25,
        ),
        (
            {
                "X-RateLimit-Used": "60",
                "X-RateLimit-Limit": "60",
                "X-RateLimit-Reset": "1700000600000",
            },
            600.0,
        ),
        ({"X-RateLimit-Remaining": "0, 0", "X-RateLimit-Reset": "1699000000"}, 0.0),
    ],
    ids=[
        "ietf-named",
        "ietf-dictionary",
        "anthropic",
        "discord",
        "github-used-epoch-ms",
        "past-reset",
    ],
)
def test_exhausted_quota_formats(headers: dict[str, str], expected: float) -> None:
    """Exhausted quotas of every format give their reset, never negative."""
    assert wait_hint(429, headers, now=NOW) == pytest.approx(expected)


def test_bytes_headers() -> None:
    """Raw bytes pairs (as an ASGI server gives them) work."""
    assert wait_hint(429, [(b"retry-after", b"3")], now=NOW) == 3.0


def test_public_names_are_exported() -> None:
    """The four header names are importable from stormguard itself."""
    for name in ("Quota", "parse_rate_limits", "parse_retry_after", "wait_hint"):
        assert name in stormguard.__all__
        assert getattr(stormguard, name) is not None


@given(
    st.integers(100, 599),
    st.lists(
        st.tuples(
            st.sampled_from(
                ["retry-after", "x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit"]
            ),
            st.one_of(st.text(max_size=100), st.binary(max_size=100)),
        ),
        max_size=8,
    ),
)
def test_never_raises(status: int, headers: list[tuple[str, str | bytes]]) -> None:
    """Any status and any header values give None or a non-negative hint."""
    hint = wait_hint(status, headers, now=NOW)
    assert hint is None or hint >= 0
