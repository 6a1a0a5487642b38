"""Hostile fuzz of the four hint parsers: nothing a server sends may raise or hang.

``python -m bench.fuzz_headers [--count N] [--seed S]`` (default 1,000,000 values), or
``python -m bench fuzz_headers [--quick]``. Every value goes through all four public
parsers — ``parse_retry_after``, ``parse_rate_limits``, ``wait_hint`` and
``wait_hint_from_body`` — as ``str`` and as ``bytes``, under a header name drawn from
every family the parsers read. The values are built to break parsers:

* huge integers (past float range, past Python's 4,300-digit int/str limit),
* NaN / infinity / exponent / sign / hex / underscore spellings,
* Unicode digits (Arabic-Indic, full-width, mathematical, superscript) and lone
  surrogates, control characters, NUL,
* 1 MB values and 1 MB header names,
* deeply nested JSON (objects and arrays, up to 100,000 levels) and JSON bodies
  whose ``retry_after`` is ``10**400``, ``1e400``, NaN, negative, a string, a list,
* mutations of valid values (truncated, digit-flipped, repeated, spliced),
* hostile header containers (non-pairs, ``None`` names, integer values).

It prints, per parser, how many calls returned a value, returned ``None``, and
raised (must be 0), and the slowest single call (a hang shows there). Exit status
is non-zero when anything escaped. The test suite runs a smaller sample of the
same generator (tests/core/test_headers_fuzz.py).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from stormguard import parse_rate_limits, parse_retry_after, wait_hint, wait_hint_from_body

NOW = 1_700_000_000.0
MEGABYTE = 1 << 20

VALID = [
    "120",
    "1.5",
    "0",
    "1700000060",
    "1700000060000",
    "Sun, 06 Nov 1994 08:49:37 GMT",
    "Sunday, 06-Nov-94 08:49:37 GMT",
    "Sun Nov  6 08:49:37 1994",
    "2023-11-14T22:14:20Z",
    "2023-11-14T23:14:20.5+01:00",
    "6m0s",
    "1h2m3.5s",
    "20ms",
    "10, 10;w=1, 1000;w=3600",
    "limit=10, remaining=5, reset=3",
    '"default";r=50;t=30',
    '"burst";q=100;w=60,"daily";q=1000;w=86400',
    "default;l=100;w=10",
    "true",
    "false",
    '{"retry_after": 1.5}',
    '{"error": {"retry_after_ms": 500}}',
    '{"message": "Please try again in 20s."}',
    "Rate limit reached. Please try again in 6m0s.",
]
NAMES = [
    "retry-after",
    "Retry-After",
    "retry-after-ms",
    "x-should-retry",
    "Stripe-Should-Retry",
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-reset-after",
    "x-ratelimit-used",
    "x-ratelimit-resource",
    "x-ratelimit-bucket",
    "x-rate-limit-reset",
    "x-ratelimit-remaining-minute",
    "x-ratelimit-remaining-videos-hour",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-input-tokens-reset",
    "stripe-ratelimit-remaining",
    "X-RATELIMIT-POLICY",
]
CONTEXT = [
    ("x-ratelimit-limit", "60"),
    ("x-ratelimit-remaining", "0"),
    ("ratelimit-policy", '"default";q=100;w=60'),
    ("retry-after", "5"),
]
SPECIAL_NUMBERS = [
    "nan", "NaN", "-nan", "inf", "-inf", "+inf", "Infinity", "-Infinity", "infinity",
    "1e309", "1e-400", "-0", "-0.0", "0e0", "1E5", "+1", "-1", " 1 ", "0x10", "1_000",
    "0b1", "1.", ".5", "1..2", "1e", "e5", "--1", "\t7\r\n", "1" * 40, "1" * 41,
    "0." + "9" * 30, "9" * 309, "9" * 4301, "1" + "0" * 400,
]  # fmt: skip
UNICODE_DIGITS = [
    "\u0661\u0662",  # Arabic-Indic 12
    "\uff11\uff12",  # full-width 12
    "\U0001d7d7",  # mathematical bold 9
    "\u00b2",  # superscript 2
    "\u0969\u0966",  # Devanagari 30
    "1\u00a0000",  # no-break space
    "\u2028",
    "\udcff",  # a lone surrogate
    "\x00",
    "\x7f",
    "\u202e120",  # right-to-left override
    "\ufeff120",  # byte-order mark
]
HOSTILE_JSON_VALUES: list[Any] = [
    10**400,
    -(10**400),
    10**308,
    1e308,
    -1,
    -0.5,
    0,
    True,
    None,
    [],
    {},
    "nan",
    "inf",
    "1e400",
    "\uff15",
    "9" * 40,
    [1, 2],
    {"$": 1},
]
HOSTILE_JSON_KEYS = ["retry_after", "retryAfter", "retry-after", "retry_after_ms", "retryAfterMs"]

# Precomputed big values: building a megabyte per draw would time the generator.
BIG_VALUES = [
    "9" * MEGABYTE,
    "a" * MEGABYTE,
    "{" * MEGABYTE,
    "[" * MEGABYTE,
    ", " * (MEGABYTE // 2),
    '{"retry_after": ' + "9" * MEGABYTE + "}",
    "try again in " + "9" * MEGABYTE + "s",
    ";w=" * (MEGABYTE // 3),
    "Sun, 06 Nov 1994 08:49:37 GMT" * (MEGABYTE // 29),
]
BIG_NAME = "x-ratelimit-" + "a-" * (MEGABYTE // 2)  # a megabyte of header name


def _nested_json(rng: random.Random) -> str:
    depth = rng.choice((2, 3, 10, 1_000, 100_000))
    inner = json.dumps({rng.choice(HOSTILE_JSON_KEYS): 1.5})
    if rng.random() < 0.5:
        return '{"error": ' * depth + inner + "}" * depth
    return "[" * depth + inner + "]" * depth


def _json_body(rng: random.Random) -> str:
    value = rng.choice(HOSTILE_JSON_VALUES)
    document: Any = {rng.choice(HOSTILE_JSON_KEYS): value}
    if rng.random() < 0.3:
        document = {"error": document, "message": "slow down"}
    if rng.random() < 0.2:
        document["message"] = f"try again in {rng.choice(SPECIAL_NUMBERS)}s"
    try:
        return json.dumps(document)
    except ValueError:  # an int past the int/str digit limit: write it by hand
        return '{"retry_after": 1' + "0" * 5000 + "}"


def _mutate(rng: random.Random, value: str) -> str:
    kind = rng.randrange(6)
    index = rng.randrange(len(value) + 1)
    if kind == 0:
        return value[:index]
    if kind == 1:
        return value[:index] + rng.choice("0123456789-.eE+ ") + value[index + 1 :]
    if kind == 2:
        return value[:index] + rng.choice(SPECIAL_NUMBERS) + value[index:]
    if kind == 3:
        return value[:index] + rng.choice(UNICODE_DIGITS) + value[index:]
    if kind == 4:
        return ", ".join([value] * rng.randint(2, 50))
    return value[:index] + rng.choice(VALID) + value[index:]


def _random_text(rng: random.Random) -> str:
    pool = "0123456789.,;=\"'-+eE:TZ GMTmsh{}[]" + "".join(UNICODE_DIGITS)
    return "".join(rng.choices(pool, k=rng.randint(0, 60)))


# Weights out of 1,000: one value in a thousand is a megabyte (1,000 per million).
GENERATORS: list[tuple[str, Callable[[random.Random], str], int]] = [
    ("mutated", lambda rng: _mutate(rng, rng.choice(VALID)), 300),
    ("special-number", lambda rng: rng.choice(SPECIAL_NUMBERS), 120),
    ("unicode", lambda rng: _mutate(rng, rng.choice(UNICODE_DIGITS)), 100),
    ("json-body", _json_body, 220),
    ("nested-json", _nested_json, 9),
    ("random-text", _random_text, 250),
    ("one-megabyte", lambda rng: rng.choice(BIG_VALUES), 1),
]
_KINDS = [name for name, _, weight in GENERATORS for _ in range(weight)]
_MAKERS = {name: maker for name, maker, _ in GENERATORS}


def hostile_values(seed: int, count: int) -> Iterator[tuple[str, str | bytes]]:
    """``count`` (kind, value) pairs; about one in four is sent as bytes."""
    rng = random.Random(seed)
    for _ in range(count):
        kind = rng.choice(_KINDS)
        value = _MAKERS[kind](rng)
        if rng.random() < 0.25:
            yield kind, value.encode("utf-8", "surrogatepass")
        else:
            yield kind, value


def _headers(rng: random.Random, value: str | bytes) -> Any:
    name: str | bytes = rng.choice(NAMES)
    shape = rng.randrange(1000)
    if shape < 50:
        name = name.upper().encode("latin-1")  # bytes names, any case
    elif shape < 51:
        name = BIG_NAME  # one in a thousand: a megabyte of header name
    pairs: list[Any] = [(name, value)]
    if 100 <= shape < 200:
        pairs *= rng.choice((2, 50, 500))  # repeated fields
    elif 200 <= shape < 250:
        pairs += [(None, value), (name,), 42, (name, 7), (name, None), "xy"]  # not header pairs
    if rng.random() < 0.5:
        pairs.append(rng.choice(CONTEXT))
    if 250 <= shape < 500:
        return dict(pairs)  # a mapping instead of a list of pairs
    return pairs


@dataclass
class Report:
    """Counts per parser: values returned, ``None`` returned, exceptions escaped."""

    values: int = 0
    returned: Counter[str] = field(default_factory=Counter)
    none: Counter[str] = field(default_factory=Counter)
    escaped: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    slowest: tuple[float, str, str] = (0.0, "", "")
    kinds: Counter[str] = field(default_factory=Counter)

    @property
    def escapes(self) -> int:
        """Exceptions that escaped any parser (must be 0)."""
        return sum(self.escaped.values())


PARSERS = ("parse_retry_after", "parse_rate_limits", "wait_hint", "wait_hint_from_body")


def _call(
    report: Report, kind: str, parser: Callable[..., object], *args: Any, **kwargs: Any
) -> None:
    name = parser.__name__
    started = time.perf_counter()
    try:
        result = parser(*args, **kwargs)
    except Exception as exc:  # counted, never hidden: the printed figure must be 0
        key = f"{name}: {type(exc).__name__}"
        report.escaped[key] += 1
        report.examples.setdefault(key, f"{kind}: {exc}"[:200])
        return
    finally:
        elapsed = time.perf_counter() - started
        if elapsed > report.slowest[0]:
            report.slowest = (elapsed, name, kind)
    if result is None or result == ():
        report.none[name] += 1
    else:
        report.returned[name] += 1
        _check(name, result)


def _check(parser: str, result: object) -> None:
    # A returned wait must be a non-negative number (a NaN would slip past max_wait).
    waits = [q.reset_after for q in result] if isinstance(result, tuple) else [result]
    for wait in waits:
        if wait is not None and not (isinstance(wait, float) and wait >= 0):
            raise AssertionError(f"{parser} returned {wait!r}")


def run(count: int, seed: int = 20261201) -> Report:
    """Feed ``count`` hostile values through the four parsers; return the counts."""
    rng = random.Random(seed + 1)
    report = Report()
    for kind, value in hostile_values(seed, count):
        report.values += 1
        report.kinds[kind] += 1
        headers = _headers(rng, value)
        status = rng.choice((403, 429, 503, 200))
        content_type = rng.choice((None, "application/json", "text/plain", "JSON; x=\u0661"))
        _call(report, kind, parse_retry_after, value, now=NOW)
        _call(report, kind, parse_rate_limits, headers, now=NOW)
        _call(report, kind, wait_hint, status, headers, now=NOW)
        _call(report, kind, wait_hint_from_body, value, content_type)
    return report


def print_report(report: Report, seconds: float) -> None:
    """The counts, one line per parser, then the slowest call and any escapes."""
    print(f"hostile fuzz: {report.values:,} values x {len(PARSERS)} parsers in {seconds:.1f} s")
    print("  kinds: " + ", ".join(f"{k} {n:,}" for k, n in sorted(report.kinds.items())))
    print(f"  {'parser':<22}{'value':>12}{'None':>12}{'escaped':>10}")
    for parser in PARSERS:
        escaped = sum(n for key, n in report.escaped.items() if key.startswith(parser + ":"))
        print(
            f"  {parser:<22}{report.returned[parser]:>12,}{report.none[parser]:>12,}{escaped:>10,}"
        )
    elapsed, parser, kind = report.slowest
    print(f"  slowest call: {elapsed * 1e3:.1f} ms ({parser}, {kind})")
    print(f"  escaped exceptions: {report.escapes}")
    for key, example in report.examples.items():
        print(f"    {key} x{report.escaped[key]}: {example}")


def main(quick: bool = False, count: int | None = None, seed: int = 20261201) -> None:
    """Run the fuzz (1,000,000 values; 20,000 with ``quick``) and print its counts."""
    count = count if count is not None else (20_000 if quick else 1_000_000)
    started = time.perf_counter()
    report = run(count, seed)
    print_report(report, time.perf_counter() - started)
    if report.escapes:
        raise SystemExit(f"{report.escapes} exceptions escaped the parsers")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz_headers", description=__doc__)
    parser.add_argument("--count", type=int, default=1_000_000, help="values to generate")
    parser.add_argument("--seed", type=int, default=20261201)
    args = parser.parse_args()
    main(count=args.count, seed=args.seed)
