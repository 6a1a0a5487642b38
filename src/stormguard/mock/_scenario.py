# Scenario files: parse YAML or TOML, validate, and build frozen value objects.
#
# Every error names the source, the line and the field path, e.g.
#
#     payments.yaml:14: routes[0].sequence[1].fault: unknown value 'comit-then-reset';
#     expected one of: commit-then-504, commit-then-reset, empty, hang, malformed-chunked, reset
#
# Lines come from _sources.py (YAML node marks; a search of the source for TOML). A
# dict passed from Python has no lines; only the field path is given.
#
# Validation collects every error before raising, so one run shows all mistakes.
# The keys below are public and stay working once released (README documents them).
from __future__ import annotations

import difflib
import json
import math
import random
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .._errors import ScenarioError
from ._sources import MAX_BYTES, FieldPath, decode_source, format_path, load_toml, load_yaml

__all__ = [
    "FAULTS",
    "Delay",
    "Match",
    "RateLimit",
    "Route",
    "Scenario",
    "Step",
    "load_scenario",
    "parse_scenario",
    "vendor_scenario",
]
VENDORS = ("anthropic", "aws", "github", "openai", "stripe")

FAULTS = (
    "commit-then-504",
    "commit-then-reset",
    "empty",
    "hang",
    "malformed-chunked",
    "reset",
)
MAX_STEPS = 100_000  # steps of one route once `repeat` is expanded
SEQUENCE_PER = ("idempotency-key", "client", "global")
HEADER_STYLES = ("github", "ietf", "openai", "stripe")
ALGORITHMS = ("fixed-window", "token-bucket")
PER = ("client", "global")


# --- value objects ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delay:
    """A delay distribution in seconds: fixed, uniform(low, high) or lognormal."""

    kind: Literal["fixed", "uniform", "lognormal"]
    low: float = 0.0  # fixed: the delay; uniform: lower bound
    high: float = 0.0  # uniform: upper bound
    median: float = 0.0  # lognormal: exp(mu)
    sigma: float = 0.0  # lognormal: standard deviation of log(delay)
    cap: float | None = None  # lognormal: optional ceiling

    def draw(self, rng: random.Random) -> float:
        """One delay in seconds."""
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.uniform(self.low, self.high)
        value = rng.lognormvariate(math.log(self.median), self.sigma)
        return value if self.cap is None else min(value, self.cap)


@dataclass(frozen=True, slots=True)
class Step:
    """One scripted answer: a status (with headers and body) or a fault."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    fault: str | None = None
    delay: Delay | None = None
    probability: float | None = None

    @property
    def is_success(self) -> bool:
        """A plain 1xx/2xx/3xx answer (it creates the side effect on a resource)."""
        return self.fault is None and self.status < 400


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``limit`` requests per ``window`` seconds, per client or global."""

    limit: int
    window: float
    per: Literal["client", "global"] = "client"
    headers: Literal["github", "ietf", "openai", "stripe"] = "ietf"
    algorithm: Literal["fixed-window", "token-bucket"] = "fixed-window"
    status: int = 429  # the refusal's status: 429, or 403 as GitHub also answers
    retry_after: bool = True  # the refusal carries Retry-After (GitHub's primary does not)
    secondary: bool = False  # a GitHub secondary limit: Retry-After, no X-RateLimit-*


@dataclass(frozen=True, slots=True)
class Match:
    """Which requests a route answers: a method (or any) and a path (``*`` globs)."""

    path: str
    methods: frozenset[str] | None = None

    def matches(self, method: str, path: str) -> bool:
        if self.methods is not None and method.upper() not in self.methods:
            return False
        if "*" in self.path:
            return re.fullmatch(re.escape(self.path).replace(r"\*", ".*"), path) is not None
        return path == self.path


