"""Scenario files: loading, defaults, and errors that name file, line and field."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stormguard import ScenarioError
from stormguard.mock import load_scenario, parse_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_example_scenario_loads() -> None:
    """examples/payments.yaml is valid and keeps its routes in order."""
    scenario = load_scenario(EXAMPLES / "payments.yaml")
    assert scenario.seed == 42
    payments = scenario.routes[0]
    assert payments.resource == "payments"
    assert payments.sequence_per == "idempotency-key"
    assert [s.fault for s in payments.sequence] == ["commit-then-reset", None, None]
    assert payments.sequence[1].headers == (("Retry-After", "1"),)
    assert scenario.routes[1].rate_limit is not None
    assert scenario.routes[1].rate_limit.headers == "github"


def test_defaults_of_a_bare_route() -> None:
    """A route with only a match answers 200 for everyone, without side effects."""
    scenario = parse_scenario({"routes": [{"match": {"path": "/x"}}]})
    (route,) = scenario.routes
    assert route.sequence_per == "global"
    assert route.resource is None
    assert [(s.status, s.fault) for s in route.sequence] == [(200, None)]
    assert route.match.matches("DELETE", "/x")
    assert not route.match.matches("GET", "/y")


def test_glob_path_and_method_list() -> None:
    """`*` in a path matches any run of characters; methods may be a list."""
    route = parse_scenario(
        {"routes": [{"match": {"method": ["get", "HEAD"], "path": "/v1/*/items"}}]}
    ).routes[0]
    assert route.match.matches("GET", "/v1/abc/items")
    assert route.match.matches("HEAD", "/v1/a/b/items")
    assert not route.match.matches("POST", "/v1/abc/items")


def test_repeat_expands_a_step() -> None:
    """`repeat: n` stands for n copies of the step."""
    route = parse_scenario(
        {"routes": [{"match": {"path": "/"}, "sequence": [{"status": 503, "repeat": 3}, {}]}]}
    ).routes[0]
    assert [s.status for s in route.sequence] == [503, 503, 503, 200]


@pytest.mark.parametrize(
    ("delay", "low", "high"),
    [
        (0.25, 0.25, 0.25),
        ({"fixed": 0.1}, 0.1, 0.1),
        ({"uniform": [0.01, 0.05]}, 0.01, 0.05),
        ({"lognormal": {"median": 0.05, "sigma": 1.0, "max": 0.3}}, 0.0, 0.3),
    ],
)
def test_delays_draw_within_bounds(delay: object, low: float, high: float) -> None:
    """Fixed, uniform and lognormal delays draw within their bounds."""
    route = parse_scenario({"routes": [{"match": {"path": "/"}, "delay": delay}]}).routes[0]
    assert route.delay is not None
    rng = random.Random(3)
    draws = [route.delay.draw(rng) for _ in range(200)]
    assert all(low <= d <= high for d in draws)


BAD_YAML = """\
seed: 7
routes:
  - match: {method: POST, path: /v1/payments}
    sequence_per: idempotency-key
    resource: payments
    sequence:
      - fault: comit-then-reset
      - status: 503
        headers: {Retry-After: "1"}
      - status: 2010
  - match: {method: GET, path: /v1/items}
    rate_limit: {limit: 5, window: 1, per: client, header: github}
    delay: {uniform: [0.05, 0.01]}
