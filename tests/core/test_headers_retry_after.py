"""Retry-After and the time-value parsers behind it (HTTP-date, RFC 3339, Go durations)."""

from __future__ import annotations

import calendar
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stormguard.core._retry_after import (
    parse_go_duration,
    parse_http_date,
    parse_retry_after,
    parse_rfc3339,
)

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z
RFC_EXAMPLE = 784_111_777.0  # Sun, 06 Nov 1994 08:49:37 GMT (the RFC 9110 example)


def utc(*fields: int) -> float:
    """Unix seconds of a UTC civil time, computed by the standard library."""
    return float(calendar.timegm((*fields, 0, 0, 0)[:9]))


# ------------------------------------------------------------- delay-seconds


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("007", 7.0),
        ("  30 \t", 30.0),
        ("\t2\r\n", 2.0),
        ("86400", 86400.0),
        ("9999999999", 9999999999.0),
        ("123456789012345678901234567890", 1.2345678901234568e29),
    ],
)
def test_delay_seconds(value: str, expected: float) -> None:
    """Delay-seconds, decimals and surrounding whitespace give the number itself."""
    assert parse_retry_after(value, now=NOW) == expected


def test_huge_delay_is_returned_as_is() -> None:
    """A day-long Retry-After is returned unchanged: capping is policy, not parsing."""
    assert parse_retry_after("86400", now=NOW) == 86400.0


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        "-1",
        "-0",
        "+5",
        "1e3",
        "1.",
        ".5",
        "0x10",
        "1_000",
        "inf",
        "NaN",
        "10 seconds",
        "5, 5",
        "1 2",
        "\u0661\u0662",  # Arabic-Indic digits: float() would accept them
        "\uff11\uff12",  # full-width digits
        "12\u00a0",  # no-break space is not HTTP whitespace
        "garbage",
        "tomorrow",
    ],
)
def test_invalid_values_give_none(value: str) -> None:
    """Negative, signed, exponent, non-ASCII-digit, empty or garbage values give None."""
    assert parse_retry_after(value, now=NOW) is None


def test_bytes_are_accepted() -> None:
    """A raw bytes header value parses like its Latin-1 text."""
    assert parse_retry_after(b" 42 ", now=NOW) == 42.0


# ----------------------------------------------------------------- HTTP-dates


@pytest.mark.parametrize(
    "value",
    [
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
        "Sun Nov 06 08:49:37 1994",
        "sun, 06 nov 1994 08:49:37 gmt",
        "  Sun, 06 Nov 1994 08:49:37 GMT  ",
    ],
    ids=["imf-fixdate", "rfc850", "asctime", "asctime-2digit-day", "lowercase", "padded"],
)
def test_http_date_forms_in_the_future(value: str) -> None:
    """Every RFC 9110 HTTP-date form gives the seconds from now until that date."""
    assert parse_retry_after(value, now=RFC_EXAMPLE - 120) == 120.0


def test_past_date_gives_zero() -> None:
    """A date in 1994 seen from 2023 gives 0.0, not a negative wait."""
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=NOW) == 0.0


def test_far_future_date_is_returned_as_is() -> None:
    """A date in 2100 gives the whole (huge) wait."""
    expected = utc(2100, 1, 1, 0, 0, 0) - NOW
    assert parse_retry_after("Fri, 01 Jan 2100 00:00:00 GMT", now=NOW) == expected


