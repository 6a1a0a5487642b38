"""Contract suite: every algorithm behaves the same on memory and Redis, sync and async."""

from __future__ import annotations

import math

import pytest
from limiting_support import ALGORITHMS, LONG, Factory

from stormguard import ConfigError, FixedWindow, TokenBucket

KINDS = sorted(ALGORITHMS)


@pytest.mark.parametrize("kind", KINDS)
async def test_admits_exactly_the_quota(make_limiter: Factory, kind: str) -> None:
    """Five hits fit a quota of five; the sixth is denied with a finite retry_after."""
    limiter = make_limiter(ALGORITHMS[kind](5))
    decisions = [await limiter.hit("client") for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [math.floor(d.remaining + 1e-6) for d in decisions[:5]] == [4, 3, 2, 1, 0]
    assert all(d.limit == 5 and d.retry_after == 0 for d in decisions[:5])
    denied = decisions[5]
    assert 0 < denied.retry_after < math.inf
    assert denied.retry_after <= 2 * LONG
    assert denied.reset_after >= denied.retry_after - 1e-6


@pytest.mark.parametrize("kind", KINDS)
async def test_cost_takes_that_many_units(make_limiter: Factory, kind: str) -> None:
    """A hit of cost 2 takes two units; a denied hit takes none."""
    limiter = make_limiter(ALGORITHMS[kind](5))
    assert (await limiter.hit("c", 2)).allowed
    assert (await limiter.hit("c", 2)).allowed
    denied = await limiter.hit("c", 2)
    assert not denied.allowed
    assert math.floor(denied.remaining + 1e-6) == 1
    assert (await limiter.hit("c", 1)).allowed
    assert not (await limiter.hit("c", 1)).allowed


@pytest.mark.parametrize("kind", KINDS)
async def test_cost_above_capacity_is_never_admitted(make_limiter: Factory, kind: str) -> None:
    """A cost larger than the quota is denied with an infinite wait and takes nothing."""
    limiter = make_limiter(ALGORITHMS[kind](5))
    denied = await limiter.hit("c", 6)
    assert not denied.allowed
    assert denied.retry_after == math.inf
    assert "Retry-After" not in denied.headers()
    assert math.floor((await limiter.hit("c", 5)).remaining + 1e-6) == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_cost_zero_peeks(make_limiter: Factory, kind: str) -> None:
    """A hit of cost 0 is allowed and reports the quota without taking any."""
    limiter = make_limiter(ALGORITHMS[kind](5))
    await limiter.hit("c", 3)
    peek = await limiter.hit("c", 0)
    assert peek.allowed
    assert math.floor(peek.remaining + 1e-6) == 2
    assert math.floor((await limiter.hit("c", 0)).remaining + 1e-6) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_keys_and_names_are_independent(make_limiter: Factory, kind: str) -> None:
    """Each key has its own quota, and so does each limiter name on the same key."""
    first = make_limiter(ALGORITHMS[kind](1), name="first")
    second = make_limiter(ALGORITHMS[kind](1), name="second")
    assert (await first.hit("a")).allowed
    assert not (await first.hit("a")).allowed
    assert (await first.hit("b")).allowed
    assert (await second.hit("a")).allowed


@pytest.mark.parametrize("kind", KINDS)
async def test_group_denial_consumes_nothing(make_limiter: Factory, kind: str) -> None:
    """When one limit of a group denies, the others keep their quota untouched."""
    per_client = make_limiter(ALGORITHMS[kind](1), name="client")
    shared = make_limiter(ALGORITHMS[kind](5), name="global")
    first = await per_client.hit_many([(per_client, "u1"), (shared, "all")])
    assert first.allowed
    assert [math.floor(p.remaining + 1e-6) for p in first.parts] == [0, 4]
    for _ in range(3):
        denied = await per_client.hit_many([(per_client, "u1"), (shared, "all")])
        assert not denied.allowed
        assert denied.name == "client"
        assert [p.allowed for p in denied.parts] == [False, True]
        assert math.floor(denied.parts[1].remaining + 1e-6) == 4
    assert math.floor((await shared.hit("all", 0)).remaining + 1e-6) == 4


@pytest.mark.parametrize("kind", KINDS)
async def test_group_denial_by_a_later_limit_gives_back_the_earlier(
    make_limiter: Factory, kind: str
) -> None:
    """A limit that refuses after another allowed leaves that other one untouched.

    (On a cluster, "all" and "u1" live in different slots: the first limit is taken,
    the second refuses, and the first is refunded.)
    """
    shared = make_limiter(ALGORITHMS[kind](5), name="global")
    per_client = make_limiter(ALGORITHMS[kind](1), name="client")
    assert (await shared.hit_many([(shared, "all"), (per_client, "u1")])).allowed
    for _ in range(3):
        denied = await shared.hit_many([(shared, "all"), (per_client, "u1")])
        assert not denied.allowed
        assert denied.name == "client"
        assert [p.allowed for p in denied.parts] == [True, False]
        assert math.floor(denied.parts[0].remaining + 1e-6) == 4
    assert math.floor((await shared.hit("all", 0)).remaining + 1e-6) == 4
    assert [(await shared.hit("all")).allowed for _ in range(5)] == [True] * 4 + [False]


@pytest.mark.parametrize("kind", KINDS)
async def test_group_headers_list_every_policy(make_limiter: Factory, kind: str) -> None:
    """A group decision's headers carry one RateLimit item per limit."""
    a = make_limiter(ALGORITHMS[kind](3), name="client")
    b = make_limiter(ALGORITHMS[kind](9), name="global")
    headers = (await a.hit_many([(a, "u"), (b, "all")])).headers()
    assert headers["RateLimit"].startswith('"client";r=2;t=')
    assert '"global";r=8;t=' in headers["RateLimit"]
    assert headers["RateLimit-Policy"].startswith('"client";q=3')
    assert headers["X-RateLimit-Remaining"] == "2"


async def test_concurrency_slots_come_back_on_release(make_limiter: Factory) -> None:
    """A released lease frees its slot at once; a renewed one stays held."""
    limiter = make_limiter(ALGORITHMS["concurrency"](2))
    first, second = await limiter.hit("c"), await limiter.hit("c")
    assert first.lease and second.lease and first.lease != second.lease
    assert not (await limiter.hit("c")).allowed
    assert await limiter.renew("c", first)
    await limiter.release("c", first)
    third = await limiter.hit("c")
    assert third.allowed
    await limiter.release("c", first)  # releasing twice is harmless
    assert not (await limiter.hit("c")).allowed
    await limiter.release("c", second)
    await limiter.release("c", third)
    assert not await limiter.renew("c", third)
    assert math.floor((await limiter.hit("c", 0)).remaining + 1e-6) == 2


@pytest.mark.parametrize("kind", ["token_bucket", "fixed_window"])
async def test_non_concurrency_decisions_carry_no_lease(make_limiter: Factory, kind: str) -> None:
    """Only Concurrency hands out leases."""
    limiter = make_limiter(ALGORITHMS[kind](2))
    assert (await limiter.hit("c")).lease is None


@pytest.mark.parametrize("cost", [-1, math.inf, math.nan])
async def test_invalid_cost_is_a_config_error(make_limiter: Factory, cost: float) -> None:
    """A negative or non-finite cost raises ConfigError naming the field."""
    limiter = make_limiter(TokenBucket(1, 5))
    with pytest.raises(ConfigError, match="cost"):
        await limiter.hit("c", cost)


async def test_denial_headers_carry_a_whole_retry_after(make_limiter: Factory) -> None:
    """Retry-After on denial is rounded up to whole seconds, at least 1."""
    limiter = make_limiter(FixedWindow(1, LONG))
    await limiter.hit("c")
    headers = (await limiter.hit("c")).headers()
    assert int(headers["Retry-After"]) >= 1
    assert int(headers["X-RateLimit-Reset"]) >= int(headers["Retry-After"]) - 1
