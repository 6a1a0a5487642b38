"""Time values in HTTP headers: delay-seconds, HTTP-dates, RFC 3339, Go durations.

Pure functions. Anything that depends on the current time takes ``now`` (Unix
seconds) as an argument; nothing here reads a clock.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "parse_delay_ms",
    "parse_go_duration",
    "parse_http_date",
    "parse_retry_after",
    "parse_rfc3339",
]

# Design notes
# ------------
# * Strict and small on purpose. ``email.utils.parsedate_to_datetime`` accepts
#   "Sun 6 Nov 94", missing seconds, numeric zones and more, which lets a broken
#   or hostile server pick our sleep time from text that is not an HTTP-date.
#   RFC 9110 section 5.6.7 lists exactly three forms a recipient accepts:
#       IMF-fixdate  Sun, 06 Nov 1994 08:49:37 GMT
#       rfc850-date  Sunday, 06-Nov-94 08:49:37 GMT
#       asctime      Sun Nov  6 08:49:37 1994
#   Each is one anchored regex without nested quantifiers, so matching is linear
#   and bounded; over-long input is rejected before any regex runs.
# * Names of days and months are compared case-insensitively (RFC 9110 calls
#   the format case-sensitive; accepting "gmt" costs nothing and loses no hint).
#   The day name is checked to be a day name but not to match the date, as
#   most recipients do.
# * Only ASCII digits count: ``\d`` and ``float()`` would accept Arabic-Indic or
#   full-width digits, so every pattern spells ``[0-9]``.
# * Seconds up to 60 are accepted (a leap second) and simply roll over.

_MAX_INPUT = 1024  # anything longer is not a time value; reject before stripping
_MAX_VALUE = 64  # longest valid form is an rfc850-date with "Wednesday" (33 chars)
_WS = " \t\r\n"

_DELAY_SECONDS = re.compile(r"[0-9]{1,40}(?:\.[0-9]{1,20})?")

_HMS = r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
_IMF_FIXDATE = re.compile(
    r"(?P<weekday>[A-Za-z]{3}), (?P<day>[0-9]{2}) (?P<month>[A-Za-z]{3}) (?P<year>[0-9]{4}) "
    + _HMS
    + r" [Gg][Mm][Tt]"
)
_RFC850_DATE = re.compile(  # the year has two digits
    r"(?P<weekday>[A-Za-z]{6,9}), (?P<day>[0-9]{2})-(?P<month>[A-Za-z]{3})-(?P<year>[0-9]{2}) "
    + _HMS
    + r" [Gg][Mm][Tt]"
)
_ASCTIME_DATE = re.compile(
    r"(?P<weekday>[A-Za-z]{3}) (?P<month>[A-Za-z]{3}) (?P<day>[0-9 ][0-9]) "
    + _HMS
    + r" (?P<year>[0-9]{4})"
)
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_GO_PART = re.compile(r"([0-9]{1,20}(?:\.[0-9]{0,20})?|\.[0-9]{1,20})(ns|us|µs|μs|ms|s|m|h)")

_SHORT_DAYS = frozenset({"mon", "tue", "wed", "thu", "fri", "sat", "sun"})
_LONG_DAYS = frozenset(
    {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}
)
# The three HTTP-date forms, each with the day names it spells.
_HTTP_DATES = (
    (_IMF_FIXDATE, _SHORT_DAYS),
    (_RFC850_DATE, _LONG_DAYS),
    (_ASCTIME_DATE, _SHORT_DAYS),
)
_MONTHS = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_GO_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 MICRO SIGN
    "μs": 1e-6,  # U+03BC GREEK SMALL LETTER MU
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_FIFTY_YEARS = 50 * 365.2425 * 86400.0


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar (H. Hinnant's formula)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        return 29 if leap else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _timestamp(
    year: int, month: int, day: int, hour: int, minute: int, second: int
) -> float | None:
    """Unix seconds of a UTC civil time, or None when a field is out of range."""
    if not 1 <= month <= 12 or not 1 <= day <= _days_in_month(year, month):
        return None
    if hour > 23 or minute > 59 or second > 60:
        return None
    days = _days_from_civil(year, month, day)
    return float(days * 86400 + hour * 3600 + minute * 60 + second)


def _rfc850_year(two_digits: int, month: int, day: int, now: float) -> int | None:
    # RFC 9110: a two-digit year that appears to be more than 50 years in the
    # future means the most recent past year with the same last two digits.
    if not math.isfinite(now) or abs(now) > 1e12:  # ~31,700 years either way
        return None
    approx_year = 1970 + int(now // 31_556_952)
    year = approx_year - approx_year % 100 + two_digits
    limit = now + _FIFTY_YEARS
    if month == 2 and day == 29:
        day = 28  # only the year is being chosen here; the date is validated later
    if _days_from_civil(year, month, day) * 86400.0 > limit:
        year -= 100
    elif _days_from_civil(year + 100, month, day) * 86400.0 <= limit:
        year += 100
    return year


def parse_http_date(value: str, *, now: float) -> float | None:
    """Unix seconds of an HTTP-date (IMF-fixdate, rfc850-date or asctime), else None.

    ``now`` resolves the two-digit year of an rfc850-date (RFC 9110 section 5.6.7).
    ``value`` must already be stripped of surrounding whitespace.
    """
    if len(value) > _MAX_VALUE:
        return None
    for pattern, day_names in _HTTP_DATES:
        match = pattern.fullmatch(value)
        if match is not None:
            return _http_date(match, day_names, now)
    return None


def _http_date(match: re.Match[str], day_names: frozenset[str], now: float) -> float | None:
    # The fields of one matched form (named alike in all three), checked.
    if match["weekday"].lower() not in day_names:
        return None
    month = _MONTHS.get(match["month"].lower())
    if month is None:
        return None
    day = int(match["day"])  # asctime pads it with a space
    year = int(match["year"])
    if len(match["year"]) == 2:  # rfc850-date
        resolved = _rfc850_year(year, month, day, now)
        if resolved is None:
            return None
        year = resolved
    hms = int(match["hour"]), int(match["minute"]), int(match["second"])
    return _timestamp(year, month, day, *hms)


def parse_rfc3339(value: str) -> float | None:
    """Unix seconds of an RFC 3339 timestamp such as ``2024-05-01T12:00:30.5Z``, else None."""
    if len(value) > _MAX_VALUE:
        return None
    match = _RFC3339.fullmatch(value)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(part) for part in match.group(1, 2, 3, 4, 5, 6))
    base = _timestamp(year, month, day, hour, minute, second)
    if base is None:
        return None
    fraction, offset = match.group(7, 8)
    if fraction:
        base += float(fraction)
    if offset not in ("Z", "z"):
        offset_hours, offset_minutes = int(offset[1:3]), int(offset[4:6])
        if offset_hours > 23 or offset_minutes > 59:
            return None
        shift = offset_hours * 3600 + offset_minutes * 60
        base -= shift if offset[0] == "+" else -shift
    return base


def parse_go_duration(value: str) -> float | None:
    """Seconds in a Go duration such as ``6m0s``, ``20ms`` or ``1h2m3.5s``, else None.

    Negative durations are rejected (a wait cannot be negative); ``"0"`` is zero.
    """
    if value == "0":
        return 0.0
    if not value or len(value) > _MAX_VALUE:
        return None
    position = 1 if value[0] == "+" else 0
    if position == len(value):
        return None
    total = 0.0
    while position < len(value):
        match = _GO_PART.match(value, position)
        if match is None:
            return None
        total += float(match[1]) * _GO_UNITS[match[2]]
        position = match.end()
    return total


def parse_delay_ms(value: str | bytes) -> float | None:
    """Seconds in a ``retry-after-ms`` value (non-negative milliseconds, OpenAI and
    Anthropic), else None. ``"1500"`` and ``"1500.5"`` parse; dates, signs, exponents
    and non-ASCII digits do not. Never raises.
    """
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("latin-1")
    if not isinstance(value, str) or len(value) > _MAX_INPUT:
        return None
    value = value.strip(_WS)
    if not value or len(value) > _MAX_VALUE or not _DELAY_SECONDS.fullmatch(value):
        return None
    return float(value) / 1000.0


def parse_retry_after(value: str | bytes, *, now: float) -> float | None:
    """Seconds to wait from ``now`` (Unix seconds) according to a ``Retry-After`` value.

    Accepts delay-seconds (``"120"``, also a non-negative decimal such as ``"1.5"``)
    and the three HTTP-date forms of RFC 9110: IMF-fixdate
    (``Sun, 06 Nov 1994 08:49:37 GMT``), rfc850-date (``Sunday, 06-Nov-94 08:49:37
    GMT``, two-digit years resolved against ``now``) and asctime (``Sun Nov  6
    08:49:37 1994``). Surrounding whitespace is allowed.

    A date in the past gives ``0.0``: ``max(0, date - now)``. Negative, empty,
    over-long or unparseable values give ``None``. Huge values are returned as they
    are: capping a wait is policy, not parsing. Never raises on any text or bytes.
    """
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("latin-1")
    if not isinstance(value, str) or len(value) > _MAX_INPUT:
        return None
    value = value.strip(_WS)
    if not value or len(value) > _MAX_VALUE:
        return None
    if "0" <= value[0] <= "9":
        return float(value) if _DELAY_SECONDS.fullmatch(value) else None
    moment = parse_http_date(value, now=now)
    if moment is None:
        return None
    return max(0.0, moment - now)
