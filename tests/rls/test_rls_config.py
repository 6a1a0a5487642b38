"""The rate-limit service's config: envoyproxy/ratelimit's format, matching and errors.

The cases (configs, lookups and expected answers) follow envoyproxy/ratelimit's own
configuration tests and README examples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stormguard import FixedWindow, SlidingWindowCounter, SlidingWindowLog, TokenBucket
from stormguard.gateway._config import GatewayConfigError
from stormguard.gateway.rls._config import load_domains, parse_domain, wildcard_match

BASIC = """\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: key6
    rate_limit: {unlimited: true}
"""

WILDCARD = """\
domain: test-domain
descriptors:
  - {key: wild, value: "foo*", rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: noWild, value: foo, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: noVal, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: midWild, value: "bar*b", rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: multiWild, value: "foo*bar*baz", rate_limit: {unit: minute, requests_per_unit: 10}}
  - key: nestedWild
    value: val1
    descriptors:
      - {key: wild, value: "goo*", rate_limit: {unit: minute, requests_per_unit: 20}}
"""


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([("key1", "something")], None),
        ([("key1", "value1")], None),  # a placeholder without a limit
        ([("key2", "value2"), ("subkey", "subvalue")], None),  # deeper than the config
        ([("key5", "value5"), ("subkey5", "subvalue")], None),
        ([("key1", "value1"), ("subkey1", "something")], ("key1_value1.subkey1", 5, "second")),
        (
            [("key1", "value1"), ("subkey1", "subvalue1")],
            ("key1_value1.subkey1_subvalue1", 10, "second"),
        ),
        ([("key2", "something")], ("key2", 20, "minute")),
        ([("key2", "value2")], ("key2_value2", 30, "minute")),
        ([("key2", "value3")], None),  # a value without a limit: allowed through
        ([("key3", "foo")], ("key3", 1, "hour")),
        ([("key4", "foo")], ("key4", 1, "day")),
        ([("key5", "value5")], ("key5_value5", 15, "day")),
        (
            [("key5", "value5"), ("subkey5", "subvalue5")],
            ("key5_value5.subkey5_subvalue5", 25, "day"),
        ),
    ],
)
def test_most_specific_match_at_the_descriptors_depth(
    entries: list[tuple[str, str]], expected: tuple[str, int, str] | None
) -> None:
    """Key and value beat key alone, and a limit applies only at the request's depth."""
    domain = parse_domain(BASIC)
    found = domain.find(entries)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        spec, values = found
        assert (spec.label, spec.requests_per_unit, spec.unit) == (
            f"test-domain.{expected[0]}",
            *expected[1:],
        )
        assert values is None  # counted by the request's own values


def test_named_and_unlimited_limits() -> None:
    """A rate_limit's name is kept; an unlimited limit has no algorithm to ask."""
    domain = parse_domain(BASIC)
    named = domain.find([("key4", "x")])
    unlimited = domain.find([("key6", "x")])
    assert named is not None and named[0].name == "key4_rate_limit"
    assert unlimited is not None and unlimited[0].unlimited and unlimited[0].algorithm is None


@pytest.mark.parametrize(
    ("entries", "label"),
    [
        ([("noVal", "foo1")], "noVal"),
        ([("wild", "foo1")], "wild_foo*"),
        ([("wild", "foo2")], "wild_foo*"),
        ([("nestedWild", "val1"), ("wild", "goo2")], "nestedWild_val1.wild_goo*"),
        ([("wild", "bar")], None),
        ([("noWild", "foo1")], None),  # no wildcard: no eager match
        ([("midWild", "barab")], "midWild_bar*b"),
        ([("midWild", "bar123b")], "midWild_bar*b"),
        ([("midWild", "barb")], "midWild_bar*b"),  # `*` matches the empty string
        ([("midWild", "bara")], None),
        ([("midWild", "xbarb")], None),
        ([("multiWild", "foo123bar456baz")], "multiWild_foo*bar*baz"),
        ([("multiWild", "foobarbaz")], "multiWild_foo*bar*baz"),
        ([("multiWild", "foo123baz")], None),
        ([("multiWild", "bar456baz")], None),
    ],
)
def test_wildcard_values(entries: list[tuple[str, str]], label: str | None) -> None:
    """`*` anywhere in a value matches any run of characters, in order."""
    found = parse_domain(WILDCARD).find(entries)
    assert (found[0].label if found else None) == (
        None if label is None else f"test-domain.{label}"
    )


