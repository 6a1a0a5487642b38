# Reading scenario sources with the line of every value, so that validation errors
# can say "payments.yaml:14: routes[0].sequence[1].fault: ...".
#
# YAML: we compose the node tree ourselves (yaml.compose) so that every value keeps
# the line it came from; scalars are resolved with PyYAML's SafeConstructor, and a
# duplicate key is an error. TOML: tomllib gives no positions, so the line is found
# by a small search of the source for the key (tables, arrays of tables and
# `key = value` lines) — good enough to point at the mistake.
#
# Hostile files are refused before they cost anything, each with a `file:line` error
# (issue 15): a size cap (MAX_BYTES), text that is not UTF-8 or holds control bytes,
# nesting deeper than MAX_DEPTH (PyYAML's composer and tomllib recurse, so a 3,000-deep
# file would end in RecursionError), more than MAX_ALIASES aliases, and more than
# MAX_NODES values once aliases are expanded (a 1.2 KB "billion laughs" file expands
# to billions). The YAML checks run on the event stream, which PyYAML produces
# without recursion, before anything is composed.
from __future__ import annotations

import re
from typing import Any

from .._errors import MissingExtra, ScenarioError

__all__ = [
    "MAX_ALIASES",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "FieldPath",
    "decode_source",
    "format_path",
    "load_toml",
    "load_yaml",
]

FieldPath = tuple[str | int, ...]

MAX_BYTES = 1024 * 1024  # a scenario is a few kilobytes; a megabyte is plenty
MAX_DEPTH = 64  # mappings and lists inside each other (JSON bodies included)
MAX_ALIASES = 100  # YAML aliases (`*name`) in one file
MAX_NODES = 100_000  # values after alias expansion

# C0 controls other than TAB, LF and CR, and DEL: never in a scenario's text.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def format_path(path: FieldPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out or "<top>"


def _line_of(text: str | bytes, offset: int) -> int:
    newline = b"\n" if isinstance(text, bytes) else "\n"
    return text.count(newline, 0, max(0, offset)) + 1  # type: ignore[arg-type]


