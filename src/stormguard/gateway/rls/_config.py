# The rate-limit service's configuration: envoyproxy/ratelimit's YAML, one domain per
# file, plus stormguard's `algorithm:` per limit.
#
#   domain: NAME
#   descriptors:
#     - key: KEY                      # required
#       value: VALUE                  # optional; `*` matches any run of characters
#       rate_limit:                   # optional
#         unit: second|minute|hour|day|week|month|year
#         requests_per_unit: N        # 0 refuses every request
#         unlimited: true             # instead of unit + requests_per_unit
#         name: NAME                  # what another limit's `replaces` names
#         replaces: [{name: NAME}]
#         algorithm: fixed_window     # stormguard: fixed_window (the default, as
#                                     # envoyproxy/ratelimit counts), sliding_window,
#                                     # sliding_log, token_bucket, gcra, concurrency
#         burst: N                    # token_bucket / gcra (default requests_per_unit)
#         lease: SECONDS              # concurrency (default one unit)
#       shadow_mode: true             # decided and counted, never refuses
#       quota_mode: true              # refuses only when every quota descriptor does
#       share_threshold: true         # every value matching the wildcard shares one count
#       detailed_metric: true         # the descriptor's values name its stats
#       value_to_metric: true         # accepted (stormguard's stats are per value anyway)
#       metadata: {...}               # accepted, not sent
#       descriptors: [...]            # nested descriptors
#
# Matching follows envoyproxy/ratelimit: for each entry of a request's descriptor the
# most specific sibling wins -- key and exact value, then the first wildcard value
# in file order, then the key alone; a limit applies only when it sits at the depth
# of the descriptor's last entry. Loading collects every mistake of every file, each
# as `file:line:col: dotted.path: message` through the gateway's own formatting.
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core._limiters import (
    GCRA,
    Algorithm,
    Concurrency,
    FixedWindow,
    SlidingWindowCounter,
    SlidingWindowLog,
    TokenBucket,
)
from .._config import (
    ALGORITHMS,
    FieldPath,
    GatewayConfigError,
    Position,
    _Duplicate,
    _sorted,
    _where,
    _yaml_source,
    dotted,
)

__all__ = ["UNITS", "Domain", "LimitSpec", "Node", "load_domains", "parse_domain"]

