"""Wait hints read from 429/503 response bodies."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stormguard import wait_hint_from_body


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"message": "You are being rate limited.", "retry_after": 64.57, "global": false}',
            64.57,
        ),
        (b'{"retryAfter": 5}', 5.0),
        (b'{"retry_after": "2.5"}', 2.5),
        (b'{"retry_after_ms": 1500}', 1.5),
        (b'{"error": {"code": "rate_limited", "retry_after": 7}}', 7.0),
        (b'{"error": {"message": "Rate limit reached. Please try again in 20s."}}', 20.0),
        (b'{"error": {"message": "Please try again in 6m0s. Visit ..."}}', 360.0),
        (b'{"error": {"message": "Please try again in 120ms."}}', 0.12),
        (b'{"message": "Too many requests, retry after 3 seconds"}', 3.0),
        (b"Slow down! Try again in 1.5 seconds.", 1.5),
        ("Please try again in 2s", 2.0),
    ],
)
def test_known_body_shapes(body: bytes | str, expected: float) -> None:
    """Discord, OpenAI and common JSON/text shapes give the stated wait in seconds."""
    assert wait_hint_from_body(body) == pytest.approx(expected)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"rate limited",
        b'{"retry_after": -1}',
        b'{"retry_after": true}',
        b'{"retry_after": "soon"}',
        b'{"retry_after": NaN}',
        b'{"retry_after": 1e999}',
        b"{not json",
        b"[1, 2, 3]",
        b"try again in",
        b"x" * 70_000 + b'{"retry_after": 1}',
        b"[" * 100_000,
        b"[" * 60_000,
    ],
)
def test_no_hint_or_hostile_bodies(body: bytes) -> None:
    """Bodies without a sane hint give None, never an exception."""
    assert wait_hint_from_body(body) is None


def test_json_content_type_is_honoured() -> None:
    """A JSON body with leading whitespace is still read as JSON."""
    assert wait_hint_from_body(b'  \n {"retry_after": 4}', "application/json") == 4.0


@given(st.binary(max_size=2000))
def test_never_raises_on_bytes(body: bytes) -> None:
    """Arbitrary bytes never raise and never give a negative wait."""
    hint = wait_hint_from_body(body)
    assert hint is None or hint >= 0


@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.text(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(["retry_after", "error", "message", "x"]), inner, max_size=4
            )
        ),
        max_leaves=20,
    )
)
def test_never_raises_on_json(document: object) -> None:
    """Arbitrary JSON documents never raise and never give a negative or infinite wait."""
    hint = wait_hint_from_body(json.dumps(document))
    assert hint is None or 0 <= hint < float("inf")


@pytest.mark.parametrize(
    "body",
    [
        '{"retry_after": 1' + "0" * 400 + "}",
        '{"retry_after_ms": 1' + "0" * 400 + "}",
        '{"error": {"retry_after": 1' + "0" * 400 + "}}",
        '{"retry_after": -1' + "0" * 400 + "}",
        '{"retry_after": 1' + "0" * 5000 + "}",
        '{"retry_after": 1e400}',
        '{"retry_after": NaN}',
        '{"retry_after": Infinity}',
        '{"retry_after": "nan"}',
        '{"retry_after": "inf"}',
        '{"retry_after": "\uff15"}',
        '{"retry_after": "1e3"}',
    ],
    ids=["int-10e400", "ms-10e400", "nested-10e400", "negative-huge", "past-digit-limit",
         "float-1e400", "NaN", "Infinity", "nan-string", "inf-string", "fullwidth-5",
         "exponent-string"],
)  # fmt: skip
def test_429_body_with_huge_retry_after_does_not_raise(body: str) -> None:
    """A 429 body {"retry_after": 10**400} (OverflowError before) and NaN/inf give no hint."""
    assert wait_hint_from_body(body, "application/json") is None
    assert wait_hint_from_body(body.encode(), None) is None
