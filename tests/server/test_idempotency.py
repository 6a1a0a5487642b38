"""IdempotencyMiddleware in-process and the claim table on memory and Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_apps import Counting, respond

from stormguard._errors import ConfigError
from stormguard.asgi import IdempotencyMiddleware
from stormguard.core._idempotency import ClaimOutcome
from stormguard.server._claims import ClaimStore, MemoryClaims, RedisClaims
from stormguard.testing import FakeClock


def client(app: Any) -> httpx.AsyncClient:
    """An httpx client calling ``app`` in-process."""
    transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 5555))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def key(value: str, **extra: str) -> dict[str, str]:
    """Headers carrying an Idempotency-Key."""
    return {"Idempotency-Key": value, **extra}


async def test_first_request_runs_and_retries_replay() -> None:
    """The first keyed POST executes; a retry replays status and body, marked replayed."""
    app = Counting()
    async with client(IdempotencyMiddleware(app)) as c:
        first = await c.post("/pay", content=b"10 EUR", headers=key("k1"))
        again = await c.post("/pay", content=b"10 EUR", headers=key("k1"))
    assert app.counts == {"/pay::k1": 1}
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.headers["content-type"] == "application/json"


async def test_same_key_other_body_is_422() -> None:
    """The same key with another body gets 422 and runs nothing."""
    app = Counting()
    async with client(IdempotencyMiddleware(app)) as c:
        await c.post("/pay", content=b"10 EUR", headers=key("k1"))
        changed = await c.post("/pay", content=b"99 EUR", headers=key("k1"))
    assert changed.status_code == 422
    assert json.loads(changed.content)["status"] == 422
    assert app.counts == {"/pay::k1": 1}


async def test_5xx_is_released_and_the_retry_runs() -> None:
    """A 500 is not stored: the retry executes again and its answer is kept."""
    app = Counting()
    async with client(IdempotencyMiddleware(app)) as c:
        codes = [(await c.post("/flaky", headers=key("k"))).status_code for _ in range(3)]
    assert codes == [500, 201, 201]
    assert app.counts == {"/flaky::k": 2}


async def test_handler_exception_releases_the_claim() -> None:
    """An exception in the handler releases the key: the retry runs again."""
    app = Counting()
    async with client(IdempotencyMiddleware(app)) as c:
        for _ in range(2):
            with pytest.raises(RuntimeError):
                await c.post("/boom", headers=key("k"))
    assert app.counts == {"/boom::k": 2}


async def test_duplicate_while_in_flight_gets_409() -> None:
    """A duplicate arriving while the first runs gets 409 + a short Retry-After."""
    gate, started = asyncio.Event(), asyncio.Event()
    runs: list[str] = []

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        runs.append(scope["path"])
        started.set()
        await gate.wait()
        await respond(send, 201, {"ok": True})

    async with client(IdempotencyMiddleware(slow)) as c:
        first = asyncio.create_task(c.post("/pay", headers=key("k")))
        await started.wait()
        duplicate = await c.post("/pay", headers=key("k"))
        gate.set()
        assert (await first).status_code == 201
    assert duplicate.status_code == 409
    assert duplicate.headers["retry-after"] == "1"
    assert runs == ["/pay"]


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 400), (key(""), 400), (key("x" * 256), 400), (key("x" * 255), 201)],
)
async def test_required_and_key_length(headers: dict[str, str], status: int) -> None:
    """required mode: a missing, empty or over-long key is 400; 255 characters pass."""
    async with client(IdempotencyMiddleware(Counting(), required=True)) as c:
        response = await c.post("/pay", headers=headers)
    assert response.status_code == status


async def test_unkeyed_and_other_methods_pass_through() -> None:
    """Without required, unkeyed POSTs and GETs run every time."""
    app = Counting()
    async with client(IdempotencyMiddleware(app)) as c:
        for _ in range(2):
            await c.post("/pay")
            await c.get("/pay", headers=key("k"))
    assert app.counts == {"/pay::": 2, "/pay::k": 2}


async def test_body_over_max_body_is_413() -> None:
    """A keyed body larger than max_body is refused with 413 and nothing runs."""
    app = Counting()
    async with client(IdempotencyMiddleware(app, max_body=8)) as c:
        response = await c.post("/pay", content=b"123456789", headers=key("k"))
        small = await c.post("/pay", content=b"12345678", headers=key("k2"))
    assert (response.status_code, small.status_code) == (413, 201)
    assert app.counts == {"/pay::k2": 1}


async def test_tenants_with_equal_keys_both_execute() -> None:
    """scope= keeps two tenants' equal keys apart."""
    app = Counting()
    async with client(IdempotencyMiddleware(app, scope="header:X-API-Key")) as c:
        a = await c.post("/pay", headers=key("same", **{"X-API-Key": "a"}))
        b = await c.post("/pay", headers=key("same", **{"X-API-Key": "b"}))
        a2 = await c.post("/pay", headers=key("same", **{"X-API-Key": "a"}))
    assert app.counts == {"/pay:a:same": 1, "/pay:b:same": 1}
    assert (a.status_code, b.status_code) == (201, 201)
    assert a2.headers["idempotent-replayed"] == "true"