@pytest.mark.parametrize(
    ("pattern", "value", "matches"),
    [("a*", "a", True), ("*a", "ba", True), ("a*b*a", "aba", True), ("a*b*a", "ab", False)],
)
def test_wildcard_parts_do_not_overlap(pattern: str, value: str, matches: bool) -> None:
    """A value too short for the fixed parts around the stars never matches."""
    assert wildcard_match(pattern.split("*"), value) is matches


SHARED = """\
domain: test-domain
descriptors:
  - {key: files, value: "files/*", share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: other, value: "other/*", rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: file, value: test1, rate_limit: {unit: minute, requests_per_unit: 50}}
  - {key: file, value: "test*", share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}
  - key: user
    value: "user/*"
    share_threshold: true
    descriptors:
      - key: action
        rate_limit: {unit: minute, requests_per_unit: 150}
"""  # noqa: E501


@pytest.mark.parametrize(
    ("entries", "values"),
    [
        ([("files", "files/a.pdf")], ("files/*",)),
        ([("files", "files/b.csv")], ("files/*",)),
        ([("other", "other/a")], None),  # without share_threshold: one count each
        ([("file", "test1")], None),  # an exact value beats the shared wildcard
        ([("file", "test2")], ("test*",)),
        ([("user", "user/7"), ("action", "read")], ("user/*", "read")),
    ],
)
def test_share_threshold_counts_every_match_together(
    entries: list[tuple[str, str]], values: tuple[str, ...] | None
) -> None:
    """With share_threshold the wildcard stands for every value it matches."""
    found = parse_domain(SHARED).find(entries)
    assert found is not None and found[1] == values


@pytest.mark.parametrize(
    ("extra", "algorithm"),
    [
        ("", FixedWindow(10, 60)),
        ("algorithm: sliding_window", SlidingWindowCounter(10, 60)),
        ("algorithm: sliding_log", SlidingWindowLog(10, 60)),
        ("algorithm: token_bucket", TokenBucket(10 / 60, 10)),
        ("algorithm: token_bucket, burst: 3", TokenBucket(10 / 60, 3)),
    ],
)
def test_algorithm_per_descriptor(extra: str, algorithm: object) -> None:
    """`algorithm:` picks stormguard's algorithm; the default counts as envoyproxy/ratelimit."""
    text = f"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: 10, {extra}}}\n"  # noqa: E501
    found = parse_domain(text).find([("k", "v")])
    assert found is not None and found[0].algorithm == algorithm


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",  # noqa: E501
            "f.yaml:6:7: descriptors.0.rate_limit.unit: invalid rate limit unit 'foo' (second, minute, hour, day, week, month, year)",  # noqa: E501
        ),
        ("'''\n", "f.yaml:2:1: <top>: invalid YAML: found unexpected end of stream"),
        (
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n",  # noqa: E501
            "f.yaml:6:5: descriptors.1: duplicate descriptor composite key 'test-domain.key1_value1'",  # noqa: E501
        ),
        ("descriptors:\n", "f.yaml:1:1: domain: config file cannot have empty domain"),
        (
            "domain: test-domain\ndescriptors:\n  - value: value1\n",
            "f.yaml:3:5: descriptors.0.key: descriptor has empty key",
        ),
        (
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",  # noqa: E501
            "f.yaml:5:5: descriptors.0.ratelimit: unknown key",
        ),
        (
            "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",  # noqa: E501
            "f.yaml:6:7: descriptors.0.rate_limit.requestsperunit: unknown key",
        ),
        (
            "domain: test-domain\ndescriptors:\n  - a\n",
            "f.yaml:3:5: descriptors.0: a descriptor must be a mapping with a key, got 'a'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name:\n      unit: second\n      requests_per_unit: 5\n",  # noqa: E501
            "f.yaml:7:11: descriptors.0.rate_limit.replaces.0: should not have an empty replaces entry",  # noqa: E501
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces:\n        - name: self\n      unit: second\n      requests_per_unit: 5\n",  # noqa: E501
            "f.yaml:7:11: descriptors.0.rate_limit.replaces.0: replaces should not contain name of same descriptor",  # noqa: E501
        ),
        (
            "domain: d\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",  # noqa: E501
            "f.yaml:6:7: descriptors.0.rate_limit.unit: should not specify unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n      shadow_mode: true\n",  # noqa: E501
            "f.yaml:7:7: descriptors.0.rate_limit.shadow_mode: unknown key (shadow_mode belongs in the descriptor)",  # noqa: E501
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5, algorithm: leaky}\n",  # noqa: E501
            "f.yaml:4:51: descriptors.0.rate_limit.algorithm: must be one of token_bucket, gcra, sliding_window, sliding_log, fixed_window, concurrency",  # noqa: E501
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5, burst: 2}\n",  # noqa: E501
            "f.yaml:4:51: descriptors.0.rate_limit.burst: fixed_window takes no burst",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n",
            "f.yaml:4:5: descriptors.0.share_threshold: share_threshold needs a wildcard value (with '*')",  # noqa: E501
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: -1}\n",  # noqa: E501
            "f.yaml:4:29: descriptors.0.rate_limit.requests_per_unit: must be a whole number from 0 to 4294967295, got -1",  # noqa: E501
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day}\n",
            "f.yaml:4:5: descriptors.0.rate_limit: requests_per_unit is required (0 refuses every request)",  # noqa: E501
        ),
        ("domain: d\ndomain: e\n", "f.yaml:2:1: domain: duplicate key"),
    ],
)
def test_errors_name_file_line_column_and_path(text: str, line: str) -> None:
    """Each mistake is one `file:line:col: path: message` line (envoyproxy/ratelimit's cases)."""
    with pytest.raises(GatewayConfigError) as caught:
        parse_domain(text, "f.yaml")
    assert line in caught.value.errors


