"""The gateway configuration: validation, error positions, ${ENV}, TOML, `gateway check`."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stormguard.cli import _build
from stormguard.gateway._config import GatewayConfigError, load_config, parse_config

DESIGN_EXAMPLE = """\
listen:
  http: 127.0.0.1:8080
  grpc: 127.0.0.1:50051
  admin: 127.0.0.1:9901
store: memory
on_store_error: local
clients:
  key: [header:X-API-Key, ip]
  trusted_proxies: []
upstreams:
  orders:
    url: http://127.0.0.1:9000
    timeout: {connect: 1.0, read: 10.0}
    breaker: {failure_rate: 0.5, min_calls: 20, window: 30, open_for: 5, half_open_probes: 1}
    bulkhead: {limit: 100, per_client: 20, max_wait: 0.5}
    retries: {attempts: 2, budget: 0.1}
  greeter:
    url: grpc://127.0.0.1:50052
limits:
  per-client: {algorithm: token_bucket, rate: 10, burst: 20, per: client}
  global:     {algorithm: sliding_window, limit: 5000, window: 1, per: global}
routes:
  - path: /v1/orders
    methods: [POST]
    upstream: orders
    limits: [per-client, global]
    on_limit: reject
    idempotency: require
  - path: /ws
    upstream: orders
    websocket: {connections_per_client: 5, messages_per_second: 20, burst: 40, max_message: 65536}
  - grpc: helloworld.Greeter
    upstream: greeter
    limits: [per-client]
    refuse_with: unavailable
"""

BROKEN = """\
listen:
  http: 127.0.0.1:99999
  bogus: 1
upstreams:
  orders:
    url: http://127.0.0.1:9000
    breaker: {failure_rate: 2}
limits:
  pc: {algorithm: token_bucket, rate: 10}
routes:
  - path: /v1
    upstream: ordrs
    limits: [pc, nope]
  - path: v2
    upstream: orders
    idempotency: maybe
"""


def test_design_example_is_valid() -> None:
    """The configuration shown in the design document validates as it is."""
    config = parse_config(DESIGN_EXAMPLE, "gateway.yaml")
    assert config.routes[0].limits == ["per-client", "global"]
    assert config.routes[2].grpc == "helloworld.Greeter"
    assert config.upstreams["greeter"].is_grpc
    assert config.listen.grpc == "127.0.0.1:50051"


def test_every_error_is_reported_at_once() -> None:
    """All mistakes come in one error, each as file:line:col: dotted.path: message."""
    with pytest.raises(GatewayConfigError) as info:
        parse_config(BROKEN, "gw.yaml")
    errors = info.value.errors
    expected = [
        "gw.yaml:2:3: listen.http:",
        "gw.yaml:3:3: listen.bogus: unknown key",
        "gw.yaml:7:15: upstreams.orders.breaker.failure_rate:",
        "gw.yaml:9:3: limits.pc: token_bucket needs burst",
        "gw.yaml:12:5: routes.0.upstream: unknown upstream 'ordrs'",
        "gw.yaml:13:18: routes.0.limits.1: unknown limit 'nope'",
        "gw.yaml:14:5: routes.1.path: must start with '/'",
        "gw.yaml:16:5: routes.1.idempotency:",
    ]
    assert len(errors) == len(expected)
    for line, prefix in zip(errors, expected, strict=True):
        assert line.startswith(prefix), line


@pytest.mark.parametrize(
    ("env", "store"),
    [({"STORE": "redis://127.0.0.1:6379/0"}, "redis://127.0.0.1:6379/0"), ({}, "memory")],
)
def test_env_substitution(env: dict[str, str], store: str) -> None:
    """${NAME:-default} expands from the environment, else the default."""
    text = "store: ${STORE:-memory}\n"
    assert parse_config(text, "gw.yaml", env=env).store == store


def test_unset_env_without_default_is_an_error() -> None:
    """An unset ${NAME} without a default is reported at its value."""
    with pytest.raises(GatewayConfigError) as info:
        parse_config("store: ${NOPE}\n", "gw.yaml", env={})
    assert info.value.errors[0].startswith("gw.yaml:1:1: store: environment variable NOPE")


def test_duplicate_key_is_an_error() -> None:
    """A key given twice is an error, not a silent override."""
    with pytest.raises(GatewayConfigError, match=r"gw.yaml:2:1: store: duplicate key"):
        parse_config("store: memory\nstore: memory\n", "gw.yaml")


def test_toml_has_the_same_shape(tmp_path: Path) -> None:
    """TOML with the same shape validates; errors carry the line."""
    path = tmp_path / "gw.toml"
    path.write_text(
        '[upstreams.a]\nurl = "http://127.0.0.1:9000"\n\n'
        '[[routes]]\npath = "/"\nupstream = "a"\n\n[[routes]]\npath = "/b"\nupstream = "b"\n'
    )
    with pytest.raises(GatewayConfigError) as info:
        load_config(path)
    assert info.value.errors == [f"{path}:10:1: routes.1.upstream: unknown upstream 'b' (a)"]


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        ({"algorithm": "gcra", "rate": 1}, "gcra needs burst"),
        ({"algorithm": "fixed_window", "limit": 5}, "fixed_window needs window"),
        ({"algorithm": "concurrency", "limit": 5, "rate": 1}, "concurrency takes no rate"),
        ({"algorithm": "leaky", "limit": 5}, "Input should be"),
    ],
)
def test_limit_parameters_follow_the_algorithm(limit: dict[str, object], message: str) -> None:
    """Each algorithm names the parameters it needs and refuses the others."""
    import yaml

    text = yaml.safe_dump({"limits": {"x": limit}})
    with pytest.raises(GatewayConfigError, match=message):
        parse_config(text, "gw.yaml")


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(_build(), ["gateway", *args])
    return result.exit_code, result.output


def test_check_accepts_a_valid_file(tmp_path: Path) -> None:
    """`stormguard gateway check` exits 0 on a valid file."""
    path = tmp_path / "gw.yaml"
    path.write_text(DESIGN_EXAMPLE)
    code, output = _cli("check", str(path))
    assert code == 0
    assert "ok" in output


def test_check_rejects_an_invalid_file(tmp_path: Path) -> None:
    """`stormguard gateway check` exits 1 and prints every error."""
    path = tmp_path / "gw.yaml"
    path.write_text(BROKEN)
    code, output = _cli("check", str(path))
    assert code == 1
    assert "unknown upstream 'ordrs'" in output
    assert "8 error(s)" in output


def test_check_rejects_workers_with_memory_store(tmp_path: Path) -> None:
    """--workers > 1 needs a shared store: memory is refused (pinned)."""
    path = tmp_path / "gw.yaml"
    path.write_text(DESIGN_EXAMPLE)
    code, output = _cli("check", "--workers", "2", str(path))
    assert code == 1
    assert "'memory' cannot be shared by 2 workers" in output
    redis = DESIGN_EXAMPLE.replace("store: memory", "store: redis://127.0.0.1:6379/0")
    path.write_text(redis)
    assert _cli("check", "--workers", "2", str(path))[0] == 0


def test_example_config_is_valid() -> None:
    """The example the README runs validates."""
    example = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"
    config = load_config(example, env={})
    assert config.store == "memory"
    assert [r.path for r in config.routes] == ["/slow", "/"]
