"""Attempt numbers on the wire: every source read into one count (1 = first attempt)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stormguard import attempt_number
from stormguard.core._attempts import ATTEMPT_HEADERS, MAX_ATTEMPT, attempt_from


@pytest.mark.parametrize(
    ("name", "first", "second_retry"),
    [
        ("Retry-Attempt", None, "3"),
        ("grpc-previous-rpc-attempts", "0", "2"),
        ("x-envoy-attempt-count", "1", "3"),
        ("amz-sdk-request", "attempt=1; max=3", "attempt=3; max=3"),
        ("X-Stainless-Retry-Count", "0", "2"),
    ],
)
def test_every_source_counts_the_same(name: str, first: str | None, second_retry: str) -> None:
    """Each header's first-attempt value reads 1 and its second-retry value reads 3."""
    if first is not None:
        assert attempt_number({name: first}) == 1
    assert attempt_number({name: second_retry}) == 3


def test_no_header_is_a_first_attempt() -> None:
    """A request without any attempt header is attempt 1."""
    assert attempt_number({"content-type": "text/plain"}) == 1
    assert attempt_number([]) == 1


@pytest.mark.parametrize(
    "headers",
    [
        [(b"retry-attempt", b"2")],
        [(b"RETRY-ATTEMPT", b" 2 ")],
        (("Retry-Attempt", "2"),),
        {b"Retry-Attempt": "2"},
    ],
)
def test_names_are_case_insensitive_and_bytes_work(headers: Any) -> None:
    """ASGI's raw byte pairs, tuples and mappings, any case, surrounding whitespace."""
    assert attempt_number(headers) == 2


def test_the_largest_count_wins() -> None:
    """A client's first attempt retried by an Envoy hop is a retry (the largest count)."""
    headers = [("x-envoy-attempt-count", "2"), ("grpc-previous-rpc-attempts", "0")]
    assert attempt_number(headers) == 2
    assert attempt_number([("retry-attempt", "2"), ("retry-attempt", "4")]) == 4
    assert attempt_number({"retry-attempt": "2, 5"}) == 5


@pytest.mark.parametrize(
    "value",
    ["", "abc", "-1", "1.5", "0x10", "2 3", "٣", "1e3", "+2", "attempt=2"],
)
def test_malformed_values_are_ignored(value: str) -> None:
    """A value that is not a non-negative integer leaves the count at 1."""
    assert attempt_number({"retry-attempt": value}) == 1


def test_out_of_range_values_are_ignored_or_capped() -> None:
    """Retry-Attempt 0 is no attempt number; a huge claim is capped at MAX_ATTEMPT."""
    assert attempt_number({"retry-attempt": "0"}) == 1
    assert attempt_number({"x-envoy-attempt-count": "999999999"}) == MAX_ATTEMPT
    assert attempt_number({"retry-attempt": "9" * 200}) == 1  # longer than any count


def test_amz_sdk_request_reads_the_attempt_parameter() -> None:
    """`amz-sdk-request` is read by its attempt parameter, wherever it stands."""
    assert attempt_number({"amz-sdk-request": "ttl=20240101T000000Z; attempt=2; max=3"}) == 2
    assert attempt_number({"amz-sdk-request": "max=3"}) == 1


_hostile = st.one_of(st.text(max_size=40), st.binary(max_size=40), st.integers(), st.none())


@given(st.lists(st.tuples(st.sampled_from([*ATTEMPT_HEADERS, "x"]), _hostile), max_size=8))
def test_hostile_headers_never_raise(pairs: list[tuple[str, Any]]) -> None:
    """Any mix of names and values gives a count in [1, MAX_ATTEMPT], never an error."""
    assert 1 <= attempt_number(pairs) <= MAX_ATTEMPT


@given(st.dictionaries(st.sampled_from(ATTEMPT_HEADERS), st.text(max_size=20), max_size=5))
def test_lookup_form_agrees(headers: dict[str, str]) -> None:
    """attempt_from(view.header) reads the same count as attempt_number(headers)."""
    assert attempt_from(headers.get) == attempt_number(headers)


def test_not_pairs_are_skipped() -> None:
    """Items that are not (name, value) pairs, and a non-iterable, are ignored."""
    assert attempt_number([("retry-attempt",), ("retry-attempt", "3", "x"), 5]) == 1  # type: ignore[list-item]
    assert attempt_number(42) == 1  # type: ignore[arg-type]
