"""The header functions read the header containers of httpx and requests as they come."""

from __future__ import annotations

import pytest

from stormguard import Quota, parse_rate_limits, wait_hint

NOW = 1_700_000_000.0


def test_httpx_headers_with_repeated_fields() -> None:
    """httpx.Headers merges repeats into "a, b"; the first value still counts."""
    httpx = pytest.importorskip("httpx")
    headers = httpx.Headers(
        [
            ("X-RateLimit-Limit", "5"),
            ("x-ratelimit-limit", "5"),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "30"),
            ("Retry-After", "7"),
            ("retry-after", "9"),
        ]
    )
    assert parse_rate_limits(headers, now=NOW) == (Quota(None, 5, 0, 30, None),)
    assert wait_hint(429, headers, now=NOW) == 7.0
    assert wait_hint(429, headers.multi_items(), now=NOW) == 7.0


def test_httpx_raw_bytes_pairs() -> None:
    """httpx's raw header list (bytes pairs) reads like the decoded headers."""
    httpx = pytest.importorskip("httpx")
    response = httpx.Response(
        429, headers=[(b"Retry-After", b"3"), (b"X-RateLimit-Remaining", b"0")]
    )
    assert wait_hint(response.status_code, response.headers.raw, now=NOW) == 3.0


def test_requests_case_insensitive_dict() -> None:
    """requests' CaseInsensitiveDict is a mapping like any other."""
    pytest.importorskip("requests")
    from requests.structures import CaseInsensitiveDict

    headers = CaseInsensitiveDict({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000030"})
    assert wait_hint(429, headers, now=NOW) == 30.0
