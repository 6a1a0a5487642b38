"""The fleet keys of the gateway configuration: sync, shadow, store_max_keys and the
store URLs (Sentinel, Cluster) -- validated at load, naming the field."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from stormguard.gateway._config import GatewayConfigError, parse_config


def _config(limit: dict[str, Any] | None = None, **top: Any) -> str:
    doc: dict[str, Any] = {
        "upstreams": {"a": {"url": "http://127.0.0.1:9000"}},
        "limits": {"pc": limit or {"algorithm": "token_bucket", "rate": 10, "burst": 20}},
        "routes": [{"path": "/", "upstream": "a", "limits": ["pc"]}],
        **top,
    }
    return yaml.safe_dump(doc)


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra", "fixed_window", "sliding_window"])
def test_sync_is_accepted_for_the_approximate_algorithms(algorithm: str) -> None:
    """sync: {every: S} parses for token buckets, GCRA, fixed and sliding windows."""
    params = (
        {"rate": 5, "burst": 5}
        if algorithm in ("token_bucket", "gcra")
        else {
            "limit": 5,
            "window": 1,
        }
    )
    config = parse_config(_config({"algorithm": algorithm, **params, "sync": {"every": 0.5}}))
    sync = config.limits["pc"].sync
    assert sync is not None and sync.every == 0.5


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        ({"algorithm": "sliding_log", "limit": 5, "window": 1, "sync": {"every": 1}}, "sync"),
        ({"algorithm": "concurrency", "limit": 5, "sync": {"every": 1}}, "sync"),
        ({"algorithm": "fixed_window", "limit": 5, "window": 1, "sync": {"every": 0}}, "every"),
        ({"algorithm": "fixed_window", "limit": 5, "window": 1, "sync": {}}, "every"),
        ({"algorithm": "fixed_window", "limit": 5, "window": 1, "sync": {"evry": 1}}, "evry"),
        ({"algorithm": "fixed_window", "limit": 5, "window": 1, "shadow": "maybe"}, "shadow"),
    ],
)
def test_bad_fleet_keys_of_a_limit_fail_naming_the_field(
    limit: dict[str, Any], message: str
) -> None:
    """sync on an algorithm it cannot serve, a bad interval or shadow value: an error
    naming limits.pc and the field."""
    with pytest.raises(GatewayConfigError) as info:
        parse_config(_config(limit))
    assert "limits.pc" in str(info.value) and message in str(info.value)


def test_shadow_per_limit_and_for_all() -> None:
    """shadow: true parses per limit and at the top level; both default to off."""
    plain = parse_config(_config())
    assert not plain.shadow and not plain.limits["pc"].shadow
    limit = {"algorithm": "fixed_window", "limit": 5, "window": 1, "shadow": True}
    assert parse_config(_config(limit)).limits["pc"].shadow
    assert parse_config(_config(shadow=True)).shadow


def test_store_max_keys_defaults_to_a_million_clients_per_client_limit() -> None:
    """Without store_max_keys the memory store holds a million clients on every
    per-client limit (plus the global limits); a set value wins; below 1 is an error."""
    two = yaml.safe_load(_config())
    two["limits"]["pc2"] = {"algorithm": "fixed_window", "limit": 5, "window": 1}
    two["limits"]["all"] = {"algorithm": "fixed_window", "limit": 5, "window": 1, "per": "global"}
    config = parse_config(yaml.safe_dump(two))
    assert config.max_keys == 2_000_000 + 3
    assert parse_config(_config(store_max_keys=5000)).max_keys == 5000
    with pytest.raises(GatewayConfigError, match="store_max_keys"):
        parse_config(_config(store_max_keys=0))


@pytest.mark.parametrize(
    "store",
    [
        "redis+sentinel://127.0.0.1:26379/mymaster",
        "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster/2",
        "rediss+sentinel://:secret@h:26379/m",
        "redis+cluster://127.0.0.1:7000",
    ],
)
def test_sentinel_and_cluster_store_urls_are_accepted(store: str) -> None:
    """store: takes redis+sentinel:// (HOST:PORT[,...]/MASTER[/DB]) and cluster URLs."""
    config = parse_config(_config(store=store))
    assert config.shared_store and config.store == store


@pytest.mark.parametrize(
    "store",
    ["redis+sentinel://127.0.0.1:26379", "redis+sentinel://h:x/m", "mongodb://h/db"],
)
def test_bad_store_urls_fail_naming_the_store(store: str) -> None:
    """A Sentinel URL without a master, with a bad port, or an unknown scheme: an error on store."""
    with pytest.raises(GatewayConfigError, match="store"):
        parse_config(_config(store=store))
