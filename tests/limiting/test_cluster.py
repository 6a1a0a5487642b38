"""Redis Cluster: the session fixture starts a real three-node cluster."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.redis
pytest.importorskip("redis")


def test_fixture_cluster_serves_every_slot(redis_cluster_url: str) -> None:
    """The fixture's cluster answers with all 16384 slots covered by three masters."""
    from redis.cluster import RedisCluster

    port = int(redis_cluster_url.rsplit(":", 1)[1])
    client = RedisCluster(host="127.0.0.1", port=port)
    try:
        info = client.cluster_info()
        assert info["cluster_state"] == "ok"
        assert int(info["cluster_slots_assigned"]) == 16384
        assert len(client.get_primaries()) == 3
        client.set("{a}probe", 1)
        client.set("{b}probe", 2)
        assert client.mget("{a}probe") == [b"1"]
        client.delete("{a}probe", "{b}probe")
    finally:
        client.close()
