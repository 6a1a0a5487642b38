"""Header parsing speed per provider header set, and a 100k+ value fuzz run.

``python -m bench headers [--quick]``. Prints microseconds per call for each header
set (best of several repeats) and, for HTTP-dates, the ratio against the standard
library's lenient ``email.utils.parsedate_to_datetime`` measured in the same run.
The fuzz run feeds mutated values (truncated, digit-flipped, huge, non-ASCII,
10 kB, repeated) through all three functions and counts exceptions (must be 0).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime

from stormguard import parse_rate_limits, parse_retry_after, wait_hint

NOW = 1_700_000_000.0

HEADER_SETS: dict[str, list[tuple[str, str]]] = {
    "github": [
        ("x-ratelimit-limit", "5000"),
        ("x-ratelimit-remaining", "4999"),
        ("x-ratelimit-used", "1"),
        ("x-ratelimit-reset", "1700000600"),
        ("x-ratelimit-resource", "core"),
    ],
    "discord": [
        ("x-ratelimit-limit", "5"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", "1700000001.250"),
        ("x-ratelimit-reset-after", "1.250"),
        ("x-ratelimit-bucket", "abcd1234"),
    ],
    "openai": [
        ("x-ratelimit-limit-requests", "60"),
        ("x-ratelimit-limit-tokens", "150000"),
        ("x-ratelimit-remaining-requests", "59"),
        ("x-ratelimit-remaining-tokens", "149984"),
        ("x-ratelimit-reset-requests", "1s"),
        ("x-ratelimit-reset-tokens", "6m0s"),
    ],
    "anthropic": [
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "0"),
        ("anthropic-ratelimit-requests-reset", "2023-11-14T22:14:20Z"),
        ("anthropic-ratelimit-tokens-limit", "100000"),
        ("anthropic-ratelimit-tokens-remaining", "90000"),
        ("anthropic-ratelimit-tokens-reset", "2023-11-14T22:13:25Z"),
    ],
    "ietf-draft-08": [
        ("ratelimit-policy", '"burst";q=100;w=60,"daily";q=1000;w=86400'),
        ("ratelimit", '"burst";r=0;t=30, "daily";r=500;t=4000'),
    ],
    "ietf-draft-07": [
        ("ratelimit-policy", "10;w=1, 50;w=60"),
        ("ratelimit", "limit=50, remaining=0, reset=7"),
    ],
    "kong": [
        ("x-ratelimit-limit-second", "5"),
        ("x-ratelimit-remaining-second", "4"),
        ("x-ratelimit-limit-hour", "1000"),
        ("x-ratelimit-remaining-hour", "990"),
        ("ratelimit-limit", "5"),
        ("ratelimit-remaining", "4"),
        ("ratelimit-reset", "1"),
    ],
    "envoy": [
        ("x-ratelimit-limit", '10, 10;w=1;name="per-ip", 1000;w=3600'),
        ("x-ratelimit-remaining", "9"),
        ("x-ratelimit-reset", "1"),
    ],
    "typical-response": [
        ("date", "Tue, 14 Nov 2023 22:13:20 GMT"),
        ("content-type", "application/json"),
        ("content-length", "1234"),
        ("cache-control", "no-cache"),
        ("server", "nginx"),
        ("x-request-id", "0f1e2d3c4b5a"),
        ("x-ratelimit-limit", "60"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", "1700000060"),
        ("retry-after", "30"),
    ],
}

RETRY_AFTER_VALUES = {
    "seconds": "120",
    "imf-fixdate": "Sun, 06 Nov 1994 08:49:37 GMT",
    "rfc850": "Sunday, 06-Nov-94 08:49:37 GMT",
    "asctime": "Sun Nov  6 08:49:37 1994",
    "garbage-10kB": "x" * 10_240,
}

VALID_VALUES = [
    *RETRY_AFTER_VALUES.values(),
    "1.5",
    "9999999999",
    "1700000060000",
    "2023-11-14T23:14:20.5+01:00",
    "1h2m3.5s",
    "20ms",
    "5, 5",
    '10, 10;w=1;name="per-ip", 1000;w=3600',
    "limit=10, remaining=5, reset=3",
    '"default";r=50;t=30',
    '"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:',
]
NAMES = sorted({name for headers in HEADER_SETS.values() for name, _ in headers})
ODD = "\u0661\uff11\u00b5\x00\u00a0\udcff;,=\"'-.+e "


def _best_us(call: Callable[[], object], number: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(number):
            call()
        best = min(best, time.perf_counter() - started)
    return best / number * 1e6


def _mutate(rng: random.Random, value: str) -> str:
    kind = rng.randrange(7)
    index = rng.randrange(len(value) + 1)
    if kind == 0:
        return value[:index]
    if kind == 1:
        return value[:index] + rng.choice("0123456789-.e") + value[index + 1 :]
    if kind == 2:
        return value[:index] + "9" * rng.choice((13, 40, 400)) + value[index:]
    if kind == 3:
        return value[:index] + rng.choice(ODD) + value[index:]
    if kind == 4:
        return ", ".join([value] * rng.randint(2, 4))
    if kind == 5:
        return (value * (10_240 // max(len(value), 1) + 1))[:10_240]
    return "".join(rng.choice(ODD + "0123456789GMT") for _ in range(rng.randint(0, 30)))


def fuzz(count: int, seed: int = 1) -> tuple[int, int, float]:
    """(values run, exceptions, seconds) for ``count`` mutated values through all three."""
    rng = random.Random(seed)
    errors = 0
    started = time.perf_counter()
    for _ in range(count):
        value = _mutate(rng, rng.choice(VALID_VALUES))
        headers = [(rng.choice(NAMES), value)] * rng.choice((1, 1, 1, 2, 20))
        try:
            parse_retry_after(value, now=NOW)
            parse_rate_limits(headers, now=NOW)
            wait_hint(429, headers, now=NOW)
        except Exception:  # counted, not hidden: the figure printed must be 0
            errors += 1
    return count, errors, time.perf_counter() - started


def main(quick: bool) -> None:
    """Print µs per call for each header set and Retry-After form, then the fuzz count."""
    number, repeat = (2_000, 3) if quick else (20_000, 5)
    print(f"{'parse_rate_limits':<28}{'µs/call':>10}")
    for name, headers in HEADER_SETS.items():
        us = _best_us(lambda headers=headers: parse_rate_limits(headers, now=NOW), number, repeat)
        print(f"  {name:<26}{us:>10.2f}")
    print(f"{'wait_hint':<28}{'µs/call':>10}")
    for name in ("github", "openai", "typical-response"):
        headers = HEADER_SETS[name]
        us = _best_us(lambda headers=headers: wait_hint(429, headers, now=NOW), number, repeat)
        print(f"  {name:<26}{us:>10.2f}")
    print(f"{'parse_retry_after':<28}{'µs/call':>10}{'vs email.utils':>16}")
    for name, value in RETRY_AFTER_VALUES.items():
        us = _best_us(lambda value=value: parse_retry_after(value, now=NOW), number, repeat)
        ratio = ""
        if name in ("imf-fixdate", "rfc850", "asctime"):
            stdlib = _best_us(lambda value=value: parsedate_to_datetime(value), number, repeat)
            ratio = f"{us / stdlib:>15.2f}x"
        print(f"  {name:<26}{us:>10.2f}{ratio}")
    count, errors, seconds = fuzz(100_000 if quick else 300_000)
    print(
        f"fuzz: {count:,} mutated values x 3 functions in {seconds:.2f} s "
        f"({seconds / count * 1e6:.1f} µs/value), exceptions: {errors}"
    )
    if errors:
        raise SystemExit(f"fuzz raised {errors} exceptions")