@pytest.mark.parametrize(
    "value",
    [
        "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 06 Nov 1994 08:49:37 +0000",
        "Sun, 6 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 94 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49 GMT",
        "Sun, 06 Nov 1994 8:49:37 GMT",
        "Sun 06 Nov 1994 08:49:37 GMT",
        "Sun,  06 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMT trailing",
        "Xyz, 06 Nov 1994 08:49:37 GMT",
        "Sun, 06 Foo 1994 08:49:37 GMT",
        "Sun, 31 Nov 1994 08:49:37 GMT",
        "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 24:00:00 GMT",
        "Sun, 06 Nov 1994 08:60:00 GMT",
        "Sun, 06 Nov 1994 08:49:61 GMT",
        "Wed, 29 Feb 2023 00:00:00 GMT",
        "Thu, 29 Feb 1900 00:00:00 GMT",
        "Sun, 06-Nov-94 08:49:37 GMT",
        "Sunday, 06-Nov-1994 08:49:37 GMT",
        "Sunday, 06 Nov 1994 08:49:37 GMT",
        "Sun Nov 6 08:49:37 1994",
        "Sun Nov  6 08:49:37 94",
        "Sunday Nov  6 08:49:37 1994",
        "1994-11-06T08:49:37Z",
        "Sun, 06 Nov 1994",
    ],
)
def test_malformed_dates_give_none(value: str) -> None:
    """Near-miss dates (zones, digit counts, ranges, mixed forms) are rejected, not guessed."""
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Thu, 29 Feb 2024 00:00:00 GMT", utc(2024, 2, 29, 0, 0, 0)),
        ("Tue, 29 Feb 2000 00:00:00 GMT", utc(2000, 2, 29, 0, 0, 0)),
        ("Sat, 31 Dec 2016 23:59:60 GMT", utc(2017, 1, 1, 0, 0, 0)),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
        ("Fri, 31 Dec 9999 23:59:59 GMT", utc(9999, 12, 31, 23, 59, 59)),
    ],
    ids=["leap-2024", "leap-2000", "leap-second", "epoch", "year-9999"],
)
def test_http_date_calendar_edges(value: str, expected: float) -> None:
    """Leap days, a leap second, the epoch and year 9999 convert exactly."""
    assert parse_http_date(value, now=NOW) == expected


@pytest.mark.parametrize(
    ("value", "year"),
    [
        ("Monday, 01-Jan-73 00:00:00 GMT", 2073),  # < 50 years ahead of 2023-11: future
        ("Tuesday, 01-Jan-74 00:00:00 GMT", 1974),  # > 50 years ahead: the past century
        ("Sunday, 06-Nov-94 08:49:37 GMT", 1994),
        ("Saturday, 01-Jan-00 00:00:00 GMT", 2000),
        ("Thursday, 15-Nov-23 00:00:00 GMT", 2023),
    ],
)
def test_rfc850_two_digit_year_rule(value: str, year: int) -> None:
    """A two-digit year more than 50 years ahead of now is the previous century's."""
    moment = parse_http_date(value, now=NOW)
    assert moment is not None
    assert datetime.fromtimestamp(moment, UTC).year == year


def test_rfc850_year_follows_now_across_centuries() -> None:
    """The same rfc850-date resolves to 2094 when now is in 2080, to 1994 in 2023."""
    in_2080 = utc(2080, 1, 1, 0, 0, 0)
    moment = parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT", now=in_2080)
    assert moment is not None
    assert datetime.fromtimestamp(moment, UTC).year == 2094


@pytest.mark.parametrize("now", [float("nan"), float("inf"), -float("inf"), 1e308, -1e308])
def test_rfc850_with_absurd_now_gives_none(now: float) -> None:
    """An rfc850-date cannot be resolved against a non-finite or absurd now, and does not raise."""
    assert parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT", now=now) is None


@given(st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(9999, 12, 31)))
def test_imf_fixdate_round_trip(moment: datetime) -> None:
    """Any datetime formatted as IMF-fixdate by the standard library parses back exactly."""
    moment = moment.replace(microsecond=0, tzinfo=UTC)
    text = format_datetime(moment, usegmt=True)
    assert parse_http_date(text, now=NOW) == moment.timestamp()


@given(st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(9999, 12, 31)))
def test_asctime_round_trip(moment: datetime) -> None:
    """Any datetime in asctime form (day padded with a space) parses back exactly."""
    moment = moment.replace(microsecond=0, tzinfo=UTC)
    text = time.asctime(moment.timetuple())
    assert parse_http_date(text, now=NOW) == moment.timestamp()


