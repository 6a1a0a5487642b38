"""parse_rate_limits: every provider's rate-limit headers read into Quota values.

Vectors are written from each provider's published header description, with
``now`` fixed at 1_700_000_000 (2023-11-14T22:13:20Z).
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stormguard.core._headers import Quota, parse_rate_limits

NOW = 1_700_000_000.0

Vector = tuple[object, tuple[Quota, ...]]


def check(headers: object, expected: tuple[Quota, ...]) -> None:
    """Parse and compare, with float tolerance on reset_after."""
    got = parse_rate_limits(headers, now=NOW)  # type: ignore[arg-type]
    assert len(got) == len(expected), got
    for quota, want in zip(got, expected):
        assert quota.name == want.name
        assert quota.limit == want.limit
        assert quota.remaining == want.remaining
        assert quota.window == want.window
        if want.reset_after is None:
            assert quota.reset_after is None
        else:
            assert quota.reset_after == pytest.approx(want.reset_after)


# ------------------------------------------------------------------- GitHub

GITHUB: dict[str, Vector] = {
    "core": (
        {
            "x-ratelimit-limit": "5000",
            "x-ratelimit-remaining": "4999",
            "x-ratelimit-used": "1",
            "x-ratelimit-reset": "1700000600",
            "x-ratelimit-resource": "core",
        },
        (Quota("core", 5000, 4999, 600, None),),
    ),
    "search-exhausted": (
        {
            "X-RateLimit-Limit": "30",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Used": "30",
            "X-RateLimit-Reset": "1700000042",
            "X-RateLimit-Resource": "search",
        },
        (Quota("search", 30, 0, 42, None),),
    ),
    "used-without-remaining": (
        {"x-ratelimit-limit": "60", "x-ratelimit-used": "60", "x-ratelimit-reset": "1700000010"},
        (Quota(None, 60, 0, 10, None),),
    ),
    "reset-in-the-past": (
        {
            "x-ratelimit-limit": "60",
            "x-ratelimit-remaining": "0",
            "x-ratelimit-reset": "1699990000",
        },
        (Quota(None, 60, 0, 0.0, None),),
    ),
}


@pytest.mark.parametrize(("headers", "expected"), GITHUB.values(), ids=GITHUB.keys())
def test_github(headers: object, expected: tuple[Quota, ...]) -> None:
    """GitHub X-RateLimit-* with -Used and -Resource (pool name) and epoch-seconds reset."""
    check(headers, expected)


# ---------------------------------------------------------- X, Discord, etc.

X_RATE_LIMIT: dict[str, Vector] = {
    "x-twitter": (
        {
            "x-rate-limit-limit": "900",
            "x-rate-limit-remaining": "899",
            "x-rate-limit-reset": "1700000900",
        },
        (Quota(None, 900, 899, 900, None),),
    ),
    "ibm-policy-name": (
        {
            "X-Rate-Limit-Policy": "api-burst",
            "X-Rate-Limit-Remaining": "3",
            "X-Rate-Limit-Reset": "1700000005",
        },
        (Quota("api-burst", None, 3, 5, None),),
    ),
}


@pytest.mark.parametrize(("headers", "expected"), X_RATE_LIMIT.values(), ids=X_RATE_LIMIT.keys())
def test_x_rate_limit(headers: object, expected: tuple[Quota, ...]) -> None:
    """X-Rate-Limit-* (X/Twitter epoch reset, a policy name header) read like X-RateLimit-*."""
    check(headers, expected)


DISCORD: dict[str, Vector] = {
    "bucket": (
        {
            "X-RateLimit-Limit": "5",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": "1700000001.250",
            "X-RateLimit-Reset-After": "1.250",
            "X-RateLimit-Bucket": "abcd1234",
            "X-RateLimit-Scope": "user",
        },
        (Quota("abcd1234", 5, 0, 1.25, None),),
    ),
    "reset-after-wins": (
        {
            "X-RateLimit-Reset": "1700000100",
            "X-RateLimit-Reset-After": "2.5",
            "X-RateLimit-Remaining": "0",
        },
        (Quota(None, None, 0, 2.5, None),),
    ),
    "global": (
        {
            "X-RateLimit-Global": "true",
            "X-RateLimit-Reset-After": "0.5",
            "X-RateLimit-Remaining": "0",
        },
        (Quota(None, None, 0, 0.5, None),),
    ),
}


@pytest.mark.parametrize(("headers", "expected"), DISCORD.values(), ids=DISCORD.keys())
def test_discord(headers: object, expected: tuple[Quota, ...]) -> None:
    """Discord: Reset-After (relative, decimals) beats the epoch Reset; Bucket names the pool."""
    check(headers, expected)


GATEWAYS: dict[str, Vector] = {
    "apisix-limit-count": (
        {"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "58"},
        (Quota(None, 2, 1, 58, None),),
    ),
    "slowapi-duplicated": (
        {
            "X-RateLimit-Limit": "5, 5",
            "X-RateLimit-Remaining": "4, 4",
            "X-RateLimit-Reset": "1700000060, 1700000060",
        },
        (Quota(None, 5, 4, 60, None),),
    ),
    "slowapi-repeated-pairs": (
        [
            ("X-RateLimit-Limit", "5"),
            ("X-RateLimit-Limit", "5"),
            ("X-RateLimit-Remaining", "4"),
            ("x-ratelimit-remaining", "4"),
            ("X-RateLimit-Reset", "1700000060.5"),
        ],
        (Quota(None, 5, 4, 60.5, None),),
    ),
    "stripe": (
        {
            "Stripe-RateLimit-Limit": "100",
            "Stripe-RateLimit-Remaining": "99",
            "Stripe-RateLimit-Reset": "1700000001",
        },
        (Quota(None, 100, 99, 1, None),),
    ),
    "other-vendor-prefix": (
        {
            "x-sib-ratelimit-limit": "1000",
            "x-sib-ratelimit-remaining": "10",
            "x-sib-ratelimit-reset": "30",
        },
        (Quota(None, 1000, 10, 30, None),),
    ),
    "gitlab": (
        {
            "RateLimit-Name": "throttle_authenticated_web",
            "RateLimit-Limit": "60",
            "RateLimit-Observed": "67",
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": "1700000030",
            "RateLimit-ResetTime": "Tue, 14 Nov 2023 22:13:50 GMT",
        },
        (Quota("throttle_authenticated_web", 60, 0, 30, None),),
    ),
}


@pytest.mark.parametrize(("headers", "expected"), GATEWAYS.values(), ids=GATEWAYS.keys())
def test_gateways_and_vendors(headers: object, expected: tuple[Quota, ...]) -> None:
    """APISIX, slowapi duplicates, Stripe-RateLimit-*, GitLab and other vendor prefixes."""
    check(headers, expected)


# ------------------------------------------------------ OpenAI and Anthropic

OPENAI = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-reset-tokens": "6m0s",
}


def test_openai() -> None:
    """OpenAI requests and tokens pools with Go-duration resets."""
    check(
        OPENAI,
        (Quota("requests", 60, 59, 1.0, None), Quota("tokens", 150000, 149984, 360.0, None)),
    )


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [("6m0s", 360.0), ("1s", 1.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("12ms", 0.012)],
)
def test_openai_go_durations(duration: str, seconds: float) -> None:
    """Every Go duration OpenAI sends becomes a reset in seconds."""
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": duration}
    check(headers, (Quota("requests", None, 0, seconds, None),))


def test_openai_usage_based_pool() -> None:
    """An unknown pool suffix (tokens_usage_based) becomes its own named quota."""
    headers = {
        "x-ratelimit-limit-tokens_usage_based": "160000",
        "x-ratelimit-remaining-tokens_usage_based": "159976",
        "x-ratelimit-reset-tokens_usage_based": "9ms",
    }
    check(headers, (Quota("tokens_usage_based", 160000, 159976, 0.009, None),))


ANTHROPIC = {
    "anthropic-ratelimit-requests-limit": "50",
    "anthropic-ratelimit-requests-remaining": "0",
    "anthropic-ratelimit-requests-reset": "2023-11-14T22:14:20Z",
    "anthropic-ratelimit-tokens-limit": "100000",
    "anthropic-ratelimit-tokens-remaining": "90000",
    "anthropic-ratelimit-tokens-reset": "2023-11-14T22:13:25.5Z",
    "anthropic-ratelimit-input-tokens-limit": "80000",
    "anthropic-ratelimit-input-tokens-remaining": "80000",
    "anthropic-ratelimit-input-tokens-reset": "2023-11-14T23:14:20+01:00",
    "anthropic-ratelimit-output-tokens-limit": "16000",
    "anthropic-ratelimit-output-tokens-remaining": "0",
    "anthropic-ratelimit-output-tokens-reset": "2023-11-14T22:00:00Z",
}


def test_anthropic() -> None:
    """Anthropic requests/tokens/input-tokens/output-tokens pools with RFC 3339 resets."""
    check(
        ANTHROPIC,
        (
            Quota("requests", 50, 0, 60.0, None),
            Quota("tokens", 100000, 90000, 5.5, None),
            Quota("input-tokens", 80000, 80000, 60.0, None),
            Quota("output-tokens", 16000, 0, 0.0, None),
        ),
    )


# ------------------------------------------------------------------- IETF

IETF: dict[str, Vector] = {
    "separate-fields": (
        {"RateLimit-Limit": "100", "RateLimit-Remaining": "50", "RateLimit-Reset": "30"},
        (Quota(None, 100, 50, 30, None),),
    ),
    "draft-00-limit-with-policies": (
        {
            "RateLimit-Limit": "10, 10;w=1, 50;w=60",
            "RateLimit-Remaining": "9",
            "RateLimit-Reset": "1",
        },
        (Quota(None, 10, 9, 1, 1), Quota(None, 50, None, None, 60)),
    ),
    "draft-03-separate-policy": (
        {
            "RateLimit-Limit": "50",
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": "7",
            "RateLimit-Policy": "10;w=1, 50;w=60",
        },
        (Quota(None, 50, 0, 7, 60), Quota(None, 10, None, None, 1)),
    ),
    "draft-07-dictionary": (
        {"RateLimit": "limit=10, remaining=5, reset=3", "RateLimit-Policy": "10;w=60"},
        (Quota(None, 10, 5, 3, 60),),
    ),
    "draft-07-policy-extensions": (
        {
            "RateLimit": "limit=100, remaining=50, reset=5",
            "RateLimit-Policy": '100;w=10;comment="fixed window"',
        },
        (Quota(None, 100, 50, 5, 10),),
    ),
    "draft-07-dictionary-without-policy": (
        {"RateLimit": "limit=10, remaining=1, reset=7"},
        (Quota(None, 10, 1, 7, None),),
    ),
    "draft-08-named": (
        {"RateLimit-Policy": '"default";q=100;w=60', "RateLimit": '"default";r=50;t=30'},
        (Quota("default", 100, 50, 30, 60),),
    ),
    "draft-08-multiple": (
        {
            "RateLimit-Policy": '"burst";q=100;w=60,"daily";q=1000;w=86400',
            "RateLimit": '"burst";r=0;t=30, "daily";r=500;t=4000',
        },
        (Quota("burst", 100, 0, 30, 60), Quota("daily", 1000, 500, 4000, 86400)),
    ),
    "draft-08-split-over-fields": (
        [
            ("RateLimit-Policy", '"permin";q=50;w=60'),
            ("ratelimit-policy", '"perhr";q=1000;w=3600'),
            ("RateLimit", '"permin";r=49;t=10'),
            ("RATELIMIT", '"perhr";r=999;t=1800'),
        ],
        (Quota("permin", 50, 49, 10, 60), Quota("perhr", 1000, 999, 1800, 3600)),
    ),
    "draft-08-partition-key-and-unit": (
        {"RateLimit-Policy": '"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:'},
        (Quota("peruser", 65535, None, None, 10),),
    ),
    "draft-08-remaining-only": (
        {"RateLimit": '"default";r=999;pk=:dHJpYWwxMjEzMjM=:'},
        (Quota("default", None, 999, None, None),),
    ),
    "draft-08-token-names": (
        {"RateLimit-Policy": "peruser;q=10;w=1", "RateLimit": "peruser;r=0;t=1"},
        (Quota("peruser", 10, 0, 1, 1),),
    ),
}


@pytest.mark.parametrize(("headers", "expected"), IETF.values(), ids=IETF.keys())
def test_ietf_drafts(headers: object, expected: tuple[Quota, ...]) -> None:
    """Every draft-ietf-httpapi-ratelimit-headers shape, separate fields to named items."""
    check(headers, expected)


@pytest.mark.parametrize(
    "value",
    [
        '"default";r=50;t=30,',
        '"default";r=50;t=30 "x"',
        '"default;r=50',
        "limit=10, remaining=, reset=3",
        '"default";=5',
        ", ",
    ],
)
def test_ietf_malformed_field_is_ignored(value: str) -> None:
    """A RateLimit field that is not a valid structured field is ignored entirely."""
    assert parse_rate_limits({"RateLimit": value}, now=NOW) == ()


def test_ietf_negative_values_are_dropped() -> None:
    """Negative r/t/q parameters are malformed and read as absent."""
    headers = {"RateLimit-Policy": '"d";q=-1;w=60', "RateLimit": '"d";r=-5;t=-3'}
    check(headers, (Quota("d", None, None, None, 60),))


# ------------------------------------------------------------ Kong, Envoy

KONG: dict[str, Vector] = {
    "rate-limiting": (
        {
            "X-RateLimit-Limit-Second": "5",
            "X-RateLimit-Remaining-Second": "4",
            "X-RateLimit-Limit-Hour": "1000",
            "X-RateLimit-Remaining-Hour": "990",
            "RateLimit-Limit": "5",
            "RateLimit-Remaining": "4",
            "RateLimit-Reset": "1",
        },
        (Quota(None, 5, 4, 1, 1), Quota(None, 1000, 990, None, 3600)),
    ),
    "all-windows": (
        {
            "X-RateLimit-Limit-Minute": "10",
            "X-RateLimit-Limit-Day": "100",
            "X-RateLimit-Limit-Week": "500",
            "X-RateLimit-Limit-Month": "1000",
            "X-RateLimit-Limit-Year": "10000",
        },
        (
            Quota(None, 10, None, None, 60),
            Quota(None, 100, None, None, 86400),
            Quota(None, 500, None, None, 604800),
            Quota(None, 1000, None, None, 2592000),
            Quota(None, 10000, None, None, 31536000),
        ),
    ),
    "response-ratelimiting": (
        {"X-RateLimit-Limit-Videos-Minute": "10", "X-RateLimit-Remaining-Videos-Minute": "9"},
        (Quota("videos", 10, 9, None, 60),),
    ),
    "numeric-window": (
        {"X-RateLimit-Limit-30": "10", "X-RateLimit-Remaining-30": "0"},
        (Quota(None, 10, 0, None, 30),),
    ),
    "ambiguous-reset-stays-separate": (
        {
            "X-RateLimit-Limit-Second": "5",
            "X-RateLimit-Remaining-Second": "4",
            "X-RateLimit-Limit-Minute": "5",
            "X-RateLimit-Remaining-Minute": "4",
            "RateLimit-Limit": "5",
            "RateLimit-Remaining": "4",
            "RateLimit-Reset": "1",
        },
        (Quota(None, 5, 4, None, 1), Quota(None, 5, 4, None, 60), Quota(None, 5, 4, 1, None)),
    ),
}


@pytest.mark.parametrize(("headers", "expected"), KONG.values(), ids=KONG.keys())
def test_kong(headers: object, expected: tuple[Quota, ...]) -> None:
    """Kong window-suffixed names give the window; the RateLimit-Reset joins its window."""
    check(headers, expected)


ENVOY: dict[str, Vector] = {
    "named-policy": (
        {
            "x-ratelimit-limit": '10, 10;w=1;name="per-ip", 1000;w=3600',
            "x-ratelimit-remaining": "9",
            "x-ratelimit-reset": "1",
        },
        (Quota("per-ip", 10, 9, 1, 1), Quota(None, 1000, None, None, 3600)),
    ),
    "plain-list": (
        {
            "X-RateLimit-Limit": "10, 10;w=1, 1000;w=3600",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": "1",
        },
        (Quota(None, 10, 0, 1, 1), Quota(None, 1000, None, None, 3600)),
    ),
    "window-spelled-out": (
        {
            "X-RateLimit-Limit": "100, 100;window=60, 10000;window=86400",
            "X-RateLimit-Remaining": "98",
        },
        (Quota(None, 100, 98, None, 60), Quota(None, 10000, None, None, 86400)),
    ),
    "single-policy": (
        {"X-RateLimit-Limit": "100;w=60", "X-RateLimit-Remaining": "99"},
        (Quota(None, 100, 99, None, 60),),
    ),
}


@pytest.mark.parametrize(("headers", "expected"), ENVOY.values(), ids=ENVOY.keys())
def test_envoy(headers: object, expected: tuple[Quota, ...]) -> None:
    """Envoy limit lists: the matching policy lends its window, others become quotas."""
    check(headers, expected)


# ------------------------------------------------------- the reset rule


@pytest.mark.parametrize(
    ("reset", "expected"),
    [
        ("30", 30.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("1000000000", 1e9),  # not > 1e9: still delta seconds
        ("1700000060", 60.0),  # > 1e9: epoch seconds
        ("1699999999", 0.0),  # epoch in the past
        ("1700000060000", 60.0),  # > 1e12: epoch milliseconds
        ("9999999999", 9999999999.0 - NOW),
        ("Tue, 14 Nov 2023 22:14:20 GMT", 60.0),
        ("2023-11-14T22:14:20Z", 60.0),
        ("6m0s", 360.0),
        ("soon", None),
        ("-5", None),
        ("1e9", None),
    ],
)
def test_ambiguous_reset_rule(reset: str, expected: float | None) -> None:
    """letters -> date or duration; > 1e12 epoch ms; > 1e9 epoch s; else delta seconds."""
    check(
        {"X-RateLimit-Limit": "1", "X-RateLimit-Reset": reset},
        (Quota(None, 1, None, expected, None),),
    )


# ------------------------------------------------------------ input shapes


def test_names_are_case_insensitive_and_bytes_work() -> None:
    """Upper-case names, bytes pairs and mixed str/bytes read the same as lower-case str."""
    expected = (Quota(None, 10, 3, 5, None),)
    check(
        {"X-RATELIMIT-LIMIT": "10", "x-RateLimit-Remaining": "3", "X-Ratelimit-Reset": "5"},
        expected,
    )
    check(
        [
            (b"x-ratelimit-limit", b"10"),
            (b"X-RateLimit-Remaining", "3"),
            ("x-ratelimit-reset", b"5"),
        ],
        expected,
    )
    check(
        {b"x-ratelimit-limit": b"10", b"x-ratelimit-remaining": b"3", b"x-ratelimit-reset": b"5"},
        expected,
    )


def test_first_of_repeated_values_wins() -> None:
    """Of repeated fields the first value counts, as when joined with commas."""
    check(
        [("X-RateLimit-Remaining", "3"), ("X-RateLimit-Remaining", "7")],
        (Quota(None, None, 3, None, None),),
    )


@pytest.mark.parametrize(
    "headers",
    [
        {},
        [],
        {"content-type": "application/json", "date": "Tue, 14 Nov 2023 22:13:20 GMT"},
        {"x-rate": "10", "accelerate-limit": "5", "xratelimit-limit": "5"},
        {"x-ratelimit-limit": "-5", "x-ratelimit-remaining": "abc", "x-ratelimit-reset": "soon"},
        {"x-ratelimit-limit": "1" * 10_000},
        {"x-ratelimit-limit--": "5", "x-ratelimit-": "5", "x-ratelimit-foo": "5"},
        {"x-ratelimit-resource": "core"},
        [("x-ratelimit-limit",), ("a", "b", "c"), 42, None, ("x-ratelimit-limit", 5)],
    ],
    ids=[
        "empty-dict",
        "empty-list",
        "unrelated",
        "look-alikes",
        "malformed",
        "10kB",
        "bad-names",
        "label-only",
        "bad-items",
    ],
)
def test_nothing_to_read(headers: object) -> None:
    """No rate-limit information, malformed values and odd items give an empty tuple."""
    assert parse_rate_limits(headers, now=NOW) == ()  # type: ignore[arg-type]


def test_malformed_field_does_not_hide_good_ones() -> None:
    """A broken remaining field is dropped while limit and reset still count."""
    check(
        {"x-ratelimit-limit": "10", "x-ratelimit-remaining": "lots", "x-ratelimit-reset": "5"},
        (Quota(None, 10, None, 5, None),),
    )


def test_huge_numbers_are_kept() -> None:
    """Thirty-digit limits and far-future epochs are returned, not clipped."""
    (quota,) = parse_rate_limits(
        {"x-ratelimit-limit": "9" * 30, "x-ratelimit-reset": "99999999999999"}, now=NOW
    )
    assert quota.limit == float("9" * 30)
    assert quota.reset_after == pytest.approx(99999999999.999 - NOW)


def test_ten_thousand_repeated_headers_are_bounded() -> None:
    """10,000 repeated fields parse quickly and the first value still wins."""
    headers = [("x-ratelimit-remaining", str(n)) for n in range(10_000)]
    started = time.perf_counter()
    check(headers, (Quota(None, None, 0, None, None),))
    assert time.perf_counter() - started < 1.0


def test_hostile_values_are_bounded() -> None:
    """10 kB structured-field-looking values in every field are rejected quickly."""
    hostile = {
        "RateLimit": '"a";r=1,' * 1250,
        "RateLimit-Policy": "1;w=1, " * 1400,
        "X-RateLimit-Limit": "1, " * 3300,
        "X-RateLimit-Reset": "Sun, " * 2000,
    }
    started = time.perf_counter()
    for _ in range(100):
        parse_rate_limits(hostile, now=NOW)
    assert time.perf_counter() - started < 1.0


def test_long_lists_are_capped() -> None:
    """A 1.5 kB list of 200 policies is read up to the member cap without error."""
    quotas = parse_rate_limits(
        {"RateLimit-Policy": ", ".join(f"{n};w=1" for n in range(200))}, now=NOW
    )
    assert 0 < len(quotas) <= 64


# ------------------------------------------------------------------ Quota


def test_quota_is_frozen_with_slots() -> None:
    """Quota is immutable, slotted, hashable, and changed with dataclasses.replace."""
    quota = Quota("core", 10, 5, 1.0, 60)
    with pytest.raises(dataclasses.FrozenInstanceError):
        quota.remaining = 4  # type: ignore[misc]
    assert not hasattr(quota, "__dict__")
    assert dataclasses.replace(quota, remaining=4).remaining == 4
    assert len({quota, Quota("core", 10, 5, 1.0, 60)}) == 1


@pytest.mark.parametrize("field", ["limit", "remaining", "reset_after", "window"])
@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_quota_rejects_negative_and_nan(field: str, bad: float) -> None:
    """A Quota with a negative or NaN number raises ConfigError (a ValueError) naming the field."""
    from stormguard import ConfigError

    with pytest.raises(ConfigError, match=field) as info:
        Quota(**{field: bad})
    assert info.value.field == field


# ------------------------------------------------------------- properties

NAMES = [
    "ratelimit",
    "ratelimit-policy",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-reset-after",
    "x-ratelimit-used",
    "x-ratelimit-resource",
    "x-ratelimit-limit-minute",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-tokens-reset",
    "x-rate-limit-reset",
    "retry-after",
]
VALID_FOR_NOW = [
    "60",
    "1700000060",
    "1700000060000",
    "6m0s",
    "2023-11-14T22:14:20Z",
    "Tue, 14 Nov 2023 22:14:20 GMT",
    "Tuesday, 14-Nov-23 22:14:20 GMT",
    '"default";r=0;t=30',
    "limit=10, remaining=0, reset=3",
]
header_names = st.one_of(st.sampled_from(NAMES), st.text(max_size=40), st.binary(max_size=40))
header_values = st.one_of(st.text(max_size=200), st.binary(max_size=200))


@given(st.lists(st.tuples(header_names, header_values), max_size=12))
def test_never_raises(headers: list[tuple[str | bytes, str | bytes]]) -> None:
    """Arbitrary names and values (text or bytes) never raise and give valid quotas."""
    for quota in parse_rate_limits(headers, now=NOW):
        for value in (quota.limit, quota.remaining, quota.reset_after, quota.window):
            assert value is None or value >= 0


@given(st.dictionaries(st.sampled_from(NAMES), st.text(max_size=200), max_size=10))
def test_never_raises_on_mappings(headers: dict[str, str]) -> None:
    """Arbitrary values under every known name never raise from a mapping either."""
    parse_rate_limits(headers, now=NOW)


@given(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9))
def test_plain_numbers_round_trip(limit: int, remaining: int, reset: int) -> None:
    """Any non-negative integers up to 1e9 come back unchanged (reset as delta seconds)."""
    headers = {
        "x-ratelimit-limit": str(limit),
        "x-ratelimit-remaining": str(remaining),
        "x-ratelimit-reset": str(reset),
    }
    assert parse_rate_limits(headers, now=NOW) == (Quota(None, limit, remaining, reset, None),)


@given(
    st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(VALID_FOR_NOW)), max_size=6),
    st.floats(allow_nan=True, allow_infinity=True),
)
def test_any_now_never_raises(headers: list[tuple[str, str]], now: float) -> None:
    """Valid values read against any now, even NaN or infinite, give valid quotas."""
    for quota in parse_rate_limits(headers, now=now):
        assert quota.reset_after is None or quota.reset_after >= 0


@pytest.mark.parametrize(
    "policy",
    ["default;l=100;w=10", '"default";l=100;w=10', "default;q=100;w=10"],
    ids=["l-token", "l-string", "q-token"],
)
def test_ietf_policy_l_spelling_gives_the_limit(policy: str) -> None:
    """RateLimit-Policy: default;l=100;w=10 (IETF 117 proposal) gives limit 100, as q= does."""
    check({"RateLimit-Policy": policy}, (Quota("default", 100.0, None, None, 10.0),))