"""


@pytest.mark.parametrize(
    ("line", "field", "words"),
    [
        (7, "routes[0].sequence[0].fault", "did you mean 'commit-then-reset'"),
        (10, "routes[0].sequence[2].status", "between 200 and 599"),
        (12, "routes[1].rate_limit.header", "did you mean 'headers'"),
        (13, "routes[1].delay.uniform", "must be >= low"),
    ],
)
def test_yaml_mistakes_name_file_line_and_field(
    tmp_path: Path, line: int, field: str, words: str
) -> None:
    """Every mistake in a YAML file is reported with file:line: field path."""
    path = tmp_path / "bad.yaml"
    path.write_text(BAD_YAML)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    lines = str(caught.value).splitlines()
    assert len(lines) == 4
    assert any(entry.startswith(f"bad.yaml:{line}: {field}:") and words in entry for entry in lines)


def test_toml_mistakes_name_line_and_field(tmp_path: Path) -> None:
    """TOML scenarios are validated too, with the line of the offending key."""
    path = tmp_path / "bad.toml"
    path.write_text(
        'seed = 7\n\n[[routes]]\nmatch = {method = "POST", path = "/v1/payments"}\n'
        'resource = "payments"\n\n[[routes.sequence]]\nfault = "reset"\n\n'
        '[[routes.sequence]]\nstatus = "x"\n\n[[routes]]\nmatch = {path = "/a"}\n'
        "delay = {lognormal = {median = 0, sigma = 1}}\n"
    )
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert str(caught.value).splitlines() == [
        "bad.toml:11: routes[0].sequence[1].status: expected an integer, got str 'x'",
        "bad.toml:15: routes[1].delay.lognormal.median: must be > 0, got 0",
    ]


def test_valid_toml_matches_yaml(tmp_path: Path) -> None:
    """The same scenario in TOML and YAML gives equal objects."""
    toml = tmp_path / "s.toml"
    toml.write_text(
        '[[routes]]\nmatch = {method = "POST", path = "/p"}\nresource = "r"\n'
        'sequence_per = "client"\n[[routes.sequence]]\nfault = "commit-then-504"\n'
        "[[routes.sequence]]\nstatus = 201\n"
    )
    yaml_text = (
        "routes:\n  - match: {method: POST, path: /p}\n    resource: r\n"
        "    sequence_per: client\n    sequence:\n      - fault: commit-then-504\n"
        "      - status: 201\n"
    )
    assert load_scenario(toml).routes == parse_scenario(yaml_text).routes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("routes: [\n", "s.yaml:2: invalid YAML"),
        (
            "routes:\n  - match: {path: /a}\n    match: {path: /b}\n",
            "s.yaml:3: routes[0].match: duplicate key",
        ),
        ("route: []\n", "s.yaml:1: route: unknown key"),
        ("routes:\n  - match: {path: a}\n", "s.yaml:2: routes[0].match.path: expected a path"),
        (
            "routes:\n  - match: {path: /a}\n    sequence:\n      - {fault: reset, status: 500}\n",
            "s.yaml:4: routes[0].sequence[0].status: a step has either a status or a fault",
        ),
        (
            "routes:\n  - match: {path: /a}\n    sequence:\n      - probability: 1.5\n",
            "s.yaml:4: routes[0].sequence[0].probability: must be <= 1",
        ),
        (
            "routes:\n  - match: {path: /a}\n    rate_limit: {limit: 0, window: 1}\n",
            "s.yaml:3: routes[0].rate_limit.limit: must be between 1",
        ),
        ("seed: 1\n", "s.yaml:1: routes: required"),
    ],
)
def test_common_mistakes(tmp_path: Path, text: str, expected: str) -> None:
    """Syntax errors, duplicate keys, unknown keys and bad values point at their line."""
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=None) as caught:
        load_scenario(path)
    assert expected in str(caught.value)


def test_dict_errors_name_the_field() -> None:
    """A scenario given as a dict reports the field path (no line to give)."""
    with pytest.raises(ScenarioError, match=r"<dict>: routes\[0\]\.sequence_per: unknown value"):
        parse_scenario({"routes": [{"match": {"path": "/"}, "sequence_per": "user"}]})


def test_scenario_error_is_a_value_error() -> None:
    """ScenarioError is part of stormguard's tree and also a ValueError."""
    with pytest.raises(ValueError):
        parse_scenario({"routes": []})


def test_toml_example_equals_the_yaml_example() -> None:
    """examples/payments.toml describes the same scenario as examples/payments.yaml."""
    toml = load_scenario(EXAMPLES / "payments.toml")
    yaml = load_scenario(EXAMPLES / "payments.yaml")
    assert toml == yaml