# ----------------------------------------------------------------- RFC 3339


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2023-11-14T22:14:20Z", NOW + 60),
        ("2023-11-14t22:14:20z", NOW + 60),
        ("2023-11-14 22:14:20Z", NOW + 60),
        ("2023-11-14T22:14:20.5Z", NOW + 60.5),
        ("2023-11-14T23:14:20+01:00", NOW + 60),
        ("2023-11-14T17:14:20-05:00", NOW + 60),
        ("2023-11-14T22:14:20.123456789+00:00", NOW + 60.123456789),
    ],
)
def test_rfc3339(value: str, expected: float) -> None:
    """RFC 3339 timestamps with fractions and offsets give exact Unix seconds."""
    assert parse_rfc3339(value) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "value",
    [
        "2023-11-14T22:14:20",
        "2023-11-14",
        "2023-13-14T22:14:20Z",
        "2023-11-14T22:14:20+24:00",
        "2023-11-14T22:14:20.Z",
        "2023-11-14T22:14:20+0100",
        "\uff12\uff10\uff12\uff13-11-14T22:14:20Z",
    ],
)
def test_rfc3339_rejects(value: str) -> None:
    """Timestamps without a zone, out of range, or with non-ASCII digits give None."""
    assert parse_rfc3339(value) is None


# --------------------------------------------------------------- Go durations


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("6m0s", 360.0),
        ("1s", 1.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0", 0.0),
        ("0s", 0.0),
        ("500us", 0.0005),
        ("500µs", 0.0005),
        ("500μs", 0.0005),
        ("750ns", 7.5e-7),
        ("1.5h", 5400.0),
        ("2h45m", 9900.0),
        (".5s", 0.5),
        ("+3s", 3.0),
    ],
)
def test_go_durations(value: str, expected: float) -> None:
    """Go durations as OpenAI sends them ("6m0s", "20ms", "1h2m3.5s") give seconds."""
    assert parse_go_duration(value) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["", "-1s", "1", "s", "1x", "1m-2s", "1.2.3s", "+", "1 s"])
def test_go_duration_rejects(value: str) -> None:
    """Negative, unit-less, unknown-unit or broken durations give None."""
    assert parse_go_duration(value) is None


@given(st.integers(0, 1000), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_go_duration_round_trip(hours: int, minutes: int, seconds: int, millis: int) -> None:
    """A duration written out in h/m/s/ms parts parses back to its total."""
    text = f"{hours}h{minutes}m{seconds}s{millis}ms"
    expected = timedelta(hours=hours, minutes=minutes, seconds=seconds, milliseconds=millis)
    assert parse_go_duration(text) == pytest.approx(expected.total_seconds())


# ------------------------------------------------------------- hostile input


@pytest.mark.parametrize(
    "value",
    [
        "1" * 10_000,
        " " * 10_000 + "5",
        "Sun, " * 2_000,
        "9" * 65,
        "\x00" * 10_000,
        "Sun, 06 Nov 1994 08:49:37 GMT" + " " * 10_000,
    ],
    ids=["digits", "whitespace", "date-prefix", "65-digits", "nul", "padded-date"],
)
def test_over_long_values_give_none_fast(value: str) -> None:
    """10 kB hostile values are rejected, and 1000 of them take well under a second."""
    started = time.perf_counter()
    for _ in range(1000):
        assert parse_retry_after(value, now=NOW) is None
    assert time.perf_counter() - started < 1.0


@given(st.text())
def test_never_raises_on_text(value: str) -> None:
    """Any text gives None or a non-negative number, never an exception."""
    result = parse_retry_after(value, now=NOW)
    assert result is None or result >= 0


@given(st.binary(), st.floats(allow_nan=True, allow_infinity=True))
def test_never_raises_on_bytes(value: bytes, now: float) -> None:
    """Any bytes, with any now (even NaN), never raise."""
    parse_retry_after(value, now=now)


@given(st.integers(0, 10**18))
def test_any_delay_seconds_round_trips(seconds: int) -> None:
    """Every non-negative integer delay parses to itself."""
    assert parse_retry_after(str(seconds), now=NOW) == float(seconds)
