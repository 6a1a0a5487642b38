"""Fuzz: 100,000+ mutated header values, and a hostile sample through all four parsers."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import pytest
from bench.fuzz_headers import NAMES  # every header family the parsers read

from stormguard.core._headers import parse_rate_limits, parse_retry_after, wait_hint

NOW = 1_700_000_000.0
FUZZ_COUNT = 100_000

VALID_VALUES = [
    "120",
    "1.5",
    "0",
    "86400",
    "9999999999",
    "1700000060",
    "1700000060000",
    "Sun, 06 Nov 1994 08:49:37 GMT",
    "Sunday, 06-Nov-94 08:49:37 GMT",
    "Sun Nov  6 08:49:37 1994",
    "Fri, 01 Jan 2100 00:00:00 GMT",
    "2023-11-14T22:14:20Z",
    "2023-11-14T23:14:20.5+01:00",
    "6m0s",
    "1h2m3.5s",
    "20ms",
    "5, 5",
    "10, 10;w=1, 1000;w=3600",
    '10, 10;w=1;name="per-ip", 1000;w=3600',
    "limit=10, remaining=5, reset=3",
    "10;w=1, 50;w=60",
    '"default";r=50;t=30',
    '"burst";q=100;w=60,"daily";q=1000;w=86400',
    '"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:',
    "core",
    "abcd1234",
]
CONTEXT = [
    ("x-ratelimit-limit", "60"),
    ("x-ratelimit-remaining", "0"),
    ("ratelimit-policy", '"default";q=100;w=60'),
    ("x-ratelimit-remaining-tokens", "0"),
]
ODD_CHARS = "\u0661\uff11\u00b5\u03bc\x00\x7f\u00a0\u2028\udcff\U0001f4a5;,=\"':-.+eE "
RANDOM_POOL = ODD_CHARS + "0123456789GMTSunNov"
TEN_KB = [(value * (10_240 // len(value) + 1))[:10_240] for value in VALID_VALUES]


def _truncate(rng: random.Random, value: str) -> str:
    return value[: rng.randrange(len(value) + 1)]


def _flip_digit(rng: random.Random, value: str) -> str:
    for _ in range(8):  # probe a few positions: scanning a 10 kB value would dominate
        index = rng.randrange(len(value)) if value else 0
        if value[index : index + 1].isdigit():
            return value[:index] + rng.choice("0123456789-.e ") + value[index + 1 :]
    return value + str(rng.randrange(10))


def _huge_number(rng: random.Random, value: str) -> str:
    index = rng.randrange(len(value) + 1)
    return value[:index] + "9" * rng.choice((10, 13, 16, 40, 400)) + value[index:]


def _unicode(rng: random.Random, value: str) -> str:
    index = rng.randrange(len(value) + 1)
    return value[:index] + rng.choice(ODD_CHARS) + value[index:]


def _delete(rng: random.Random, value: str) -> str:
    if not value:
        return value
    index = rng.randrange(len(value))
    return value[:index] + value[index + 1 :]


def _repeat(rng: random.Random, value: str) -> str:
    return ", ".join([value] * rng.randint(2, 4))


def _ten_kb(rng: random.Random, value: str) -> str:
    return rng.choice(TEN_KB)


def _random_text(rng: random.Random, value: str) -> str:
    return "".join(rng.choices(RANDOM_POOL, k=rng.randint(0, 40)))


MUTATIONS: list[Callable[[random.Random, str], str]] = [
    _truncate,
    _flip_digit,
    _huge_number,
    _unicode,
    _delete,
    _repeat,
    _ten_kb,
    _random_text,
]


def fuzz_values(seed: int, count: int) -> Iterator[str | bytes]:
    """``count`` values: valid ones mutated one to three times, some sent as bytes."""
    rng = random.Random(seed)
    for _ in range(count):
        value = rng.choice(VALID_VALUES)
        for _ in range(rng.randint(1, 3)):
            value = rng.choice(MUTATIONS)(rng, value)
        if rng.random() < 0.1:
            yield value.encode("utf-8", "surrogatepass")
        else:
            yield value


def run_fuzz(seed: int, count: int) -> int:
    """Feed ``count`` values through all three functions; return how many were checked."""
    rng = random.Random(seed + 1)
    checked = 0
    for value in fuzz_values(seed, count):
        seconds = parse_retry_after(value, now=NOW)
        assert seconds is None or seconds >= 0
        name = rng.choice(NAMES)
        headers: list[tuple[str | bytes, str | bytes]] = [(name, value)]
        if rng.random() < 0.2:
            headers *= rng.choice((2, 3, 5, 50))  # repeated headers
        if rng.random() < 0.5:
            headers.append(rng.choice(CONTEXT))
        for quota in parse_rate_limits(headers, now=NOW):
            assert quota.reset_after is None or quota.reset_after >= 0
        hint = wait_hint(429, headers, now=NOW)
        assert hint is None or hint >= 0
        checked += 1
    return checked


@pytest.mark.stress
def test_fuzz_hundred_thousand_values() -> None:
    """100,000 mutated values (truncated, flipped, huge, unicode, 10 kB, repeated) never raise."""
    started = time.perf_counter()
    assert run_fuzz(seed=20261130, count=FUZZ_COUNT) == FUZZ_COUNT
    elapsed = time.perf_counter() - started
    assert elapsed < 30.0, f"fuzz took {elapsed:.1f}s"  # ~3 s normally; generous on a busy box


def test_mutations_reach_every_kind() -> None:
    """The generator produces 10 kB values, bytes and non-ASCII text, so the fuzz is not tame."""
    values = list(fuzz_values(seed=7, count=2_000))
    assert any(len(value) >= 10_000 for value in values)
    assert any(isinstance(value, bytes) for value in values)
    assert any(isinstance(value, str) and not value.isascii() for value in values)


HOSTILE_SAMPLE = 20_000


def test_hostile_sample_escapes_nothing() -> None:
    """20,000 hostile values (huge ints, NaN, Unicode digits, 1 MB, nested JSON) raise nothing."""
    from bench.fuzz_headers import run

    report = run(HOSTILE_SAMPLE, seed=7)
    assert report.escapes == 0, report.examples
    assert report.values == HOSTILE_SAMPLE
    assert set(report.kinds) >= {"json-body", "nested-json", "one-megabyte", "unicode"}
    assert report.returned["wait_hint_from_body"] > 0  # the sample also parses real hints
