"""RuleSet.submit (no coroutine, no task), shadow rules and approximate rules, on a
MemoryStore and on a real Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from stormguard import FixedWindow, SlidingWindowCounter, TokenBucket
from stormguard.asgi import Rule
from stormguard.server._decide import RuleSet, shadow_refusals
from stormguard.stores import MemoryStore

LONG = 1_000_000.0


class View:
    """A request as the rules read it: one header and a peer."""

    def __init__(self, client: str) -> None:
        self.client = client
        self.raw: dict[str, Any] = {}

    def header(self, name: str) -> str | None:
        return self.client if name == "x-api-key" else None

    def peer(self) -> str | None:
        return "10.0.0.1"


def _rules(**shadow: bool) -> list[Rule]:
    return [
        Rule(
            FixedWindow(3, LONG), key="header:X-API-Key", name="pc", shadow=shadow.get("pc", False)
        ),
        Rule(TokenBucket(1e-6, 5), key="global", name="all", shadow=shadow.get("all", False)),
    ]


@pytest.fixture(params=["memory", "redis"])
async def store_of(
    request: pytest.FixtureRequest, key_prefix: str
) -> AsyncIterator[Callable[[], Any]]:
    """Stores of the parametrized kind, one per call (Redis: unique key prefixes)."""
    made: list[Any] = []

    def make() -> Any:
        if request.param == "memory":
            return MemoryStore()
        pytest.importorskip("redis")
        from stormguard.stores import AsyncRedisStore

        url = request.getfixturevalue("redis_url")
        store = AsyncRedisStore(url, prefix=f"{key_prefix}{len(made)}:", socket_timeout=5)
        made.append(store)
        return store

    yield make
    for store in made:
        keys = await store.client.keys(store.prefix + "*")
        if keys:
            await store.client.delete(*keys)
        await store.aclose()


async def test_submit_answers_as_the_limiters_do(store_of: Callable[[], Any]) -> None:
    """The same requests through submit and through the limiters' hit_many (the
    coroutine path every other store takes): the same decisions."""
    by_submit = RuleSet(_rules(), store=store_of())
    by_limiters = RuleSet(_rules(), store=store_of())
    for client in ["a", "a", "b", "a", "a", "b", "c", "c"]:
        one = await by_submit.submit(View(client), "GET", "/")
        two = await by_limiters._adecide(View(client), "GET", "/")
        assert one is not None and two is not None
        fields = lambda d: (d.allowed, d.name, round(d.remaining, 3), [p.name for p in d.parts])  # noqa: E731
        assert fields(one) == fields(two)


async def test_quiet_submit_answers_none_unless_refused(store_of: Callable[[], Any]) -> None:
    """quiet=True: None for an admitted request, the refusal otherwise."""
    rules = RuleSet(_rules(), store=store_of())
    answers = [await rules.submit(View("a"), "GET", "/", quiet=True) for _ in range(4)]
    assert answers[:3] == [None, None, None]
    assert answers[3] is not None and not answers[3].allowed and answers[3].name == "pc"


async def test_a_kept_submitter_answers_as_submit_does(store_of: Callable[[], Any]) -> None:
    """RuleSet.submitter: one client's quiet submits as a callable answer what
    submit(quiet=True) answers, request for request, on a store of its own each;
    a MemoryStore takes no submits, so it has none."""
    store = store_of()
    kept = RuleSet(_rules(), store=store).submitter(View("a"))
    if isinstance(store, MemoryStore):
        assert kept is None
        return
    assert kept is not None
    fresh = RuleSet(_rules(), store=store_of())
    by_kept = [await kept() for _ in range(5)]
    by_submit = [await fresh.submit(View("a"), "GET", "/", quiet=True) for _ in range(5)]
    assert [a is None for a in by_kept] == [a is None for a in by_submit]
    assert by_kept[:3] == [None, None, None]
    assert all(a is not None and not a.allowed and a.name == "pc" for a in by_kept[3:])


@pytest.mark.redis
@pytest.mark.parametrize(
    "rules",
    [
        [Rule(FixedWindow(3, LONG), key="global", name="g", methods=["POST"])],
        [Rule(FixedWindow(3, LONG), key="global", name="g", paths=["/api"])],
        [
            Rule(FixedWindow(3, LONG), key="global", name="g"),
            Rule(FixedWindow(1, LONG), key="global", name="s", shadow=True),
        ],
    ],
    ids=["by-method", "by-path", "shadow-reported"],
)
async def test_no_submitter_when_the_answer_reads_more_than_the_keys(
    rules: list[Rule], redis_url: str, key_prefix: str
) -> None:
    """A rule filtering by method or path, or a shadow rule whose refusal goes to
    on_shadow with the request: each request must be submitted whole."""
    from stormguard.stores import AsyncRedisStore

    async with AsyncRedisStore(redis_url, prefix=key_prefix, socket_timeout=5) as store:
        ruleset = RuleSet(rules, store=store, on_shadow=lambda view, refused: None)
        assert ruleset.submitter(View("a")) is None


async def test_submit_resolves_from_a_callback_without_a_task(store_of: Callable[[], Any]) -> None:
    """A done-callback gets the decision; no task is made for the request."""
    rules = RuleSet(_rules(), store=store_of())
    await rules.submit(View("warm"), "GET", "/")  # connected
    before = len(asyncio.all_tasks())
    got: list[Any] = []
    arrived = asyncio.Event()
    pending = rules.submit(View("a"), "GET", "/")
    pending.add_done_callback(lambda p: (got.append(p.result()), arrived.set()))
    assert len(asyncio.all_tasks()) == before
    await asyncio.wait_for(arrived.wait(), 5)
    assert got[0].allowed


async def test_shadow_rule_never_refuses_and_reports_what_it_would_have(
    store_of: Callable[[], Any],
) -> None:
    """A shadow per-client limit of 3: every request admitted; from the fourth on the
    decision lists it as a shadow refusal, and on_shadow hears of it."""
    heard: list[tuple[str, ...]] = []
    rules = RuleSet(
        _rules(pc=True),
        store=store_of(),
        on_shadow=lambda view, refused: heard.append(tuple(d.name for d in refused)),
    )
    decisions = [await rules.submit(View("a"), "GET", "/") for _ in range(5)]
    assert all(d is not None and d.allowed for d in decisions)
    assert [tuple(d.name for d in shadow_refusals(d)) for d in decisions] == [()] * 3 + [
        ("pc",)
    ] * 2
    assert heard == [("pc",)] * 2
    # The enforced global limit (5) took all five; the shadow one is not in the headers.
    assert decisions[-1] is not None and decisions[-1].name == "all"
    assert "pc" not in decisions[-1].headers()["RateLimit-Policy"]


async def test_shadow_rules_are_not_charged_when_an_enforced_rule_refuses(
    store_of: Callable[[], Any],
) -> None:
    """The enforced global limit (5) refuses the sixth request; the shadow per-client
    limit counted only the five admitted ones (its refusals start at the fourth)."""
    heard: list[int] = []
    rules = RuleSet(_rules(pc=True), store=store_of(), on_shadow=lambda v, r: heard.append(1))
    answers = [await rules.submit(View("a"), "GET", "/") for _ in range(7)]
    assert [a is not None and a.allowed for a in answers] == [True] * 5 + [False] * 2
    assert len(heard) == 2  # the 4th and 5th only: refused requests are not shadow-decided


async def test_every_rule_shadow_with_the_rule_set_flag(store_of: Callable[[], Any]) -> None:
    """RuleSet(shadow=True): nothing is ever refused; refusals are only reported."""
    heard: list[str] = []
    rules = RuleSet(
        _rules(),
        store=store_of(),
        shadow=True,
        on_shadow=lambda v, r: heard.extend(d.name for d in r),
    )
    answers = [await rules.adecide(View("a"), "GET", "/") for _ in range(6)]
    assert all(a is None or a.allowed for a in answers)
    # The shadow group is all or nothing: from the 4th request the per-client limit
    # refuses, so the group takes nothing and the global one stays at 3 of 5.
    assert heard == ["pc", "pc", "pc"]


def test_sync_rules_take_only_algorithms_with_one_string_state() -> None:
    """sync= is for token buckets, GCRA, fixed and sliding windows; must be > 0."""
    from stormguard import ConfigError, SlidingWindowLog

    Rule(SlidingWindowCounter(5, 60), sync=0.5)
    with pytest.raises(ConfigError, match="sync"):
        Rule(SlidingWindowLog(5, 60), sync=0.5)
    with pytest.raises(ConfigError, match="sync"):
        Rule(FixedWindow(5, 60), sync=0)
    with pytest.raises(ConfigError, match="shadow"):
        Rule(FixedWindow(5, 60), shadow="yes")  # type: ignore[arg-type]


async def _evalsha_calls(client: Any) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.redis
async def test_approximate_rule_decides_locally_from_reservations(
    owned_redis: Any, key_prefix: str
) -> None:
    """sync=: after the first reservations, hits are decided in this process; the
    count stays exact while no refill happens (50 admitted of a limit of 50)."""
    from stormguard.stores import AsyncRedisStore

    async with AsyncRedisStore(owned_redis.url, prefix=key_prefix, socket_timeout=5) as store:
        rules = RuleSet(
            [Rule(FixedWindow(50, LONG), key="global", name="g", sync=5.0)], store=store
        )
        before = await _evalsha_calls(store.client)
        answers = [await rules.submit(View("a"), "GET", "/") for _ in range(80)]
        calls = await _evalsha_calls(store.client) - before
        assert sum(a is not None and a.allowed for a in answers) == 50
        assert calls <= 12  # leases double: 1, 2, 4, ... and the refusal is cached
        refused = [a for a in answers if a is not None and not a.allowed]
        assert refused and all(a.retry_after > 0 for a in refused)


@pytest.mark.redis
async def test_a_quiet_approximate_admission_is_the_shared_answer(
    owned_redis: Any, key_prefix: str
) -> None:
    """Every limit approximate, its reservation in hand: a quiet submit that admits
    answers the one resolved Pending that says nothing (NOTHING: no Pending, no
    answer built per request); the refusal past the limit is still a Decision."""
    from stormguard.server._plan import NOTHING
    from stormguard.stores import AsyncRedisStore

    async with AsyncRedisStore(owned_redis.url, prefix=key_prefix, socket_timeout=5) as store:
        rules = RuleSet(
            [Rule(FixedWindow(20, LONG), key="global", name="g", sync=5.0)], store=store
        )
        shared = 0
        answers = []
        for _ in range(30):
            pending = rules.submit(View("a"), "GET", "/", quiet=True)
            shared += pending is NOTHING
            answers.append(await pending)
        assert answers[:20] == [None] * 20  # admitted, quietly
        assert all(a is not None and not a.allowed for a in answers[20:])
        assert shared >= 10  # at once from the reservation, most of the time


@pytest.mark.redis
async def test_unused_reservations_are_given_back_after_the_sync_interval(
    owned_redis: Any, key_prefix: str
) -> None:
    """What a process reserved and did not spend returns to Redis after `sync` seconds."""
    from stormguard.stores import AsyncRedisStore

    async with AsyncRedisStore(owned_redis.url, prefix=key_prefix, socket_timeout=5) as store:
        rules = RuleSet(
            [Rule(FixedWindow(40, LONG), key="global", name="g", sync=0.2)], store=store
        )
        for _ in range(12):  # leases grow: more is reserved than spent
            await rules.submit(View("a"), "GET", "/")
        raw = await store.client.get(f"{key_prefix}{{global}}:g")
        reserved = float(raw.split(b":")[1])
        assert reserved > 12
        await asyncio.sleep(0.3)
        await rules.submit(View("a"), "GET", "/")  # the sweep gives the rest back
        deadline = time.monotonic() + 5
        while True:
            raw = await store.client.get(f"{key_prefix}{{global}}:g")
            count = float(raw.split(b":")[1])
            if count < reserved:
                break
            assert time.monotonic() < deadline, "nothing was given back"
            await asyncio.sleep(0.05)
        assert count <= 13 + 40 / 4  # 13 spent, and at most a new lease (limit / 4)