def decode_source(raw: bytes, source: str) -> str:
    """The text of a scenario file: at most MAX_BYTES of UTF-8 (a BOM is allowed)."""
    if len(raw) > MAX_BYTES:
        raise ScenarioError(f"{source}:1: file too large (a scenario may have {MAX_BYTES:,} bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = _line_of(raw, exc.start)
        raise ScenarioError(
            f"{source}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}); save the scenario as UTF-8"
        ) from None
    return check_text(text, source)


def check_text(text: str, source: str) -> str:
    """Refuse text that is too large or holds control characters (binary data)."""
    if len(text) > MAX_BYTES:
        raise ScenarioError(f"{source}:1: scenario too large (over {MAX_BYTES:,} characters)")
    bad = _CONTROL.search(text)
    if bad is not None:
        raise ScenarioError(
            f"{source}:{_line_of(text, bad.start())}: control character "
            f"U+{ord(bad.group()):04X} in the text (binary data, or not UTF-8?)"
        )
    return text


def load_yaml(text: str, source: str) -> tuple[Any, dict[FieldPath, int]]:
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - needs the extra missing
        raise MissingExtra("yaml", "mock") from exc
    text = check_text(text, source)
    # libyaml when PyYAML has it (ten times faster); its composer recurses too, and
    # the event pass below bounds the depth first either way.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _check_yaml_events(yaml, loader, text, source)
        node = yaml.compose(text, Loader=loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"{source}{line}: invalid YAML: {exc.problem or exc}") from None
    except yaml.reader.ReaderError as exc:
        where = _line_of(text, exc.position)
        raise ScenarioError(f"{source}:{where}: invalid YAML: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}:1: invalid YAML: {exc}") from None
    if node is None:
        return {}, {}
    lines: dict[FieldPath, int] = {}
    constructor = yaml.constructor.SafeConstructor()
    errors: list[str] = []
    built = 0
    open_nodes: set[int] = set()  # collections being built: an alias to one is a cycle

    def build(n: yaml.Node, path: FieldPath) -> Any:
        nonlocal built
        built += 1
        line = n.start_mark.line + 1
        if built > MAX_NODES:
            raise ScenarioError(
                f"{source}:{line}: {format_path(path)}: more than {MAX_NODES:,} values "
                "once aliases are expanded"
            )
        lines[path] = line
        if isinstance(n, yaml.MappingNode | yaml.SequenceNode):
            if id(n) in open_nodes:
                raise ScenarioError(
                    f"{source}:{line}: {format_path(path)}: an alias refers to a value "
                    "that contains it (a cycle)"
                )
            open_nodes.add(id(n))
            try:
                return (
                    build_mapping(n, path)
                    if isinstance(n, yaml.MappingNode)
                    else build_list(n, path)
                )
            finally:
                open_nodes.discard(id(n))
        try:
            return constructor.construct_object(n, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
            raise ScenarioError(
                f"{source}:{line}: {format_path(path)}: invalid value {n.value[:40]!r} "
                f"for tag {n.tag}: {str(exc)[:200]}"
            ) from None

    def build_list(n: yaml.SequenceNode, path: FieldPath) -> list[Any]:
        return [build(item, (*path, i)) for i, item in enumerate(n.value)]

    def build_mapping(n: yaml.MappingNode, path: FieldPath) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in n.value:
            key = build(key_node, (*path, "<key>"))
            try:
                hash(key)
            except TypeError:
                key = []  # a mapping key that is a list or a mapping: refused below
            if isinstance(key, list | dict | set):
                errors.append(
                    f"{source}:{key_node.start_mark.line + 1}: {format_path(path)}: "
                    "a key must be a scalar"
                )
                continue
            child = (*path, str(key))
            if key in out:
                line = key_node.start_mark.line + 1
                errors.append(f"{source}:{line}: {format_path(child)}: duplicate key")
            out[key] = build(value_node, child)
            lines[child] = key_node.start_mark.line + 1
        return out

    data = build(node, ())
    if errors:
        raise ScenarioError("\n".join(errors))
    return data, lines


def _check_yaml_events(yaml: Any, loader: Any, text: str, source: str) -> None:
    # One pass over the event stream (no recursion, nothing composed): depth, count
    # of values and of aliases, each refused at the line where the bound is crossed.
    depth = values = aliases = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            values += 1
            if depth > MAX_DEPTH:
                raise ScenarioError(
                    f"{source}:{event.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise ScenarioError(
                    f"{source}:{event.start_mark.line + 1}: more than {MAX_ALIASES} aliases"
                )
        elif isinstance(event, yaml.ScalarEvent):
            values += 1
        if values > MAX_NODES:
            raise ScenarioError(
                f"{source}:{event.start_mark.line + 1}: more than {MAX_NODES:,} values"
            )


_TOML_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_\-\"'. ]+?)\s*=")


def load_toml(text: str, source: str) -> tuple[Any, dict[FieldPath, int]]:
    import tomllib

    text = check_text(text, source)
    _check_toml_depth(text, source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        line = f":{match.group(1)}" if match else ":1"
        raise ScenarioError(f"{source}{line}: invalid TOML: {exc}") from None
    except (ValueError, OverflowError, RecursionError) as exc:  # e.g. an int of 5,000 digits
        raise ScenarioError(f"{source}:1: invalid TOML: {str(exc)[:200]}") from None
    return data, _toml_lines(text)


def _check_toml_depth(text: str, source: str) -> None:
    # tomllib parses arrays and inline tables recursively: count the brackets outside
    # strings and comments first. An approximation of TOML's grammar is enough here —
    # anything it misreads, tomllib itself still rejects.
    depth = 0
    line = 1
    i = 0
    n = len(text)
    while i < n:
        char = text[i]
        if char == "\n":
            line += 1
        elif char == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif char in "\"'":
            quote = text[i : i + 3] if text.startswith(char * 3, i) else char
            i += len(quote)
            while i < n and not text.startswith(quote, i):
                if text[i] == "\n":
                    line += 1
                    if len(quote) == 1:
                        break  # an unterminated one-line string: tomllib reports it
                i += 2 if text[i] == "\\" and char == '"' else 1
            i += len(quote)
            continue
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise ScenarioError(f"{source}:{line}: nested deeper than {MAX_DEPTH} levels")
        elif char in "]}":
            depth = max(0, depth - 1)
        i += 1


def _toml_lines(text: str) -> dict[FieldPath, int]:
    # Map field paths to lines for the common TOML shapes: [[routes]] arrays of
    # tables (counted), [routes.match]-style sub-tables, [[routes.sequence]] and
    # `key = value` lines (inline tables are attributed to their key's line).
    lines: dict[FieldPath, int] = {}
    counters: dict[tuple[str | int, ...], int] = {}
    table: FieldPath = ()
    for number, raw in enumerate(text.splitlines(), start=1):
        header = _TOML_TABLE.match(raw)
        if header:
            names = [part.strip().strip("\"'") for part in header.group(1).split(".")]
            is_array = raw.strip().startswith("[[")
            path: list[str | int] = []
            for i, name in enumerate(names):
                path.append(name)
                last = i == len(names) - 1
                if last and is_array:
                    key = tuple(path)
                    counters[key] = counters.get(key, -1) + 1
                    path.append(counters[key])
                elif not last:
                    key = tuple(path)
                    if key in counters:  # an array of tables: the current element
                        path.append(counters[key])
            table = tuple(path)
            for end in range(1, len(table) + 1):  # [a.b.c] also places a and a.b
                lines.setdefault(table[:end], number)
            if is_array:
                lines.setdefault(table[:-1], number)
            continue
        key_match = _TOML_KEY.match(raw)
        if key_match:
            names = [part.strip().strip("\"'") for part in key_match.group(1).split(".")]
            lines.setdefault((*table, *names), number)
    lines.setdefault((), 1)  # a mistake with no line of its own points at the top
    return lines
