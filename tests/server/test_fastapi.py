"""The FastAPI form (dependency, decorator) and the example app the docs show."""

from __future__ import annotations

import re
import runpy
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI

from stormguard import parse_rate_limits
from stormguard.fastapi import install, limit, stormguard_limit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fastapi_app.py"


def client(app: Any) -> httpx.AsyncClient:
    """An httpx client calling ``app`` in-process."""
    transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 5555))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def make_app(installed: bool) -> FastAPI:
    """An app with one dependency-limited and one decorator-limited route."""
    app = FastAPI()
    if installed:
        install(app)
    dep = stormguard_limit("2/minute", key="header:X-API-Key")

    @app.get("/dep", dependencies=[Depends(dep)])
    async def by_dependency() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/deco")
    @limit("1/minute", key="global", headers="github")
    def by_decorator(q: str = "") -> dict[str, str]:
        return {"q": q}

    return app


@pytest.mark.parametrize("installed", [True, False])
async def test_dependency_limits_a_route(installed: bool) -> None:
    """Depends(stormguard_limit(...)): quota headers when admitted, 429 + Retry-After over."""
    async with client(make_app(installed)) as c:
        answers = [await c.get("/dep", headers={"X-API-Key": "a"}) for _ in range(3)]
        other = await c.get("/dep", headers={"X-API-Key": "b"})
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert parse_rate_limits(answers[0].headers, now=0)[0].remaining == 1
    refused = answers[2]
    assert int(refused.headers["retry-after"]) >= 1 and "ratelimit" in refused.headers
    body = refused.json()
    problem = body if installed else body["detail"]
    assert problem["status"] == 429 and problem["title"] == "Too Many Requests"
    assert refused.headers["content-type"].startswith(
        "application/problem+json" if installed else "application/json"
    )
    assert other.status_code == 200


async def test_decorator_limits_a_route_and_keeps_its_parameters() -> None:
    """@limit(...) under @app.get: the endpoint keeps its own parameters."""
    async with client(make_app(True)) as c:
        first = await c.get("/deco", params={"q": "x"})
        second = await c.get("/deco", params={"q": "y"})
    assert (first.status_code, first.json()) == (200, {"q": "x"})
    assert second.status_code == 429 and "x-ratelimit-reset" in second.headers


def test_docs_show_the_example_file() -> None:
    """The FastAPI recipe shows examples/fastapi_app.py itself (included, never a copy)."""
    page = (ROOT / "docs" / "recipes" / "fastapi.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert '--8<-- "examples/fastapi_app.py"\n' in blocks
    assert EXAMPLE.is_file()


async def test_example_app_limits_and_replays() -> None:
    """The example app: search limit per key, idempotent payments, problem bodies."""
    app = runpy.run_path(str(EXAMPLE), run_name="example")["app"]
    async with client(app) as c:
        searches = [
            (await c.get("/search", headers={"X-API-Key": "k"})).status_code for _ in range(11)
        ]
        headers = {"X-API-Key": "k", "Idempotency-Key": "p1"}
        paid = await c.post("/payments", json={"amount": 5}, headers=headers)
        again = await c.post("/payments", json={"amount": 5}, headers=headers)
        changed = await c.post("/payments", json={"amount": 6}, headers=headers)
    assert searches == [200] * 10 + [429]
    assert (paid.status_code, again.status_code, changed.status_code) == (201, 201, 422)
    assert again.headers["idempotent-replayed"] == "true" and again.json() == {"charged": 5}


async def test_dependency_takes_the_middleware_store_options() -> None:
    """A dead store with on_store_error="closed": 503 + Retry-After, as the middleware does."""
    from net_support import refused_port

    app = FastAPI()
    install(app)
    dead = f"redis://127.0.0.1:{refused_port()}/0"
    closed = stormguard_limit("5/minute", store=dead, on_store_error="closed")
    quiet = stormguard_limit("5/minute", headers_on_allowed=False)

    @app.get("/closed", dependencies=[Depends(closed)])
    async def fails_closed() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/quiet", dependencies=[Depends(quiet)])
    async def no_headers() -> dict[str, bool]:
        return {"ok": True}

    async with client(app) as c:
        refused = await c.get("/closed")
        admitted = await c.get("/quiet")
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["status"] == 503
    assert admitted.status_code == 200 and parse_rate_limits(admitted.headers, now=0) == ()
