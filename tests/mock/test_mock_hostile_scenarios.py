"""Hostile scenario files (issue 15 items 1-3): every one ends in a `file:line`
ScenarioError, fast, never in a raw RecursionError, UnicodeDecodeError or a 4.9 GB
expansion."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stormguard import ScenarioError
from stormguard.mock import load_scenario, parse_scenario

MAX_BYTES = 1024 * 1024  # the documented cap


def billion_laughs() -> str:
    """The classic nested-alias bomb, about 1.2 KB of YAML."""
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    previous = "a"
    for name in "bcdefghi":
        text += f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]\n"
        previous = name
    return text + "routes: [{match: {path: /x}, sequence: [{body: {x: *i}}]}]\n"


def load_bytes(tmp_path: Path, name: str, data: bytes) -> str:
    """Load `data` saved as `name`; return the ScenarioError's text."""
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    return str(caught.value)


def test_billion_laughs_fails_fast_with_a_line(tmp_path: Path) -> None:
    """A 1.2 KB alias bomb is refused once expansion passes the value cap."""
    text = billion_laughs()
    assert len(text) < 1300
    message = load_bytes(tmp_path, "laughs.yaml", text.encode())
    assert re.match(r"laughs\.yaml:\d+: ", message)
    assert "aliases are expanded" in message


def test_many_aliases_are_refused(tmp_path: Path) -> None:
    """More aliases than the cap is an error at the alias that crosses it."""
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * 150) + "]\nroutes: []\n"
    assert "laughs.yaml:2: more than 100 aliases" in load_bytes(
        tmp_path, "laughs.yaml", text.encode()
    )


def test_an_alias_cycle_is_refused(tmp_path: Path) -> None:
    """An alias inside the value it names would recurse forever: an error instead."""
    message = load_bytes(tmp_path, "cycle.yaml", b"a: &a [*a]\nroutes: *a\n")
    assert message.startswith("cycle.yaml:1: ") and "cycle" in message


def test_a_few_aliases_still_work() -> None:
    """Ordinary aliases (a shared headers block) keep working."""
    scenario = parse_scenario(
        "routes:\n  - match: {path: /a}\n    sequence: [{headers: &h {X-Tea: 'yes'}}]\n"
        "  - match: {path: /b}\n    sequence: [{headers: *h}]\n"
    )
    assert [r.sequence[0].headers for r in scenario.routes] == [(("X-Tea", "yes"),)] * 2


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("deep.yaml", "routes: " + "[" * 3000 + "]" * 3000 + "\n", 1),
        ("deep.yaml", "seed: 1\nroutes: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", 2),
        ("deep.yaml", "routes:\n" + "- " * 3000 + "x\n", 2),
        ("deep.toml", "x = " + "[" * 3000 + "]" * 3000 + "\n", 1),
        ("deep.toml", "seed = 1\nx = " + "{a=" * 3000 + "1" + "}" * 3000 + "\n", 2),
    ],
)
def test_deep_nesting_is_a_line_error(tmp_path: Path, name: str, text: str, line: int) -> None:
    """3,000 levels of nesting give `file:line: nested deeper`, not RecursionError."""
    message = load_bytes(tmp_path, name, text.encode())
    assert message.startswith(f"{name}:{line}: ")
    # our bound (64 levels), or libyaml's own when PyYAML is built with it
    assert "nested deeper than 64 levels" in message or "maximum nesting depth" in message


@pytest.mark.parametrize(
    ("name", "data", "line"),
    [
        ("bin.yaml", b"routes: []\n" + bytes(range(128, 256)), 2),
        ("bin.toml", b"seed = 1\n\n" + bytes(range(128, 256)), 3),
        ("utf16.yaml", "routes:\n  - match: {path: /x}\n".encode("utf-16"), 1),
        ("utf16.toml", '[[routes]]\nmatch = {path = "/x"}\n'.encode("utf-16"), 1),
        ("utf16le.yaml", "routes:\n  - match: {path: /x}\n".encode("utf-16-le"), 1),
        ("nul.yaml", b"seed: 1\nroutes: []\x00\n", 2),
    ],
)
def test_non_utf8_files_are_line_errors(tmp_path: Path, name: str, data: bytes, line: int) -> None:
    """Binary and UTF-16 files give `file:line:`, not UnicodeDecodeError."""
    message = load_bytes(tmp_path, name, data)
    assert message.startswith(f"{name}:{line}: ")
    assert "UTF-8" in message or "control character" in message


