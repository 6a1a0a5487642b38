"""Rate-limit response headers, read into :class:`Quota` values.

Pure: no I/O, no clock. Times are returned relative to the ``now`` passed in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, TypeAlias

from .._errors import ConfigError
from ._ratelimit_values import (
    _WS,
    _ambiguous_reset,
    _first_number,
    _joined,
    _label,
    _non_negative,
    _number_and_policies,
    _policies,
    _Policy,
    _positive,
    _reset,
    _sf_members,
)

__all__ = ["HeadersLike", "Quota", "parse_rate_limits"]

# How header names are read
# -------------------------
# Every family in the wild is "<vendor->ratelimit-<field>" or
# "<vendor->rate-limit-<field>" with an optional pool and window around the field:
#
#   x-ratelimit-limit                 GitHub, APISIX, slowapi, Envoy, Discord
#   x-rate-limit-reset                X (Twitter), epoch seconds
#   ratelimit-limit / -remaining / -reset       IETF drafts 00-06, Kong, GitLab
#   x-ratelimit-remaining-minute      Kong: the window is the suffix
#   x-ratelimit-limit-videos-minute   Kong response-ratelimiting: pool + window
#   x-ratelimit-reset-tokens          OpenAI: field first, then pool ("6m0s")
#   anthropic-ratelimit-input-tokens-reset     Anthropic: pool first (RFC 3339)
#   x-ratelimit-reset-after           Discord: relative seconds
#   x-ratelimit-resource / -bucket    GitHub pool name / Discord bucket id
#   x-ratelimit-used                  GitHub: used = limit - remaining
#   stripe-ratelimit-*, x-sib-ratelimit-* ...   other vendor prefixes
#
# So a name is split at "ratelimit-"/"rate-limit-"; the rest is cut on "-"; the
# field word is at the front or at the back; a trailing window word (second,
# minute, ...) or an integer is the window; what is left is the pool. Fields of
# the same (pool, window) form one Quota. Kong's month and year windows are
# approximated as 30 and 365 days.
#
# The IETF structured fields are read with the small RFC 8941 list/dictionary
# scanner in _ratelimit_values, covering every draft shape:
#   RateLimit: limit=10, remaining=5, reset=3      + RateLimit-Policy: 10;w=60
#   RateLimit: "default";r=50;t=30                 + RateLimit-Policy: "default";q=100;w=60
#   RateLimit-Policy: default;l=100;w=10           (`l=` for the quota, IETF 117 proposal)
# Extra list items in a limit field ("X-RateLimit-Limit: 10, 10;w=1, 1000;w=3600",
# Envoy and IETF draft 00-02) are policies: the one whose quota equals the limit
# lends its window (and name) to the quota; the others become Quotas of their own
# with only limit and window.
#
# Values
# ------
# * Repeated fields are joined with ", " as RFC 9110 allows, so "5, 5" (slowapi)
#   and two "X-RateLimit-Limit: 5" lines read the same: the first member counts.
# * A reset that is not explicitly relative is ambiguous. It is read as: letters
#   -> Go duration, RFC 3339 or HTTP-date; a number > 1e12 -> epoch milliseconds;
#   > 1e9 -> epoch seconds; else delta seconds. A relative field (Discord
#   Reset-After) wins over an ambiguous one. reset_after is never negative.
# * Malformed fields are ignored, never raised: a field whose value does not
#   parse is treated as absent. Values longer than _MAX_FIELD characters are
#   ignored before any parsing, and repeats are capped, so the work per call is
#   bounded by the header count, not by what a hostile server sends.

HeadersLike: TypeAlias = (
    Mapping[str, str | bytes]
    | Mapping[bytes, str | bytes]
    | Iterable[tuple[str | bytes, str | bytes]]
)

_MAX_FIELD = 2048
_MAX_NAME = 128  # no rate-limit field name is longer; a longer one is not looked at
_MAX_REPEATS = 32

_WINDOWS = {
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "week": 604800.0,
    "month": 2592000.0,
    "year": 31536000.0,
}
_FIELDS = frozenset(
    {
        "limit",
        "remaining",
        "reset",
        "used",
        "observed",
        "resettime",
        "resource",
        "bucket",
        "name",
        "policy",
    }
)
_LABEL_FIELDS = frozenset({"resource", "bucket", "name"})

_WINDOW_DIGITS = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True, slots=True)
class Quota:
    """One rate-limit pool as the server described it.

    ``name`` is the pool, policy or bucket (``"core"``, ``"requests"``,
    ``"tokens"``, ``"default"`` ...) when the headers name it. ``limit`` and
    ``remaining`` are in the server's quota units. ``reset_after`` is seconds from
    the ``now`` given to the parser until the quota returns, never negative.
    ``window`` is the policy window in seconds when the headers state it.
    Any field the headers do not give is ``None``.
    """

    name: str | None = None
    limit: float | None = None
    remaining: float | None = None
    reset_after: float | None = None
    window: float | None = None

    def __post_init__(self) -> None:
        for field_name in ("limit", "remaining", "reset_after", "window"):
            value = getattr(self, field_name)
            if value is not None and not value >= 0:
                raise ConfigError(field_name, f"must be >= 0, got {value!r}")


@dataclass(slots=True)
class _Pool:
    label: str | None = None
    limit: float | None = None
    remaining: float | None = None
    used: float | None = None
    reset: float | None = None  # from an ambiguous field
    reset_after: float | None = None  # from an explicitly relative field
    policies: list[_Policy] | None = None

    def add_policies(self, policies: list[_Policy]) -> None:
        if policies:
            self.policies = [*(self.policies or ()), *policies]


# ---------------------------------------------------------------------- input


def _text(raw: object) -> str | None:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, bytes | bytearray):
        return bytes(raw).decode("latin-1")
    return None


# Other hint fields collected in the same pass, kept in `fields` under their own
# names (which _classify does not take for rate-limit fields): retry-after-ms
# (OpenAI, Anthropic), x-amz-retry-after (AWS, milliseconds), AWS's error type
# (which names a throttling error) and the servers' should-retry verdicts.
HINT_FIELDS = frozenset(
    {
        "retry-after-ms",
        "x-amz-retry-after",
        "x-amzn-errortype",
        "x-should-retry",
        "stripe-should-retry",
    }
)


def _collect(headers: HeadersLike) -> tuple[list[str], dict[str, list[str]]]:
    """Retry-After values, and rate-limit and HINT_FIELDS by lower-case name, in order."""
    retry_after: list[str] = []
    fields: dict[str, list[str]] = {}
    items: Iterable[Any] = headers.items() if isinstance(headers, Mapping) else headers
    for item in items:
        try:
            raw_name, raw_value = item
        except (TypeError, ValueError):
            continue  # not a pair
        name = raw_name if isinstance(raw_name, str) else _text(raw_name)
        value = raw_value if isinstance(raw_value, str) else _text(raw_value)
        if name is None or value is None or len(value) > _MAX_FIELD or len(name) > _MAX_NAME:
            continue
        lname = name.lower()
        if lname[-1:] in _WS or lname[:1] in _WS:
            lname = lname.strip(_WS)
        if lname == "retry-after":
            if len(retry_after) < _MAX_REPEATS:
                retry_after.append(value)
        elif "rate" in lname or lname in HINT_FIELDS:
            values = fields.get(lname)
            if values is None:
                fields[lname] = [value]
            elif len(values) < _MAX_REPEATS:
                values.append(value)
    return retry_after, fields


@lru_cache(maxsize=1024)
def _classify(lname: str) -> tuple[str, str | None, float | None] | None:
    """(field, pool, window) for a header name, or None when it is not a rate-limit field."""
    if lname == "ratelimit":
        return ("ietf", None, None)
    if lname == "ratelimit-policy":
        return ("ietf-policy", None, None)
    index, skip = lname.find("ratelimit-"), 10
    if index < 0:
        index, skip = lname.find("rate-limit-"), 11
        if index < 0:
            return None
    if index and lname[index - 1] != "-":
        return None
    tokens = lname[index + skip :].split("-")
    if tokens[:2] == ["reset", "after"]:
        field, rest = "reset-after", tokens[2:]
    elif tokens[-2:] == ["reset", "after"]:
        field, rest = "reset-after", tokens[:-2]
    elif tokens[0] in _FIELDS:
        field, rest = tokens[0], tokens[1:]
    elif tokens[-1] in _FIELDS:
        field, rest = tokens[-1], tokens[:-1]
    else:
        return None
    window = None
    if rest:
        if rest[-1] in _WINDOWS:
            window = _WINDOWS[rest[-1]]
            rest = rest[:-1]
        elif _WINDOW_DIGITS.fullmatch(rest[-1]) and int(rest[-1]) > 0:
            window = float(rest[-1])
            rest = rest[:-1]
    if not all(rest) or len(rest) > 4:
        return None
    return (field, "-".join(rest) or None, window)


# ---------------------------------------------------------------------- fields


def _read_field(pool: _Pool, field: str, values: list[str], now: float) -> None:
    if field == "limit":
        limit, policies = _number_and_policies(values)
        if pool.limit is None:
            pool.limit = limit
        pool.add_policies(policies)
    elif field == "remaining":
        if pool.remaining is None:
            pool.remaining = _first_number(values)
    elif field in ("used", "observed"):
        if pool.used is None:
            pool.used = _first_number(values)
    elif field in ("reset", "resettime"):
        if pool.reset is None:
            pool.reset = _reset(values, now)
    elif field == "reset-after":
        if pool.reset_after is None:
            pool.reset_after = _first_number(values)
    elif field in _LABEL_FIELDS:
        if pool.label is None:
            pool.label = _label(values[0])
    elif field == "policy":
        members = _sf_members(_joined(values))
        if members and isinstance(members[0][1], float):
            pool.add_policies(_policies(members))
        elif pool.label is None:
            pool.label = _label(values[0])


def _read_ietf(
    values: list[str], unnamed: _Pool, named: dict[str, list[float | None]], now: float
) -> None:
    """``RateLimit``: a dictionary (drafts 03-07) or a list of named items (08+)."""
    members = _sf_members(_joined(values))
    if not members:
        return
    if members[0][0] is not None:
        entries = {key: value for key, value, _ in members if key is not None}
        if unnamed.limit is None:
            unnamed.limit = _non_negative(entries.get("limit"))
        if unnamed.remaining is None:
            unnamed.remaining = _non_negative(entries.get("remaining"))
        reset = _non_negative(entries.get("reset"))
        if unnamed.reset is None and reset is not None:
            unnamed.reset = _ambiguous_reset(reset, now)
        return
    for key, value, params in members:
        name = _label(value)
        if key is not None or name is None:
            continue
        entry = named.setdefault(name, [None, None, None, None])
        remaining, reset = _non_negative(params.get("r")), _non_negative(params.get("t"))
        if entry[1] is None:
            entry[1] = remaining
        if entry[2] is None and reset is not None:
            entry[2] = _ambiguous_reset(reset, now)


def _read_ietf_policy(
    values: list[str], unnamed: _Pool, named: dict[str, list[float | None]]
) -> None:
    """``RateLimit-Policy``: numeric items (drafts 03-07) or named items (08+)."""
    members = _sf_members(_joined(values))
    if not members:
        return
    unnamed.add_policies(_policies(members))
    for key, value, params in members:
        name = _label(value)
        if key is not None or name is None:
            continue
        entry = named.setdefault(name, [None, None, None, None])
        if entry[0] is None:  # q= (draft 08+); l= (the IETF 117 proposal, early servers)
            entry[0] = _non_negative(params.get("q", params.get("l")))
        if entry[3] is None:
            entry[3] = _positive(params.get("w"))


def _build(fields: dict[str, list[str]], now: float) -> tuple[Quota, ...]:
    pools: dict[tuple[str | None, float | None], _Pool] = {}
    named: dict[str, list[float | None]] = {}
    for lname, values in fields.items():
        spec = _classify(lname)
        if spec is None:
            continue
        field, pool_name, window = spec
        pool = pools.get((pool_name, window))
        if pool is None:
            pool = pools[(pool_name, window)] = _Pool()
        if field == "ietf":
            _read_ietf(values, pool, named, now)
        elif field == "ietf-policy":
            _read_ietf_policy(values, pool, named)
        else:
            _read_field(pool, field, values, now)

    quotas = [
        Quota(name, limit, remaining, reset_after, window)
        for name, (limit, remaining, reset_after, window) in named.items()
    ]
    pooled: list[Quota] = []
    for (pool_name, window), pool in pools.items():
        pooled.extend(_pool_quotas(pool, pool_name, window))
    quotas.extend(_merge_unwindowed(pooled) if len(pooled) > 1 else pooled)
    return tuple(dict.fromkeys(quotas)) if len(quotas) > 1 else tuple(quotas)


def _merge_unwindowed(quotas: list[Quota]) -> list[Quota]:
    # Kong sends "X-RateLimit-Remaining-Minute: 4" and, for the window closest to
    # exhaustion, "RateLimit-Remaining: 4" + "RateLimit-Reset: 17" without saying
    # which window that is. When exactly one windowed quota has the same name,
    # limit and remaining and no reset of its own, the reset belongs to it.
    merged = list(quotas)
    for loose in quotas:
        if loose.window is not None or loose.reset_after is None or loose.limit is None:
            continue
        candidates = [
            index
            for index, quota in enumerate(merged)
            if quota.window is not None
            and quota.reset_after is None
            and quota.limit == loose.limit
            and quota.remaining == loose.remaining
            and (loose.name is None or quota.name == loose.name)
        ]
        if len(candidates) == 1 and loose in merged:
            merged[candidates[0]] = replace(merged[candidates[0]], reset_after=loose.reset_after)
            merged.remove(loose)
    return merged


def _pool_quotas(pool: _Pool, pool_name: str | None, window: float | None) -> list[Quota]:
    limit, remaining = pool.limit, pool.remaining
    if remaining is None and pool.used is not None and limit is not None:
        remaining = max(0.0, limit - pool.used)
    reset_after = pool.reset_after if pool.reset_after is not None else pool.reset
    policies = pool.policies or []
    quotas = []
    matched = None
    if limit is not None or remaining is not None or reset_after is not None:
        if limit is not None:
            matched = next((policy for policy in policies if policy.limit == limit), None)
        name = pool_name or pool.label
        if matched is not None:
            window = window if window is not None else matched.window
            name = name if name is not None else matched.name
        quotas.append(Quota(name, limit, remaining, reset_after, window))
    quotas.extend(
        Quota(policy.name, policy.limit, None, None, policy.window)
        for policy in policies
        if policy is not matched
    )
    return quotas


def parse_rate_limits(headers: HeadersLike, *, now: float) -> tuple[Quota, ...]:
    """Every rate-limit quota the response headers describe, in header order.

    ``headers`` is any mapping or iterable of ``(name, value)`` pairs, ``str`` or
    ``bytes``; names are case-insensitive; repeated or comma-joined values are
    handled. Known formats: IETF ``RateLimit``/``RateLimit-Policy`` (every draft
    shape), ``RateLimit-Limit/-Remaining/-Reset``, ``X-RateLimit-*`` and
    ``X-Rate-Limit-*`` (GitHub incl. ``-Resource`` and ``-Used``, X, Discord incl.
    ``-Reset-After`` and ``-Bucket``, APISIX, slowapi), ``Stripe-Ratelimit-*``,
    OpenAI ``x-ratelimit-*-requests/-tokens`` (Go durations such as ``6m0s``),
    Anthropic ``anthropic-ratelimit-*`` (RFC 3339), Kong window-suffixed names
    (``X-RateLimit-Remaining-Minute``) and Envoy lists (``10, 10;w=1, 1000;w=3600``).

    An ambiguous reset is read as: letters -> date or Go duration; > 1e12 -> epoch
    milliseconds; > 1e9 -> epoch seconds; else delta seconds. ``reset_after`` is
    relative to ``now`` (Unix seconds) and never negative. Malformed fields are
    ignored, never raised.
    """
    _, fields = _collect(headers)
    if not fields:
        return ()
    return _build(fields, now)