def test_every_mistake_of_every_file_at_once(tmp_path: Path) -> None:
    """Loading reports all files' errors together, and a domain in two files."""
    good = tmp_path / "a.yaml"
    good.write_text("domain: shared\n")
    again = tmp_path / "b.yaml"
    again.write_text("domain: shared\n")
    broken = tmp_path / "c.yaml"
    broken.write_text("domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: week}\n")
    with pytest.raises(GatewayConfigError) as caught:
        load_domains([good, again, broken, tmp_path / "missing.yaml"])
    errors = caught.value.errors
    assert f"{again}:1:1: domain: duplicate domain (also in {good})" in errors
    assert any(e.startswith(f"{broken}:4:5: descriptors.0.rate_limit: ") for e in errors)
    assert any(e.startswith(f"{tmp_path / 'missing.yaml'}:1:1: <top>: cannot read") for e in errors)
    assert len(errors) == 3


def test_envoyproxy_example_loads_unchanged() -> None:
    """envoyproxy/ratelimit's example shape (replaces, shadow, quota, metadata) loads."""
    text = """\
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces:
        - name: bkthomps
      unit: minute
      requests_per_unit: 4
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        value: bkthomps
        rate_limit: {name: bkthomps, unit: minute, requests_per_unit: 1}
      - key: baz
        value: shady
        rate_limit: {unit: minute, requests_per_unit: 3}
        shadow_mode: true
      - key: bay
        rate_limit: {unlimited: true}
  - key: unspec
    detailed_metric: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota: {name: "service_1"}
"""
    domain = parse_domain(text)
    labels = [spec.label for spec in domain.limits()]
    assert labels == [
        "rl.category_account",
        "rl.foo",
        "rl.foo.bar_bkthomps",
        "rl.foo.baz_shady",
        "rl.foo.bay",
        "rl.unspec",
        "rl.service_service_1",
    ]
    shady = domain.find([("foo", "x"), ("baz", "shady")])
    assert shady is not None and shady[0].shadow
    quota = domain.find([("service", "service_1")])
    assert quota is not None and quota[0].quota


ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_documented_config_loads() -> None:
    """The docs' example config (also examples/ratelimit-service.yaml) is valid."""
    page = (ROOT / "docs" / "ratelimit-service.md").read_text()
    documented = re.search(r"```yaml\n(domain: shop\n.*?)```", page, re.S)
    assert documented is not None
    example = (ROOT / "examples" / "ratelimit-service.yaml").read_text()
    for text in (documented.group(1), example):
        domain = parse_domain(text)
        assert domain.name == "shop"
        banned = domain.find([("api_key", "leaked-key-123")])
        assert banned is not None and banned[0].requests_per_unit == 0
    assert example.endswith(documented.group(1))