def test_a_utf8_bom_is_accepted(tmp_path: Path) -> None:
    """A UTF-8 byte-order mark (as some editors save) is not an error."""
    path = tmp_path / "bom.yaml"
    path.write_bytes("routes:\n  - match: {path: /x}\n".encode("utf-8-sig"))
    assert load_scenario(path).routes[0].match.path == "/x"


def test_file_size_is_capped(tmp_path: Path) -> None:
    """A file over the cap is refused without being parsed."""
    message = load_bytes(tmp_path, "big.yaml", b"#" * (MAX_BYTES + 10))
    assert message.startswith("big.yaml:1: file too large")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("!!int abc", "seed: invalid value 'abc'"),
        ("9" * 5000, "seed: invalid value"),
        ("2001-13-45", "seed: invalid value '2001-13-45'"),
    ],
)
def test_bad_tagged_scalars_are_line_errors(tmp_path: Path, text: str, field: str) -> None:
    """A scalar YAML cannot construct (bad tag value, huge int, bad date) is a line error."""
    message = load_bytes(tmp_path, "s.yaml", f"routes: []\nseed: {text}\n".encode())
    assert message.startswith(f"s.yaml:2: {field}")


def test_unjsonable_body_is_an_error() -> None:
    """A body holding NaN cannot be sent as JSON: a field error, not TypeError."""
    with pytest.raises(ScenarioError, match=r"s\.yaml:4: routes\[0\]\.sequence\[0\]\.body"):
        parse_scenario(
            "routes:\n  - match: {path: /x}\n    sequence:\n      - body: {a: .nan}\n",
            source="s.yaml",
        )


def test_repeat_cannot_blow_up_a_sequence() -> None:
    """Thousands of steps times `repeat: 10000` stop at the step cap."""
    steps = ", ".join(["{status: 200, repeat: 10000}"] * 30)
    with pytest.raises(ScenarioError, match="more than 100,000 steps"):
        parse_scenario(f"routes: [{{match: {{path: /x}}, sequence: [{steps}]}}]\n")


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ('"Bad Name"', '"x"', "not a valid header name"),
        ('"X-Caf\u00e9"', '"x"', "not a valid header name"),
        ('"X:Colon"', '"x"', "not a valid header name"),
        ("X-A", '"a\\r\\nInjected: 1"', "not a valid header value"),
        ("X-A", '"a\\nb"', "not a valid header value"),
        ("X-A", '"a\\0b"', "not a valid header value"),
        ("X-A", '"caf\u00e9"', "not a valid header value"),
        ("X-A", '""', "not a valid header value"),
        ("X-A", '" padded"', "not a valid header value"),
        ("Transfer-Encoding", "chunked", "frames the body itself"),
    ],
)
def test_header_names_and_values_are_validated_at_load(name: str, value: str, words: str) -> None:
    """RFC 9110 tokens for names, printable ASCII without CR/LF/NUL for values."""
    text = (
        f"routes:\n  - match: {{path: /x}}\n    sequence:\n      - headers: {{{name}: {value}}}\n"
    )
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, source="h.yaml")
    assert str(caught.value).startswith("h.yaml:4: routes[0].sequence[0].headers.")
    assert words in str(caught.value)


def test_valid_headers_still_load() -> None:
    """Ordinary names and values (numbers too) pass validation unchanged."""
    scenario = parse_scenario(
        {"routes": [{"match": {"path": "/"}, "sequence": [{"headers": {"Retry-After": 2}}]}]}
    )
    assert scenario.routes[0].sequence[0].headers == (("Retry-After", "2"),)


def test_a_deep_body_from_python_is_an_error() -> None:
    """A 3,000-deep body given as a dict is a field error, not RecursionError."""
    body: dict[str, object] = {}
    for _ in range(3000):
        body = {"a": body}
    with pytest.raises(ScenarioError, match=r"routes\[0\]\.sequence\[0\]\.body: cannot be sent"):
        parse_scenario({"routes": [{"match": {"path": "/"}, "sequence": [{"body": body}]}]})
