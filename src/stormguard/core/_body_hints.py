# Wait hints in 429/503 response bodies, for servers that put them there instead of
# (or as well as) in headers:
#   Discord           {"message": "...", "retry_after": 1.234, "global": false}   seconds
#   many JSON APIs    {"retry_after": 5} / {"retryAfter": 5} / {"retry_after_ms": 500}
#                     {"error": {"retry_after": 5}}  (one level of nesting)
#   OpenAI and others "... Please try again in 20s." / "in 1.5s" / "in 6m0s" / "in 120ms"
# Bodies over MAX_BODY bytes are ignored: a hint is a few bytes, and a caller must
# never buffer a huge body to look for one. Nothing here raises on any input:
# numbers are JSON numbers within float range or ASCII decimal strings; an integer
# past float range (`{"retry_after": 1000...000}`), NaN, infinity, a negative or a
# non-ASCII digit string gives no hint rather than an OverflowError or a wait that
# max_wait cannot compare.
from __future__ import annotations

import json
import math
import re
from typing import Any

from ._retry_after import parse_go_duration

__all__ = ["MAX_BODY", "wait_hint_from_body"]

MAX_BODY = 64 * 1024
_SECONDS_KEYS = ("retry_after", "retryAfter", "retry-after", "retry_after_seconds")
_MILLIS_KEYS = ("retry_after_ms", "retryAfterMs")
# "try again in 20s", "retry after 1.5 seconds", "in 6m0s"; bounded repetition only.
_NUMBER = r"[0-9]{1,12}(?:\.[0-9]{1,9})?"
_PHRASE = re.compile(
    r"(?:try again|retry)(?: after| in)\s{1,3}(?:"
    rf"(?P<go>(?:{_NUMBER}(?:h|ms|m|s|us|ns)){{1,6}})(?![0-9A-Za-z])"
    rf"|(?P<num>{_NUMBER})\s{{0,2}}(?P<unit>seconds?|secs?|milliseconds?|ms)?(?![0-9A-Za-z])"
    r")",
    re.IGNORECASE,
)


_DECIMAL = re.compile(r"[0-9]{1,20}(?:\.[0-9]{1,9})?")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if value < 0 or value.bit_length() > 1000:  # past float range: no usable hint
            return None
        number = float(value)
    elif isinstance(value, float):
        number = value
    elif isinstance(value, str) and len(value) <= 32:
        text = value.strip()
        if not _DECIMAL.fullmatch(text):  # ASCII only: float() would take "\uff15", "nan"
            return None
        number = float(text)
    else:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _from_json(document: Any, depth: int = 0) -> float | None:
    if not isinstance(document, dict) or depth > 1:
        return None
    for key in _SECONDS_KEYS:
        if key in document and (seconds := _number(document[key])) is not None:
            return seconds
    for key in _MILLIS_KEYS:
        if key in document and (millis := _number(document[key])) is not None:
            return millis / 1000.0
    for value in document.values():
        if isinstance(value, dict) and (nested := _from_json(value, depth + 1)) is not None:
            return nested
    message = document.get("message")
    if isinstance(message, str):
        return _from_text(message)
    error = document.get("error")
    if isinstance(error, str):
        return _from_text(error)
    return None


def _from_text(text: str) -> float | None:
    match = _PHRASE.search(text[:MAX_BODY])
    if match is None:
        return None
    if match.group("go") is not None:
        return parse_go_duration(match.group("go").lower())
    number = _number(match.group("num"))
    unit = (match.group("unit") or "").lower()
    if number is not None and unit.startswith("m"):  # ms, millisecond(s)
        return number / 1000.0
    return number


def wait_hint_from_body(body: bytes | str, content_type: str | None = None) -> float | None:
    """Seconds to wait as a 429/503 response *body* states it, else ``None``.

    Reads JSON fields (``retry_after`` in seconds as Discord sends it,
    ``retryAfter``, ``retry_after_ms``, one level of nesting such as
    ``{"error": {...}}``) and phrases such as "Please try again in 20s" or "in
    6m0s". Bodies over 64 KiB, malformed JSON and negative values give ``None``;
    nothing raises.
    """
    if len(body) > MAX_BODY:
        return None
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    stripped = text.lstrip()
    if stripped.startswith("{") or (content_type and "json" in content_type.lower()):
        try:
            document = json.loads(text)
        except (ValueError, RecursionError):
            document = None
        if document is not None:
            return _from_json(document)
    return _from_text(text)
