"""RateLimitMiddleware under uvicorn: two processes on one Redis, and Redis killed mid-run."""

from __future__ import annotations

import time

import httpx
import pytest

from net_support import Serve
from stormguard import parse_rate_limits

pytestmark = pytest.mark.redis


def test_two_processes_share_one_quota(uvicorn_app: Serve, redis_url: str, key_prefix: str) -> None:
    """A key limited to N is admitted exactly N times over two uvicorn processes."""
    env = {"SG_REDIS": redis_url, "SG_PREFIX": key_prefix, "SG_LIMIT": "5/minute"}
    urls = [uvicorn_app("ratelimit_app", **env), uvicorn_app("ratelimit_app", **env)]
    with httpx.Client(timeout=10) as http:
        answers = [http.get(urls[i % 2] + "/", headers={"X-API-Key": "k1"}) for i in range(12)]
        other = http.get(urls[1] + "/", headers={"X-API-Key": "k2"})
    codes = [r.status_code for r in answers]
    assert codes.count(200) == 5 and codes.count(429) == 7
    assert codes[:5] == [200] * 5  # the quota is used first, then refused
    assert other.status_code == 200
    for refused in answers[5:]:
        assert int(refused.headers["retry-after"]) >= 1
        assert {"ratelimit", "ratelimit-policy", "x-ratelimit-reset"} <= set(refused.headers)
        quota = parse_rate_limits(refused.headers, now=time.time())[0]
        assert quota.limit == 5 and quota.remaining == 0


@pytest.mark.parametrize(
    ("mode", "during"),
    [("open", {200}), ("closed", {503}), ("local", {200, 429})],
)
def test_redis_killed_mid_run(
    uvicorn_app: Serve, owned_redis: object, mode: str, during: set[int]
) -> None:
    """Killing Redis: each on_store_error mode answers as documented, never a 500."""
    from net_support import RedisLike

    redis: RedisLike = owned_redis  # type: ignore[assignment]
    env = {"SG_REDIS": redis.url, "SG_PREFIX": "kill:", "SG_LIMIT": "3/minute", "SG_MODE": mode}
    url = uvicorn_app("ratelimit_app", **env)
    with httpx.Client(timeout=10) as http:
        before = [http.get(url + "/", headers={"X-API-Key": "k"}).status_code for _ in range(2)]
        redis.stop()
        outage = [http.get(url + "/", headers={"X-API-Key": "k"}) for _ in range(6)]
    assert before == [200, 200]
    codes = {r.status_code for r in outage}
    assert codes == during
    for response in outage:
        if response.status_code != 200:
            assert int(response.headers["retry-after"]) >= 1
