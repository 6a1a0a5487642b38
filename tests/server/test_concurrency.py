"""ConcurrencyMiddleware: group and per-client slots, bounded wait, release on every end."""

from __future__ import annotations

import asyncio
import socket
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from asgi_apps import respond

from net_support import Serve
from stormguard._errors import ConfigError
from stormguard.asgi import ConcurrencyMiddleware
from stormguard.server._admission import Admission
from stormguard.server._refusal import Refusal


class Gated:
    """An app whose requests wait until released; counts started requests."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started: list[str] = []
        self.arrived = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.started.append(scope["path"])
        self.arrived.set()
        if scope["path"].startswith("/boom"):
            raise RuntimeError("handler failed")
        if not scope["path"].startswith("/fast"):
            await self.gate.wait()
        await respond(send, 200, {"ok": True})


def client(app: Any) -> httpx.AsyncClient:
    """An httpx client calling ``app`` in-process."""
    transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 5555))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def hold(c: httpx.AsyncClient, app: Gated, path: str, **kw: Any) -> asyncio.Task[Any]:
    """Start a request that holds a slot until the gate opens."""
    count = len(app.started)
    task = asyncio.create_task(c.get(path, **kw))
    while len(app.started) == count:
        app.arrived.clear()
        await app.arrived.wait()
    return task


async def test_over_the_limit_gets_503_and_slots_come_back() -> None:
    """Past `limit` in flight: 503 + Retry-After; after completion slots are free again."""
    app = Gated()
    mw = ConcurrencyMiddleware(app, limit=2, retry_after=3)
    async with client(mw) as c:
        held = [await hold(c, app, "/a"), await hold(c, app, "/b")]
        refused = await c.get("/c")
        app.gate.set()
        assert [(await t).status_code for t in held] == [200, 200]
        after = await c.get("/d")
    assert refused.status_code == 503 and refused.headers["retry-after"] == "3"
    assert after.status_code == 200
    assert app.started == ["/a", "/b", "/d"]
    assert mw.admission.default.in_flight == 0


async def test_per_client_share_keeps_others_served() -> None:
    """A client holding its share is refused; another client still gets in."""
    app = Gated()
    mw = ConcurrencyMiddleware(app, limit=3, per_client=1, key="header:X-API-Key")
    async with client(mw) as c:
        held = await hold(c, app, "/a", headers={"X-API-Key": "greedy"})
        greedy = await c.get("/fast", headers={"X-API-Key": "greedy"})
        polite = await c.get("/fast", headers={"X-API-Key": "polite"})
        app.gate.set()
        await held
    assert (greedy.status_code, polite.status_code) == (503, 200)
    assert mw.admission.default.client_in_flight("greedy") == 0


async def test_waiter_gets_the_freed_slot() -> None:
    """Within max_wait a queued request takes the slot freed by the one before it."""
    app = Gated()
    mw = ConcurrencyMiddleware(app, limit=1, max_wait=30)
    async with client(mw) as c:
        first = await hold(c, app, "/a")
        second = asyncio.create_task(c.get("/fast"))
        # The bulkhead has no event for "a waiter queued": yield until it has one.
        while not mw.admission.default.bulkhead._waiters:  # noqa: ASYNC110
            await asyncio.sleep(0)
        assert app.started == ["/a"]  # the second is waiting, not running
        app.gate.set()
        assert [(await first).status_code, (await second).status_code] == [200, 200]
    assert app.started == ["/a", "/fast"]


async def test_error_releases_the_slot() -> None:
    """A handler exception gives the slot back."""
    app = Gated()
    mw = ConcurrencyMiddleware(app, limit=1)
    async with client(mw) as c:
        with pytest.raises(RuntimeError):
            await c.get("/boom")
        assert (await c.get("/fast")).status_code == 200
    assert mw.admission.default.in_flight == 0


async def test_groups_are_isolated() -> None:
    """A full group does not take slots from another group."""
    app = Gated()
    mw = ConcurrencyMiddleware(app, limit=5, groups={"/slow": 1})
    async with client(mw) as c:
        held = await hold(c, app, "/slow/1")
        slow = await c.get("/slow/fast")
        other = await c.get("/fast")
        app.gate.set()
        await held
    assert (slow.status_code, other.status_code) == (503, 200)


async def test_disconnect_cancels_the_handler_and_frees_the_slot() -> None:
    """http.disconnect before the answer: the handler is cancelled and its slot freed."""
    app = Gated()
    mw = ConcurrencyMiddleware(app, limit=1)
    gone = asyncio.Event()
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        if not sent:
            sent.append("body")
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/hang", "headers": [], "client": None}
    task = asyncio.create_task(mw(scope, receive, send))
    await app.arrived.wait()
    assert mw.admission.default.in_flight == 1
    gone.set()
    await task  # returns normally
    assert mw.admission.default.in_flight == 0
    assert sent == ["body"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"limit": 0}, "limit"), ({"per_client": 0}, "per_client"), ({"groups": {"x": 1}}, "groups")],
)
def test_invalid_configuration(kwargs: dict[str, Any], field: str) -> None:
    """Invalid settings raise ConfigError naming the field."""
    with pytest.raises(ConfigError, match=field):
        ConcurrencyMiddleware(Gated(), **kwargs)


def test_sync_admission_twin() -> None:
    """The sync form takes and gives back the same slots."""
    admission = Admission(1, per_client=1)
    assert admission.enter("a") is None
    refusal = admission.enter("b")
    assert refusal is not None and refusal.status == 503
    admission.leave("a")
    assert admission.enter("b") is None and admission.in_flight == 1


def test_try_enter_takes_a_free_slot_and_gives_the_share_back_when_full() -> None:
    """try_enter: True with a slot taken; a full group with max_wait refuses nothing
    (False: the caller may wait) and without it refuses; the client's share taken on
    the way is given back either way."""
    waiting = Admission(1, per_client=2, max_wait=1.0)
    assert waiting.try_enter("a") is True
    assert waiting.try_enter("a") is False  # full, but a caller could wait
    assert waiting.client_in_flight("a") == 1  # the share of the failed try came back
    waiting.leave("a")
    assert waiting.in_flight == 0 and waiting.client_in_flight("a") == 0
    strict = Admission(1, per_client=1)
    assert strict.try_enter(None) is True
    refusal = strict.try_enter("b")
    assert isinstance(refusal, Refusal) and refusal.status == 503
    assert strict.client_in_flight("b") == 0
    strict.leave(None)
    assert strict.try_enter("b") is True and strict.client_in_flight("b") == 1
    share = strict.try_enter("b")
    assert isinstance(share, Refusal) and b"share" in share.body


def test_abrupt_disconnect_frees_the_slot_under_uvicorn(
    uvicorn_app: Serve, eventually: Any
) -> None:
    """A client that vanishes mid-request gives its slot back (real server)."""
    base = uvicorn_app("concurrency_app")
    url = urlsplit(base)
    sock = socket.create_connection((url.hostname, url.port))
    sock.sendall(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
    with httpx.Client(base_url=base, timeout=10) as http:
        eventually(lambda: http.get("/x").status_code == 503)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # RST: an abrupt disconnect
        eventually(lambda: http.get("/x").status_code == 200)


@pytest.mark.redis
async def test_store_makes_the_limit_fleet_wide(redis_url: str, key_prefix: str) -> None:
    """Two instances on one Redis share `limit` and `per_client`; slots come back."""
    from stormguard.stores import AsyncRedisStore

    store = AsyncRedisStore(redis_url, prefix=key_prefix)
    app = Gated()
    one, two = (
        ConcurrencyMiddleware(app, limit=2, per_client=1, key="header:X-API-Key", store=store)
        for _ in range(2)
    )
    async with client(one) as c1, client(two) as c2:
        held = await hold(c1, app, "/a", headers={"X-API-Key": "a"})
        same_client = await c2.get("/fast", headers={"X-API-Key": "a"})
        held_b = await hold(c2, app, "/b", headers={"X-API-Key": "b"})
        full = await c1.get("/fast", headers={"X-API-Key": "c"})
        app.gate.set()
        assert [(await held).status_code, (await held_b).status_code] == [200, 200]
        after = await c2.get("/fast", headers={"X-API-Key": "c"})
    await store.aclose()
    assert (same_client.status_code, full.status_code, after.status_code) == (503, 503, 200)
    assert int(full.headers["retry-after"]) >= 1