# unit -> (seconds, RateLimitResponse.RateLimit.Unit number); months and years as
# envoyproxy/ratelimit counts them (30 and 365 days).
UNITS: dict[str, tuple[int, int]] = {
    "second": (1, 1),
    "minute": (60, 2),
    "hour": (3600, 3),
    "day": (86400, 4),
    "week": (7 * 86400, 7),
    "month": (30 * 86400, 5),
    "year": (365 * 86400, 6),
}
MAX_UINT32 = (1 << 32) - 1
_DESCRIPTOR_KEYS = frozenset(
    (
        "key",
        "value",
        "rate_limit",
        "descriptors",
        "shadow_mode",
        "quota_mode",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
    )
)
_LIMIT_KEYS = frozenset(
    ("unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "lease")
)
_MISPLACED = {  # keys envoyproxy/ratelimit accepts anywhere and then ignores
    "shadow_mode": "the descriptor",
    "quota_mode": "the descriptor",
    "detailed_metric": "the descriptor",
    "unit": "rate_limit",
    "requests_per_unit": "rate_limit",
}


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """One configured limit (or a request's limit override).

    ``label`` is envoyproxy/ratelimit's stats key (``domain.key_value.subkey``);
    ``store_name`` names the state in the store (the label plus the algorithm kind,
    so a reload that keeps the algorithm keeps the counts). ``algorithm`` is None for
    ``unlimited`` limits and for ``requests_per_unit: 0`` (every request refused).
    """

    label: str
    name: str
    unit: str
    requests_per_unit: int
    unlimited: bool = False
    shadow: bool = False
    quota: bool = False
    detailed: bool = False
    replaces: tuple[str, ...] = ()
    algorithm: Algorithm | None = None
    store_name: str = ""

    @property
    def unit_code(self) -> int:
        """The unit as ``RateLimitResponse.RateLimit.Unit``."""
        return UNITS[self.unit][1] if self.unit in UNITS else 0


@dataclass(frozen=True, slots=True)
class Node:
    """One descriptor of the configuration tree and the descriptors nested in it."""

    key: str
    value: str | None
    label: str
    limit: LimitSpec | None = None
    share_threshold: bool = False
    children: Mapping[tuple[str, str | None], Node] = field(default_factory=dict)
    # (key, pattern parts, node) for the wildcard values among the children, in order
    wildcards: tuple[tuple[str, tuple[str, ...], Node], ...] = ()


@dataclass(frozen=True, slots=True)
class Domain:
    """A domain: its top-level descriptors (a root :class:`Node`) and where it came from."""

    name: str
    source: str
    root: Node

    def limits(self) -> list[LimitSpec]:
        """Every configured limit of the domain, in file order."""
        out: list[LimitSpec] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.limit is not None:
                out.append(node.limit)
            stack.extend(reversed(list(node.children.values())))
        return out

    def find(
        self, entries: Sequence[tuple[str, str]]
    ) -> tuple[LimitSpec, tuple[str, ...] | None] | None:
        """The limit for a request's descriptor entries, and the values to count it by.

        The values are None when they are the entries' own; where a
        ``share_threshold`` wildcard matched, the pattern stands for every value it
        matches. None: no limit.
        """
        parent = self.root
        values: list[str] | None = None
        last = len(entries) - 1
        for i, (key, value) in enumerate(entries):
            node = parent.children.get((key, value))
            if node is None:
                for wild_key, parts, wild in parent.wildcards:
                    if wild_key == key and wildcard_match(parts, value):
                        node = wild
                        if wild.share_threshold:
                            if values is None:
                                values = [value for _, value in entries]
                            values[i] = str(wild.value)
                        break
            if node is None:
                node = parent.children.get((key, None))
            if node is None:
                return None
            if i == last:
                if node.limit is None:
                    return None
                return node.limit, None if values is None else tuple(values)
            if not node.children:
                return None
            parent = node
        return None


def wildcard_match(parts: Sequence[str], value: str) -> bool:
    """Whether ``value`` matches a pattern split on ``*`` (each ``*``: zero or more chars)."""
    if len(parts) == 1:
        return parts[0] == value
    first, last = parts[0], parts[-1]
    if not value.startswith(first) or not value.endswith(last):
        return False
    if len(value) < sum(map(len, parts)):
        return False
    rest = value[len(first) : len(value) - len(last)]
    for part in parts[1:-1]:
        at = rest.find(part)
        if at < 0:
            return False
        rest = rest[at + len(part) :]
    return True


# --- building -------------------------------------------------------------------------

Problems = list[tuple[FieldPath, str]]
Flags = tuple[bool, bool, bool]  # shadow_mode, quota_mode, detailed_metric


def _text(value: Any) -> str | None:
    # A YAML scalar as the string envoyproxy/ratelimit (Go, yaml.v2) reads into a
    # string field: `value: 123` is "123", `value: true` is "true".
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    return None


def _flag(data: Mapping[str, Any], name: str, path: FieldPath, problems: Problems) -> bool:
    value = data.get(name, False)
    if not isinstance(value, bool):
        problems.append(((*path, name), f"must be true or false, got {value!r}"))
        return False
    return value


def _count(value: Any, path: FieldPath, problems: Problems, *, low: int = 0) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_UINT32:
        problems.append((path, f"must be a whole number from {low} to {MAX_UINT32}, got {value!r}"))
        return None
    return value


def _algorithm(
    data: Mapping[str, Any], unit: str, rpu: int, path: FieldPath, problems: Problems
) -> Algorithm | None:
    before = len(problems)
    kind = data.get("algorithm", "fixed_window")
    if kind not in ALGORITHMS:
        problems.append(((*path, "algorithm"), f"must be one of {', '.join(ALGORITHMS)}"))
        return None
    for extra, owners in (("burst", ("token_bucket", "gcra")), ("lease", ("concurrency",))):
        if extra in data and kind not in owners:
            problems.append(((*path, extra), f"{kind} takes no {extra}"))
    seconds = UNITS[unit][0]
    burst = data.get("burst", rpu)
    lease = data.get("lease", seconds)
    if "burst" in data and _count(burst, (*path, "burst"), problems, low=1) is None:
        return None
    if "lease" in data and not (
        isinstance(lease, int | float) and not isinstance(lease, bool) and 0 < lease < math.inf
    ):
        problems.append(((*path, "lease"), f"must be a number of seconds > 0, got {lease!r}"))
        return None
    if rpu == 0 or len(problems) > before:
        return None  # requests_per_unit: 0 refuses without asking the store
    if kind in ("token_bucket", "gcra"):
        rate_burst = GCRA if kind == "gcra" else TokenBucket
        return rate_burst(rate=rpu / seconds, burst=burst)
    if kind == "concurrency":
        return Concurrency(limit=rpu, lease=float(lease))
    window: Any = {
        "fixed_window": FixedWindow,
        "sliding_window": SlidingWindowCounter,
        "sliding_log": SlidingWindowLog,
    }[kind]
    return window(limit=rpu, window=seconds)  # type: ignore[no-any-return]


def _limit(
    data: Any, label: str, flags: Flags, path: FieldPath, problems: Problems
) -> LimitSpec | None:
    if not isinstance(data, Mapping):
        problems.append((path, "must be a mapping (unit, requests_per_unit | unlimited, ...)"))
        return None
    before = len(problems)
    _unknown(data, _LIMIT_KEYS, path, problems)
    unlimited = _flag(data, "unlimited", path, problems)
    name = data.get("name", "")
    if not isinstance(name, str):
        problems.append(((*path, "name"), f"must be a string, got {name!r}"))
        name = ""
    replaces: list[str] = []
    raw = data.get("replaces", [])
    if not isinstance(raw, list):
        problems.append(((*path, "replaces"), "must be a list of {name: NAME}"))
        raw = []
    for i, item in enumerate(raw):
        target = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(target, str) or not target:
            problems.append(((*path, "replaces", i), "should not have an empty replaces entry"))
        elif target == name:
            problems.append(
                ((*path, "replaces", i), "replaces should not contain name of same descriptor")
            )
        else:
            replaces.append(target)
    unit = data.get("unit")
    if unlimited:
        for key in ("unit", "requests_per_unit", "algorithm", "burst", "lease"):
            if key in data:
                problems.append(((*path, key), f"should not specify {key} when unlimited"))
        if len(problems) > before:
            return None
        return LimitSpec(label, name, "", 0, True, *flags, replaces=tuple(replaces))
    if not isinstance(unit, str) or unit.lower() not in UNITS:
        problems.append(((*path, "unit"), f"invalid rate limit unit {unit!r} ({', '.join(UNITS)})"))
        unit = "second"
    unit = unit.lower()
    if "requests_per_unit" not in data:
        problems.append((path, "requests_per_unit is required (0 refuses every request)"))
        rpu = 0
    else:
        rpu = _count(data["requests_per_unit"], (*path, "requests_per_unit"), problems) or 0
    algorithm = _algorithm(data, unit, rpu, path, problems)
    if len(problems) > before:
        return None
    kind = "blocked" if algorithm is None else algorithm.kind
    return LimitSpec(
        label,
        name,
        unit,
        rpu,
        False,
        *flags,
        replaces=tuple(replaces),
        algorithm=algorithm,
        store_name=f"{label}#{kind}",
    )


def _unknown(data: Mapping[str, Any], known: frozenset[str], path: FieldPath, p: Problems) -> None:
    for key in data:
        if key in known:
            continue
        where = _MISPLACED.get(str(key))
        hint = f" ({key} belongs in {where})" if where else ""
        p.append(((*path, str(key)), f"unknown key{hint}"))


def _descriptors(data: Any, parent: str, path: FieldPath, problems: Problems) -> list[Node]:
    if data is None:
        return []
    if not isinstance(data, list):
        problems.append((path, "must be a list of descriptors"))
        return []
    nodes: list[Node] = []
    seen: set[tuple[str, str | None]] = set()
    for i, item in enumerate(data):
        here = (*path, i)
        if not isinstance(item, Mapping):
            problems.append((here, f"a descriptor must be a mapping with a key, got {item!r}"))
            continue
        _unknown(item, _DESCRIPTOR_KEYS, here, problems)
        key = _text(item.get("key"))
        if not key:
            problems.append(((*here, "key"), "descriptor has empty key"))
            continue
        value = _text(item["value"]) if item.get("value") not in (None, "") else None
        if "value" in item and item["value"] is not None and value is None:
            problems.append(((*here, "value"), "must be a string"))
        final = key if value is None else f"{key}_{value}"
        label = f"{parent}.{final}"
        if (key, value) in seen:
            problems.append((here, f"duplicate descriptor composite key {label!r}"))
            continue
        seen.add((key, value))
        flags: Flags = (
            _flag(item, "shadow_mode", here, problems),
            _flag(item, "quota_mode", here, problems),
            _flag(item, "detailed_metric", here, problems),
        )
        share = _flag(item, "share_threshold", here, problems)
        _flag(item, "value_to_metric", here, problems)
        if share and (value is None or "*" not in value):
            problems.append(
                ((*here, "share_threshold"), "share_threshold needs a wildcard value (with '*')")
            )
        limit = None
        if "rate_limit" in item:
            limit = _limit(item["rate_limit"], label, flags, (*here, "rate_limit"), problems)
        children = _descriptors(item.get("descriptors"), label, (*here, "descriptors"), problems)
        nodes.append(_node(key, value, label, limit, share, children))
    return nodes


def _node(
    key: str,
    value: str | None,
    label: str,
    limit: LimitSpec | None,
    share: bool,
    children: Iterable[Node],
) -> Node:
    kids = list(children)
    wild = tuple(
        (kid.key, tuple(kid.value.split("*")), kid)
        for kid in kids
        if kid.value is not None and "*" in kid.value
    )
    return Node(key, value, label, limit, share, {(k.key, k.value): k for k in kids}, wild)


def _build(data: Any, source: str, problems: Problems) -> Domain | None:
    if not isinstance(data, Mapping):
        problems.append(((), f"the document must be a mapping, got {type(data).__name__}"))
        return None
    _unknown(data, frozenset(("domain", "descriptors")), (), problems)
    name = _text(data.get("domain"))
    if not name:
        problems.append((("domain",), "config file cannot have empty domain"))
        name = ""
    nodes = _descriptors(data.get("descriptors"), name, ("descriptors",), problems)
    return Domain(name, source, _node("", None, name, None, False, nodes))


def _lines(source: str, positions: Mapping[FieldPath, Position], problems: Problems) -> list[str]:
    return [
        f"{source}:{_where(positions, path)}: {dotted(path)}: {message}"
        for path, message in _sorted(problems, positions)
    ]


def parse_domain(text: str, source: str = "<config>") -> Domain:
    """Validate one configuration document (one domain).

    Raises :class:`GatewayConfigError` with one ``source:line:col: path: message``
    line per mistake.
    """
    domain, errors = _parse(text, source)
    if errors:
        raise GatewayConfigError(errors)
    assert domain is not None
    return domain


def _parse(text: str, source: str) -> tuple[Domain | None, list[str]]:
    try:
        data, positions = _yaml_source(text)
    except _Duplicate as dup:
        return None, [f"{source}:{dup.line}:{dup.col}: {dotted(dup.path)}: duplicate key"]
    except Exception as exc:  # yaml.MarkedYAMLError
        mark = getattr(exc, "problem_mark", None)
        where = f"{mark.line + 1}:{mark.column + 1}" if mark is not None else "1:1"
        problem = getattr(exc, "problem", None) or str(exc)
        return None, [f"{source}:{where}: <top>: invalid YAML: {problem}"]
    problems: Problems = []
    domain = _build(data, source, problems)
    return domain, _lines(source, positions, problems)


def load_domains(paths: Sequence[str | Path]) -> dict[str, Domain]:
    """Read and validate every file (one domain each); all their mistakes at once.

    A domain configured in two files is an error (envoyproxy/ratelimit's default).
    """
    errors: list[str] = []
    domains: dict[str, Domain] = {}
    for path in map(Path, paths):
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            errors.append(f"{source}:1:1: <top>: cannot read: {exc.strerror}")
            continue
        domain, found = _parse(text, source)
        errors.extend(found)
        if domain is None or found:
            continue
        if domain.name in domains:
            first = domains[domain.name].source
            _, positions = _yaml_source(text)
            errors.extend(
                _lines(source, positions, [(("domain",), f"duplicate domain (also in {first})")])
            )
            continue
        domains[domain.name] = domain
    if not paths:
        errors.append("<config>:1:1: <top>: give at least one --config FILE")
    if errors:
        raise GatewayConfigError(errors)
    return domains
