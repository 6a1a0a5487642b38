# Reading scenario sources with the line of every value, so that validation errors
# can say "payments.yaml:14: routes[0].sequence[1].fault: ...".
#
# YAML: we compose the node tree ourselves (yaml.compose) so that every value keeps
# the line it came from; scalars are resolved with PyYAML's SafeConstructor, and a
# duplicate key is an error. TOML: tomllib gives no positions, so the line is found
# by a small search of the source for the key (tables, arrays of tables and
# `key = value` lines) — good enough to point at the mistake.
from __future__ import annotations

import re
from typing import Any

from .._errors import MissingExtra, ScenarioError

__all__ = ["FieldPath", "format_path", "load_toml", "load_yaml"]

FieldPath = tuple[str | int, ...]


def format_path(path: FieldPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out or "<top>"


def load_yaml(text: str, source: str) -> tuple[Any, dict[FieldPath, int]]:
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - needs the extra missing
        raise MissingExtra("yaml", "mock") from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"{source}{line}: invalid YAML: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: invalid YAML: {exc}") from exc
    if node is None:
        return {}, {}
    lines: dict[FieldPath, int] = {}
    constructor = yaml.constructor.SafeConstructor()
    errors: list[str] = []

    def build(n: yaml.Node, path: FieldPath) -> Any:
        lines[path] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in n.value:
                key = build(key_node, (*path, "<key>"))
                if isinstance(key, list | dict):
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
        if isinstance(n, yaml.SequenceNode):
            return [build(item, (*path, i)) for i, item in enumerate(n.value)]
        return constructor.construct_object(n, deep=True)

    data = build(node, ())
    if errors:
        raise ScenarioError("\n".join(errors))
    return data, lines


_TOML_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_\-\"'. ]+?)\s*=")


def load_toml(text: str, source: str) -> tuple[Any, dict[FieldPath, int]]:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        line = f":{match.group(1)}" if match else ""
        raise ScenarioError(f"{source}{line}: invalid TOML: {exc}") from exc
    return data, _toml_lines(text)


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
            lines.setdefault(table, number)
            if is_array:
                lines.setdefault(table[:-1], number)
            continue
        key_match = _TOML_KEY.match(raw)
        if key_match:
            names = [part.strip().strip("\"'") for part in key_match.group(1).split(".")]
            lines.setdefault((*table, *names), number)
    return lines