@dataclass(frozen=True, slots=True)
class Route:
    """A matched path with its sequence of steps, resource, rate limit and delay."""

    match: Match
    sequence: tuple[Step, ...] = (Step(),)
    sequence_per: Literal["idempotency-key", "client", "global"] = "global"
    resource: str | None = None
    rate_limit: RateLimit | None = None
    delay: Delay | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario: routes tried in order, and the RNG seed."""

    routes: tuple[Route, ...]
    seed: int | None = None
    name: str | None = None
    source: str = field(default="<dict>", compare=False)

    def route_for(self, method: str, path: str) -> tuple[int, Route] | None:
        for index, route in enumerate(self.routes):
            if route.match.matches(method, path):
                return index, route
        return None


# --- loading ----------------------------------------------------------------------


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (``.yaml``/``.yml`` or ``.toml``).

    Raises :class:`stormguard.ScenarioError` naming the file, the line and the field
    path of every mistake.
    """
    path = Path(path)
    source = path.name
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_BYTES + 1)  # never more than the cap, whatever the size
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario: {exc.strerror or exc}") from exc
    text = decode_source(raw, source)
    if path.suffix.lower() == ".toml":
        data, lines = load_toml(text, source)
    else:
        data, lines = load_yaml(text, source)
    return _Validator(source, lines).scenario(data)


def vendor_scenario(name: str) -> Scenario:
    """A scenario that plays a vendor's API as its SDK meets it (``"openai"``,
    ``"anthropic"``, ``"stripe"``, ``"github"``, ``"aws"``): the retryable answers
    it sends (with its own hint and should-retry headers) and a final one. Each
    file (``stormguard/mock/vendors/NAME.yaml``) says which SDK code it follows;
    ``RetryPolicy.for_api(NAME)`` is tested against it."""
    from importlib import resources

    if name not in VENDORS:
        raise ScenarioError(f"unknown vendor {name!r}; expected one of: {', '.join(VENDORS)}")
    text = resources.files(__package__).joinpath("vendors", f"{name}.yaml").read_text("utf-8")
    return parse_scenario(text, source=f"{name}.yaml")


def parse_scenario(
    data: Mapping[str, Any] | str, *, source: str = "<dict>", format: str = "yaml"
) -> Scenario:
    """Validate a scenario given as a dict, or as YAML/TOML text (``format``)."""
    if isinstance(data, str):
        if format == "toml":
            loaded, lines = load_toml(data, source)
        else:
            loaded, lines = load_yaml(data, source)
        return _Validator(source, lines).scenario(loaded)
    return _Validator(source, {}).scenario(data)


# --- validation -------------------------------------------------------------------


