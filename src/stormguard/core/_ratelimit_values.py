"""Rate-limit field values: RFC 8941 structured fields, numbers, names and resets.

Pure helpers for ``_ratelimit_headers``. Every function returns None (or an empty
result) for a malformed value instead of raising.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeAlias

from ._retry_after import parse_go_duration, parse_http_date, parse_rfc3339

# * Repeated fields are joined with ", " as RFC 9110 allows, so "5, 5" (slowapi)
#   and two "X-RateLimit-Limit: 5" lines read the same: the first member counts.
# * A reset that is not explicitly relative is ambiguous. It is read as: letters
#   -> Go duration, RFC 3339 or HTTP-date; a number > 1e12 -> epoch milliseconds;
#   > 1e9 -> epoch seconds; else delta seconds.
# * Only ASCII digits are numbers, and negative numbers are malformed.
# * The structured-field scanner is lenient on case (keys are lower-cased) but
#   otherwise follows RFC 8941 lists and dictionaries; at most _MAX_MEMBERS
#   members are read.

_MAX_MEMBERS = 64
_WS = " \t\r\n"

_NUMBER = re.compile(r"[0-9]{1,30}(?:\.[0-9]{1,20})?")
_LETTER = re.compile(r"[A-Za-z]")
_LABEL = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,126}[\x21-\x7e])?")
# RFC 8941 pieces. Possessive quantifiers (Python 3.11+) keep every match linear:
# a failed dictionary key never backtracks into shorter keys.
_SF_KEY = r"[A-Za-z*][A-Za-z0-9_.*-]*+"
_SF_BARE = (
    r'"((?:[^"\\]|\\[\\"])*+)"'  # string
    r"|(-?[0-9]{1,20}+(?:\.[0-9]{1,20}+)?)"  # integer or decimal
    r"|:([A-Za-z0-9+/=]*+):"  # byte sequence
    r"|\?([01])"  # boolean
    r"|([A-Za-z*][A-Za-z0-9_.:%*/!#$&'+^`|~-]*+)"  # token
)
_SF_BARE_PLAIN = re.sub(r"\((?!\?)", "(?:", _SF_BARE)
_SF_MEMBER = re.compile(
    rf"(?:({_SF_KEY})=)?(?:{_SF_BARE})"  # 1: key, 2-6: value
    rf"((?:;[ ]*+{_SF_KEY}(?:=(?:{_SF_BARE_PLAIN}))?)*+)"  # 7: parameters
    r"[ \t]*+(?:(,)[ \t]*+|\Z)"  # 8: a comma, or the end
)
_SF_PARAM = re.compile(rf";[ ]*+({_SF_KEY})(?:=(?:{_SF_BARE}))?")  # 1: key, 2-6: value
_SF_ESCAPE = re.compile(r"\\(.)")

_Bare: TypeAlias = float | str | bool | bytes
_Member: TypeAlias = tuple[str | None, _Bare, dict[str, _Bare]]


@dataclass(slots=True)
class _Policy:
    limit: float
    window: float | None
    name: str | None


# ------------------------------------------------------------ structured fields


def _bare(match: re.Match[str], first: int) -> _Bare:
    string, number, octets, boolean, token = match.group(
        first, first + 1, first + 2, first + 3, first + 4
    )
    if number is not None:
        return float(number)
    if string is not None:
        return _SF_ESCAPE.sub(r"\1", string) if "\\" in string else string
    if token is not None:
        return token
    if octets is not None:
        return octets.encode("ascii")
    return boolean == "1"


def _sf_members(text: str) -> list[_Member] | None:
    """Members of an RFC 8941 list or dictionary (lenient on case), or None if malformed.

    A dictionary member has a key; a list member has key None. At most
    _MAX_MEMBERS members are read.
    """
    members: list[_Member] = []
    end = len(text)
    index = end - len(text.lstrip(" \t"))
    if index == end:
        return None
    while True:
        match = _SF_MEMBER.match(text, index)
        if match is None:
            return None
        key = match[1]
        params: dict[str, _Bare] = {}
        if match[7]:
            for param in _SF_PARAM.finditer(match[7]):
                params[param[1].lower()] = True if param.end(1) == param.end() else _bare(param, 2)
        members.append((key.lower() if key else None, _bare(match, 2), params))
        index = match.end()
        if match[8] is None or len(members) >= _MAX_MEMBERS:
            return members
        if index == end:
            return None  # a trailing comma


def _non_negative(value: object) -> float | None:
    if isinstance(value, float) and value >= 0:
        return value
    return None


def _positive(value: object) -> float | None:
    if isinstance(value, float) and value > 0:
        return value
    return None


def _label(value: object) -> str | None:
    if isinstance(value, str):
        value = value.strip(_WS)
        if _LABEL.fullmatch(value):
            return value
    return None


# ---------------------------------------------------------------------- values


def _joined(values: list[str]) -> str:
    return values[0] if len(values) == 1 else ", ".join(values)


def _first_number(values: list[str]) -> float | None:
    """The first member of a numeric field ("5", "5, 5", "10;w=60"), if non-negative."""
    text = values[0].strip(_WS)
    if _NUMBER.fullmatch(text):
        return float(text)
    members = _sf_members(_joined(values))
    if not members or members[0][0] is not None:
        return None
    return _non_negative(members[0][1])


def _number_and_policies(values: list[str]) -> tuple[float | None, list[_Policy]]:
    """A limit field: its first member and any quota policies listed with it."""
    text = values[0].strip(_WS)
    if len(values) == 1 and _NUMBER.fullmatch(text):
        return float(text), []
    members = _sf_members(_joined(values))
    if not members or members[0][0] is not None:
        return None, []
    return _non_negative(members[0][1]), _policies(members)


def _policies(members: list[_Member]) -> list[_Policy]:
    policies = []
    for key, value, params in members:
        limit = _non_negative(value)
        window = _positive(params.get("w", params.get("window")))  # WHOOP: "100;window=60"
        if key is None and limit is not None and window is not None:
            policies.append(_Policy(limit, window, _label(params.get("name"))))
    return policies


def _ambiguous_reset(number: float, now: float) -> float:
    if number > 1e12:
        return max(0.0, number / 1000.0 - now)
    if number > 1e9:
        return max(0.0, number - now)
    return number


def _reset(values: list[str], now: float) -> float | None:
    """An ambiguous reset: Go duration, RFC 3339, HTTP-date, epoch ms/s or delta seconds."""
    text = values[0].strip(_WS)
    if _LETTER.search(text):
        seconds = parse_go_duration(text)
        if seconds is not None:
            return seconds
        moment = parse_rfc3339(text)
        if moment is None:
            moment = parse_http_date(text, now=now)
        return None if moment is None else max(0.0, moment - now)
    number = _first_number(values)
    return None if number is None else _ambiguous_reset(number, now)
