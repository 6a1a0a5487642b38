"""Header parsing speed per provider header set, and a 100k value hostile fuzz run.

``python -m bench headers [--quick]``. Prints microseconds per call for each header
set (best of several repeats) and, for HTTP-dates, the ratio against the standard
library's lenient ``email.utils.parsedate_to_datetime`` measured in the same run.
The fuzz run is a short run of ``bench.fuzz_headers`` (hostile values through the
four parsers; exceptions must be 0); ``python -m bench fuzz_headers`` runs a million.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime

from stormguard import parse_rate_limits, parse_retry_after, wait_hint

from . import fuzz_headers

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


def _best_us(call: Callable[[], object], number: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(number):
            call()
        best = min(best, time.perf_counter() - started)
    return best / number * 1e6


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
    # The hostile fuzz (huge, NaN, Unicode, 1 MB, nested JSON) lives in fuzz_headers;
    # a short run here keeps the "0 exceptions" figure next to the speed figures.
    count = 20_000 if quick else 100_000
    started = time.perf_counter()
    report = fuzz_headers.run(count)
    seconds = time.perf_counter() - started
    print(
        f"fuzz: {count:,} hostile values x 4 functions in {seconds:.2f} s "
        f"({seconds / count * 1e6:.1f} µs/value), exceptions: {report.escapes}"
    )
    if report.escapes:
        raise SystemExit(f"fuzz raised {report.escapes} exceptions")