class _Validator:
    def __init__(self, source: str, lines: dict[FieldPath, int]) -> None:
        self.source = source
        self.lines = lines
        self.errors: list[str] = []

    def err(self, path: FieldPath, message: str) -> None:
        line = None
        probe = path
        while probe:  # the nearest enclosing field that has a known line
            if probe in self.lines:
                line = self.lines[probe]
                break
            probe = probe[:-1]
        if line is None:
            line = self.lines.get(())
        where = f"{self.source}:{line}" if line is not None else self.source
        self.errors.append(f"{where}: {format_path(path)}: {message}")

    # helpers -----------------------------------------------------------------

    def mapping(
        self, value: Any, path: FieldPath, allowed: tuple[str, ...]
    ) -> dict[str, Any] | None:
        if not isinstance(value, Mapping):
            self.err(path, f"expected a mapping, got {_kind(value)}")
            return None
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key not in allowed:
                hint = difflib.get_close_matches(str(key), allowed, n=1)
                extra = f"; did you mean '{hint[0]}'?" if hint else ""
                self.err(
                    (*path, str(key)),
                    f"unknown key; expected one of: {', '.join(allowed)}{extra}",
                )
                continue
            out[key] = item
        return out

    def number(
        self,
        value: Any,
        path: FieldPath,
        *,
        minimum: float = 0.0,
        strict: bool = False,
        maximum: float | None = None,
    ) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.err(path, f"expected a number, got {_kind(value)}")
            return None
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number) or number < minimum or (strict and number == minimum):
            bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
            self.err(path, f"must be {bound}, got {_short(value)}")
            return None
        if maximum is not None and number > maximum:
            self.err(path, f"must be <= {maximum:g}, got {_short(value)}")
            return None
        return number

    def integer(self, value: Any, path: FieldPath, *, low: int, high: int) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(path, f"expected an integer, got {_kind(value)}")
            return None
        if not low <= value <= high:
            self.err(path, f"must be between {low} and {high}, got {value}")
            return None
        return value

    def choice(self, value: Any, path: FieldPath, allowed: tuple[str, ...]) -> str | None:
        if not isinstance(value, str) or value not in allowed:
            hint = difflib.get_close_matches(str(value), allowed, n=1)
            extra = f"; did you mean '{hint[0]}'?" if hint else ""
            self.err(
                path, f"unknown value {_short(value)}; expected one of: {', '.join(allowed)}{extra}"
            )
            return None
        return value

    # the schema --------------------------------------------------------------

    def scenario(self, data: Any) -> Scenario:
        top = self.mapping(data, (), ("name", "seed", "routes"))
        routes: list[Route] = []
        seed: int | None = None
        name: str | None = None
        if top is not None:
            if "seed" in top:
                seed = self.integer(top["seed"], ("seed",), low=0, high=2**63)
            if "name" in top:
                if isinstance(top["name"], str):
                    name = top["name"]
                else:
                    self.err(("name",), f"expected a string, got {_kind(top['name'])}")
            raw_routes = top.get("routes")
            if raw_routes is None:
                self.err(("routes",), "required: a list of routes")
            elif not isinstance(raw_routes, list) or not raw_routes:
                self.err(("routes",), f"expected a non-empty list, got {_kind(raw_routes)}")
            else:
                for i, raw in enumerate(raw_routes):
                    route = self.route(raw, ("routes", i))
                    if route is not None:
                        routes.append(route)
        if self.errors:
            raise ScenarioError("\n".join(self.errors))
        return Scenario(routes=tuple(routes), seed=seed, name=name, source=self.source)

    def route(self, raw: Any, path: FieldPath) -> Route | None:
        allowed = ("match", "sequence", "sequence_per", "resource", "rate_limit", "delay")
        data = self.mapping(raw, path, allowed)
        if data is None:
            return None
        before = len(self.errors)
        match = self.match(data.get("match"), (*path, "match"))
        sequence: list[Step] = []
        raw_sequence = data.get("sequence", [{"status": 200}])
        if not isinstance(raw_sequence, list) or not raw_sequence:
            self.err((*path, "sequence"), f"expected a non-empty list, got {_kind(raw_sequence)}")
        else:
            for i, raw_step in enumerate(raw_sequence):
                sequence.extend(self.step(raw_step, (*path, "sequence", i)))
                if len(sequence) > MAX_STEPS:
                    self.err(
                        (*path, "sequence"), f"more than {MAX_STEPS:,} steps (repeat included)"
                    )
                    break
        per = self.choice(data.get("sequence_per", "global"), (*path, "sequence_per"), SEQUENCE_PER)
        resource = data.get("resource")
        if resource is not None and (not isinstance(resource, str) or not resource):
            self.err((*path, "resource"), f"expected a name, got {_kind(resource)}")
        rate_limit = None
        if "rate_limit" in data:
            rate_limit = self.rate_limit(data["rate_limit"], (*path, "rate_limit"))
        delay = self.delay(data["delay"], (*path, "delay")) if "delay" in data else None
        if len(self.errors) > before or match is None or per is None:
            return None
        return Route(
            match=match,
            sequence=tuple(sequence),
            sequence_per=per,  # type: ignore[arg-type]
            resource=resource,
            rate_limit=rate_limit,
            delay=delay,
        )

    def match(self, raw: Any, path: FieldPath) -> Match | None:
        if raw is None:
            self.err(path, "required: {method: ..., path: ...}")
            return None
        data = self.mapping(raw, path, ("method", "path"))
        if data is None:
            return None
        route_path = data.get("path")
        if not isinstance(route_path, str) or not route_path.startswith("/"):
            self.err(
                (*path, "path"), f"expected a path starting with '/', got {_short(route_path)}"
            )
            return None
        methods: frozenset[str] | None = None
        method = data.get("method")
        if method is not None:
            names = method if isinstance(method, list) else [method]
            if not names or not all(isinstance(m, str) and m.isalpha() for m in names):
                self.err((*path, "method"), f"expected a method or a list, got {_short(method)}")
                return None
            methods = frozenset(m.upper() for m in names)
        return Match(path=route_path, methods=methods)

    def step(self, raw: Any, path: FieldPath) -> list[Step]:
        allowed = ("status", "headers", "body", "fault", "delay", "probability", "repeat")
        data = self.mapping(raw, path, allowed)
        if data is None:
            return []
        before = len(self.errors)
        fault = None
        if "fault" in data:
            fault = self.choice(data["fault"], (*path, "fault"), FAULTS)
            if "status" in data:
                self.err((*path, "status"), "a step has either a status or a fault, not both")
        status = 200
        if "status" in data:
            status = self.integer(data["status"], (*path, "status"), low=200, high=599) or 200
        if fault == "commit-then-504":
            status = 504
        headers: list[tuple[str, str]] = []
        if "headers" in data:
            raw_headers = data["headers"]
            if not isinstance(raw_headers, Mapping):
                self.err((*path, "headers"), f"expected a mapping, got {_kind(raw_headers)}")
            else:
                for key, value in raw_headers.items():
                    header = self.header(key, value, (*path, "headers", str(key)))
                    if header is not None:
                        headers.append(header)
        body = b""
        if "body" in data:
            raw_body = data["body"]
            if isinstance(raw_body, str):
                body = raw_body.encode()
            elif isinstance(raw_body, Mapping | list):
                try:
                    body = json.dumps(raw_body, separators=(",", ":"), allow_nan=False).encode()
                except (TypeError, ValueError, RecursionError) as exc:  # a date, NaN, ...
                    self.err((*path, "body"), f"cannot be sent as JSON: {exc}")
                if not any(k.lower() == "content-type" for k, _ in headers):
                    headers.append(("Content-Type", "application/json"))
            else:
                self.err((*path, "body"), f"expected a string or a mapping, got {_kind(raw_body)}")
        delay = self.delay(data["delay"], (*path, "delay")) if "delay" in data else None
        probability = None
        if "probability" in data:
            probability = self.number(data["probability"], (*path, "probability"), maximum=1.0)
        repeat = 1
        if "repeat" in data:
            repeat = self.integer(data["repeat"], (*path, "repeat"), low=1, high=10_000) or 1
        if len(self.errors) > before:
            return []
        step = Step(
            status=status,
            headers=tuple(headers),
            body=body,
            fault=fault,
            delay=delay,
            probability=probability,
        )
        return [step] * repeat

    def header(self, name: Any, value: Any, path: FieldPath) -> tuple[str, str] | None:
        # RFC 9110 5.1 (a name is a token) and 5.5 (a value has no CR, LF or NUL),
        # ASCII only: h11 would refuse anything else at serve time.
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            self.err(
                path, "not a valid header name (RFC 9110 token: letters, digits, !#$%&'*+-.^_`|~)"
            )
            return None
        if name.lower() in _FRAMING_HEADERS:
            self.err(path, "the server frames the body itself (Content-Length); leave it out")
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            self.err(path, "expected a string or a number")
            return None
        if isinstance(value, str):
            text = value
        elif isinstance(value, int):
            text = str(value) if abs(value) < 10**100 else ""
        else:
            text = f"{value:g}"
        if not text or not _FIELD_VALUE.fullmatch(text):
            self.err(
                path,
                f"not a valid header value {_short(value)} (RFC 9110: printable ASCII, spaces "
                "and tabs inside; no CR, LF or NUL)",
            )
            return None
        return name, text

    def delay(self, raw: Any, path: FieldPath) -> Delay | None:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            value = self.number(raw, path)
            return None if value is None else Delay("fixed", low=value)
        data = self.mapping(raw, path, ("fixed", "uniform", "lognormal"))
        if data is None:
            return None
        if len(data) != 1:
            self.err(path, "expected exactly one of: fixed, uniform, lognormal")
            return None
        kind, value = next(iter(data.items()))
        sub = (*path, kind)
        if kind == "fixed":
            seconds = self.number(value, sub)
            return None if seconds is None else Delay("fixed", low=seconds)
        if kind == "uniform":
            if not isinstance(value, list) or len(value) != 2:
                self.err(sub, "expected [low, high] in seconds")
                return None
            low = self.number(value[0], (*sub, 0))
            high = self.number(value[1], (*sub, 1))
            if low is None or high is None:
                return None
            if high < low:
                self.err(sub, f"high ({high:g}) must be >= low ({low:g})")
                return None
            return Delay("uniform", low=low, high=high)
        params = self.mapping(value, sub, ("median", "sigma", "max"))
        if params is None:
            return None
        if "median" not in params or "sigma" not in params:
            self.err(sub, "expected {median: seconds, sigma: number} (and optional max)")
            return None
        median = self.number(params["median"], (*sub, "median"), strict=True)
        sigma = self.number(params["sigma"], (*sub, "sigma"))
        cap = self.number(params["max"], (*sub, "max"), strict=True) if "max" in params else None
        if median is None or sigma is None or ("max" in params and cap is None):
            return None
        return Delay("lognormal", median=median, sigma=sigma, cap=cap)

    def rate_limit(self, raw: Any, path: FieldPath) -> RateLimit | None:
        allowed = (
            "limit",
            "window",
            "per",
            "headers",
            "algorithm",
            "status",
            "retry_after",
            "secondary",
        )
        data = self.mapping(raw, path, allowed)
        if data is None:
            return None
        before = len(self.errors)
        if "limit" not in data or "window" not in data:
            self.err(path, "required: limit (requests) and window (seconds)")
            return None
        limit = self.integer(data["limit"], (*path, "limit"), low=1, high=10**9)
        window = self.number(data["window"], (*path, "window"), strict=True)
        per = self.choice(data.get("per", "client"), (*path, "per"), PER)
        style = self.choice(data.get("headers", "ietf"), (*path, "headers"), HEADER_STYLES)
        algorithm = self.choice(
            data.get("algorithm", "fixed-window"), (*path, "algorithm"), ALGORITHMS
        )
        status = data.get("status", 429)
        if status not in (403, 429) or isinstance(status, bool):
            self.err((*path, "status"), f"expected 429 or 403, got {_short(status)}")
        flags = {}
        for name, default in (("retry_after", True), ("secondary", False)):
            flags[name] = data.get(name, default)
            if not isinstance(flags[name], bool):
                self.err((*path, name), f"expected true or false, got {_kind(flags[name])}")
        if flags["secondary"] is True and style != "github":
            self.err((*path, "secondary"), "a secondary limit is GitHub's: needs headers: github")
        if len(self.errors) > before or limit is None or window is None:
            return None
        return RateLimit(
            limit=limit,
            window=window,
            per=per,  # type: ignore[arg-type]
            headers=style,  # type: ignore[arg-type]
            algorithm=algorithm,  # type: ignore[arg-type]
            status=status,
            retry_after=flags["retry_after"],
            secondary=flags["secondary"],
        )


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"[\x21-\x7e]([\x20\x09\x21-\x7e]*[\x21-\x7e])?")
_FRAMING_HEADERS = frozenset({"transfer-encoding"})
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60


def _short(value: Any) -> str:
    try:
        return _REPR.repr(value)
    except ValueError:  # an int past the interpreter's digit limit
        return f"<{type(value).__name__} too large to show>"


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {_short(value)}"