async def test_store_down_fails_closed_with_503() -> None:
    """A dead store: 503 + Retry-After and the handler never runs."""
    from net_support import refused_port

    app = Counting()
    store = f"redis://127.0.0.1:{refused_port()}/0"
    async with client(IdempotencyMiddleware(app, store=store)) as c:
        response = await c.post("/pay", headers=key("k"))
        unkeyed = await c.post("/pay")
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert unkeyed.status_code == 201
    assert app.counts == {"/pay::": 1}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"ttl": 0}, "ttl"), ({"lease": -1}, "lease"), ({"on_store_error": "open"}, "on_store_error")],
)
def test_invalid_configuration(kwargs: dict[str, Any], field: str) -> None:
    """Invalid settings raise ConfigError naming the field."""
    with pytest.raises(ConfigError, match=field):
        IdempotencyMiddleware(Counting(), **kwargs)


# --- the claim table on each backend -------------------------------------------------


@pytest.fixture(params=["memory", "redis"])
async def claims(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[ClaimStore]:
    """A claim backend: in memory, or Redis through the Lua script."""
    if request.param == "memory":
        yield MemoryClaims()
        return
    from stormguard.stores import AsyncRedisStore

    store = AsyncRedisStore(request.getfixturevalue("redis_url"), prefix=key_prefix)
    yield RedisClaims(store)
    await store.aclose()


async def test_claim_table(claims: ClaimStore) -> None:
    """claim / in flight / mismatch / complete / replay / release follow the table."""
    first = await claims.aclaim("k", "fp", "owner-1", 30)
    busy = await claims.aclaim("k", "fp", "owner-2", 30)
    other = await claims.aclaim("k", "fp2", "owner-2", 30)
    assert [first.outcome, busy.outcome, other.outcome] == [
        ClaimOutcome.CLAIMED,
        ClaimOutcome.IN_FLIGHT,
        ClaimOutcome.MISMATCH,
    ]
    assert 0 < busy.retry_after <= 30
    assert not await claims.acomplete("k", "owner-2", b"x", 60)  # not the owner
    assert await claims.acomplete("k", "owner-1", b"stored\nbody", 60)
    replay = await claims.aclaim("k", "fp", "owner-3", 30)
    assert (replay.outcome, replay.response) == (ClaimOutcome.REPLAY, b"stored\nbody")
    assert not await claims.arelease("k", "owner-1")  # done entries stay
    assert (await claims.aclaim("k2", "fp", "o", 30)).outcome is ClaimOutcome.CLAIMED
    assert await claims.arelease("k2", "o")
    assert (await claims.aclaim("k2", "fp", "o2", 30)).outcome is ClaimOutcome.CLAIMED


def test_crashed_owner_lease_expires_and_late_completion_is_refused(clock: FakeClock) -> None:
    """After the lease a new request claims the key; the old owner's answer is refused."""
    claims = MemoryClaims(clock=clock.monotonic)
    assert claims.claim("k", "fp", "crashed", 10).outcome is ClaimOutcome.CLAIMED
    clock.advance(9)
    assert claims.claim("k", "fp", "next", 10).outcome is ClaimOutcome.IN_FLIGHT
    clock.advance(2)
    assert claims.claim("k", "fp", "next", 10).outcome is ClaimOutcome.CLAIMED
    assert not claims.complete("k", "crashed", b"late", 60)
    assert claims.complete("k", "next", b"fresh", 60)
    assert claims.claim("k", "fp", "third", 10).response == b"fresh"


@pytest.mark.redis
async def test_redis_lease_expires(redis_url: str, key_prefix: str, eventually: Any) -> None:
    """On Redis too, a lapsed lease frees the key and refuses the late owner."""
    from stormguard.stores import RedisStore

    store = RedisStore(redis_url, prefix=key_prefix)
    claims = RedisClaims(store)
    assert claims.claim("k", "fp", "crashed", 0.05).outcome is ClaimOutcome.CLAIMED
    eventually(lambda: claims.claim("k", "fp", "next", 30).outcome is ClaimOutcome.CLAIMED)
    assert not claims.complete("k", "crashed", b"late", 60)
    assert claims.complete("k", "next", b"fresh", 60)
    store.close()


async def test_answer_over_max_response_is_neither_replayed_nor_rerun() -> None:
    """A too-large answer is not stored: retries get 409 (never a second execution)."""
    app = Counting()
    async with client(IdempotencyMiddleware(app, max_response=4)) as c:
        first = await c.post("/pay", content=b"a long enough body", headers=key("k"))
        retry = await c.post("/pay", content=b"a long enough body", headers=key("k"))
    assert (first.status_code, retry.status_code) == (201, 409)
    assert app.counts == {"/pay::k": 1}


def test_memory_claims_stay_bounded(clock: FakeClock) -> None:
    """Expired entries are dropped as writes pass them; past max_keys the oldest goes."""
    claims = MemoryClaims(clock=clock.monotonic, max_keys=2)
    for name in ("a", "b", "c"):
        claims.claim(name, "fp", "o", 10)
    assert list(claims._data) == ["b", "c"]
    clock.advance(11)
    claims.claim("d", "fp", "o", 10)
    assert list(claims._data) == ["d"]
