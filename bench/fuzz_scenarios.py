"""Fuzz the scenario loader: mutated YAML/TOML files must load or raise ScenarioError.

``python -m bench.fuzz_scenarios [--files N] [--seed S]`` writes N mutated scenario
files (byte flips, cut and doubled slices, hostile fragments: alias bombs, deep
nesting, tags, NUL bytes, huge numbers, UTF-16 and Latin-1 re-encodings, random
values in the right places) and loads each with ``load_scenario``. It prints how many
loaded, how many were refused with a ScenarioError, and how many escaped with any
other exception (a traceback a user would see) — that last count must be 0.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SEEDS_YAML = [
    """\
name: payments
seed: 42
routes:
  - match: {method: POST, path: /v1/payments}
    sequence_per: idempotency-key
    resource: payments
    sequence:
      - fault: commit-then-reset
        probability: 0.2
      - status: 503
        headers: {Retry-After: "1", X-Request-Id: abc}
        delay: {lognormal: {median: 0.05, sigma: 0.5, max: 2}}
      - status: 201
        body: {status: succeeded, amount: 5}
        repeat: 2
  - match: {method: [GET, HEAD], path: /v1/items/*}
    rate_limit: {limit: 5, window: 1, per: client, headers: github, algorithm: token-bucket}
    delay: {uniform: [0.01, 0.05]}
""",
    """\
h: &h {Retry-After: "2"}
routes:
  - match: {path: /a}
    sequence: [{status: 429, headers: *h}, {status: 200}]
  - match: {path: /b}
    delay: 0.1
    sequence: [{fault: hang}]
""",
]

SEEDS_TOML = [
    """\
name = "payments"
seed = 42

[[routes]]
match = {method = "POST", path = "/v1/payments"}
sequence_per = "idempotency-key"
resource = "payments"

[[routes.sequence]]
fault = "commit-then-reset"

[[routes.sequence]]
status = 503
headers = {Retry-After = "1"}

[[routes.sequence]]
status = 201
body = {status = "succeeded"}

[[routes]]
match = {method = "GET", path = "/v1/items"}
rate_limit = {limit = 5, window = 1, per = "client", headers = "github"}
delay = {uniform = [0.01, 0.05]}
""",
]

FRAGMENTS = [
    "&a [*a]",
    "*a",
    "*nope",
    "&x 1",
    "!!int abc",
    "!!float x",
    "!!binary ===",
    "!!timestamp 2001-13-45",
    "!!python/object/apply:os.system ['true']",
    "!custom {a: 1}",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "<<: *a",
    "? [a, b]\n: c",
    "? {a: 1}\n: c",
    "[" * 300,
    "{" * 300,
    "- " * 300,
    "]" * 50,
    "\x00",
    "\x07",
    "\ufeff",
    "\udcff",
    "9" * 5000,
    "-" + "9" * 400,
    "1e400",
    ".nan",
    "-.inf",
    "0x" + "f" * 100,
    "0o777",
    "2001-12-14t21:59:43.10-05:00",
    "~",
    "null",
    "yes",
    "'unterminated",
    '"\\uD800"',
    '"\\x00"',
    "|\n  block\n",
    ">-\n  folded\n",
    "%YAML 1.1\n---\n",
    "---\n---\n",
    "...\n",
    "\r\n",
    "\t",
    "é" * 10,
    "😀",
    "\u2028",
    "a\r\nInjected: 1",
    "Bad Name",
    '"' + "x" * 10000 + '"',
    "a = [" * 100,
    "[[routes]]\n",
    "[routes.match]\n",
    'x = """\n',
    "x = '''",
    "x = 1979-13-27T00:00:00Z",
    "x = inf",
    "x = nan",
    "x = {a = {b = {c = 1}}}",
]

HOSTILE_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    10**400,
    float("nan"),
    float("inf"),
    -0.0,
    "",
    " ",
    "x" * 5000,
    "a\r\nb",
    "é",
    [],
    [1, [2, [3]]],
    {},
    {"a": None},
    {"fixed": -1},
    {"uniform": [2, 1]},
    {"lognormal": {"median": 0, "sigma": -1}},
    "reset",
    "idempotency-key",
    200,
    599,
    600,
    1.5,
]


@dataclass
class Counts:
    """What happened to the files."""

    files: int = 0
    loaded: int = 0
    refused: int = 0
    escaped: int = 0
    slowest: float = 0.0
    escapes: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)


def _mutate_text(text: str, rng: random.Random) -> str:
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        choice = rng.randrange(7)
        at = rng.randrange(len(text) + 1)
        if choice == 0 and text:  # flip a character
            text = (
                text[:at]
                + chr(rng.randrange(0x110000 if rng.random() < 0.1 else 128))
                + text[at + 1 :]
            )
        elif choice == 1:  # cut a slice
            text = text[:at] + text[at + rng.randint(1, 40) :]
        elif choice == 2:  # double a slice
            text = text[:at] + text[at : at + rng.randint(1, 80)] * rng.randint(2, 5) + text[at:]
        elif choice == 3:  # a hostile fragment
            text = text[:at] + rng.choice(FRAGMENTS) + text[at:]
        elif choice == 4:  # swap two lines
            lines = text.split("\n")
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        elif choice == 5:  # truncate
            text = text[:at]
        else:  # replace the value after a ':' or '=' with a fragment
            for sign in (": ", "= "):
                where = text.find(sign, at)
                if where >= 0:
                    end = text.find("\n", where)
                    end = len(text) if end < 0 else end
                    text = text[: where + 2] + rng.choice(FRAGMENTS) + text[end:]
                    break
    return text


def _random_leaf(data: Any, rng: random.Random) -> Any:
    if isinstance(data, dict) and data:
        key = rng.choice(list(data))
        out = dict(data)
        out[key] = (
            _random_leaf(data[key], rng) if rng.random() < 0.7 else rng.choice(HOSTILE_VALUES)
        )
        if rng.random() < 0.1:
            out[rng.choice(["extra", "sequence", "repeat", "headers", 1, None])] = rng.choice(
                HOSTILE_VALUES
            )
        return out
    if isinstance(data, list) and data:
        index = rng.randrange(len(data))
        out_list = list(data)
        out_list[index] = _random_leaf(data[index], rng)
        return out_list
    return rng.choice(HOSTILE_VALUES)


def _structured(rng: random.Random) -> str:
    import yaml

    data = yaml.safe_load(rng.choice(SEEDS_YAML))
    for _ in range(rng.randint(1, 3)):
        data = _random_leaf(data, rng)
    return str(yaml.safe_dump(data, allow_unicode=True, width=10**6))


def mutated_file(rng: random.Random) -> tuple[str, bytes]:
    """One mutated scenario file: (suffix, bytes)."""
    kind = rng.random()
    if kind < 0.25:
        suffix, text = ".yaml", _structured(rng)
    elif kind < 0.65:
        suffix, text = ".yaml", _mutate_text(rng.choice(SEEDS_YAML), rng)
    else:
        suffix, text = ".toml", _mutate_text(rng.choice(SEEDS_TOML), rng)
    if rng.random() < 0.05:
        suffix = ".yml" if suffix == ".toml" else ".toml"
    encoding = rng.random()
    if encoding < 0.04:
        data = text.encode("utf-16", "surrogatepass")
    elif encoding < 0.07:
        data = text.encode("latin-1", "replace")
    elif encoding < 0.09:
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 400)))
    else:
        data = text.encode("utf-8", "surrogatepass")
    return suffix, data


def run(files: int = 10_000, seed: int = 1, directory: Path | None = None) -> Counts:
    """Load ``files`` mutated scenario files; count loaded / refused / escaped."""
    from stormguard import ScenarioError
    from stormguard.mock import load_scenario

    rng = random.Random(seed)
    counts = Counts()
    with tempfile.TemporaryDirectory() as tmp:
        folder = directory or Path(tmp)
        for n in range(files):
            suffix, data = mutated_file(rng)
            path = folder / f"fuzz-{n:05d}{suffix}"
            path.write_bytes(data)
            started = time.perf_counter()
            try:
                load_scenario(path)
            except ScenarioError:
                counts.refused += 1
            except BaseException as exc:  # the thing this script looks for
                if isinstance(exc, KeyboardInterrupt):
                    raise
                counts.escaped += 1
                counts.escapes[type(exc).__name__] += 1
                if len(counts.samples) < 5:
                    counts.samples.append(f"{path.name}:\n{traceback.format_exc(limit=6)}")
            else:
                counts.loaded += 1
            counts.slowest = max(counts.slowest, time.perf_counter() - started)
            counts.files += 1
            path.unlink()
    return counts


def main(quick: bool = False) -> None:
    """Entry point of ``python -m bench`` (``quick``: 1,000 files)."""
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz_scenarios")
    parser.add_argument("--files", type=int, default=1_000 if quick else 10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args([] if __name__ != "__main__" else sys.argv[1:])
    started = time.perf_counter()
    counts = run(args.files, args.seed)
    seconds = time.perf_counter() - started
    print(
        f"scenario fuzz: {counts.files:,} files, {counts.loaded:,} loaded, "
        f"{counts.refused:,} refused with ScenarioError, {counts.escaped:,} escaped "
        f"(tracebacks); slowest file {counts.slowest * 1000:.0f} ms; {seconds:.1f} s in all"
    )
    for name, number in counts.escapes.most_common():
        print(f"  escaped {name}: {number}")
    for sample in counts.samples:
        print(sample)
    if counts.escaped:
        sys.exit(1)


if __name__ == "__main__":
    main()
