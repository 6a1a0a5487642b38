"""RateLimitMiddleware in-process: rules, keys, headers, refusals, store outages."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from asgi_apps import Counting

from stormguard import TokenBucket, parse_rate_limits
from stormguard._errors import ConfigError
from stormguard.asgi import RateLimitMiddleware, Rule
from stormguard.server._rules import parse_limit


def client(app: Any, peer: str = "10.0.0.1") -> httpx.AsyncClient:
    """An httpx client calling ``app`` in-process from ``peer``."""
    transport = httpx.ASGITransport(app=app, client=(peer, 5555))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


@pytest.mark.parametrize(
    ("text", "limit", "window"),
    [
        ("10/minute", 10, 60),
        ("1000/second", 1000, 1),
        ("5 per 30 seconds", 5, 30),
        ("3/2h", 3, 7200),
        ("7 per day", 7, 86400),
        (" 4 / s ", 4, 1),
    ],
)
def test_parse_limit_strings(text: str, limit: float, window: float) -> None:
    """Limit strings become a sliding window with the written quota and window."""
    algorithm = parse_limit(text)
    assert (algorithm.kind, algorithm.limit, algorithm.window) == (
        "sliding_window_counter",
        limit,
        window,
    )


@pytest.mark.parametrize("text", ["", "ten/minute", "5/fortnight", "0/minute", "5 per 0 s", "5"])
def test_parse_limit_rejects_malformed(text: str) -> None:
    """A malformed limit raises ConfigError naming the field."""
    with pytest.raises(ConfigError, match="limit"):
        parse_limit(text)


def test_rule_takes_an_algorithm_object() -> None:
    """An algorithm object is used as it is."""
    bucket = TokenBucket(5, 10)
    assert Rule(bucket).algorithm is bucket


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"key": "cookie:x"}, "key"),
        ({"key": 3}, "key"),
        ({"paths": ["orders"]}, "paths"),
        ({"cost": -1}, "cost"),
    ],
)
def test_rule_rejects_bad_fields(kwargs: dict[str, Any], field: str) -> None:
    """Invalid rule fields raise ConfigError naming them."""
    with pytest.raises(ConfigError, match=field):
        Rule("1/second", **kwargs)


def test_duplicate_rule_names_are_refused() -> None:
    """Two rules with one name would share state: refused at construction."""
    with pytest.raises(ConfigError, match="rules"):
        RateLimitMiddleware(Counting(), [Rule("1/s", name="a"), Rule("2/s", name="a")])


@pytest.mark.parametrize("style", ["dialect", ""])
def test_unknown_header_style_is_refused(style: str) -> None:
    """headers= accepts only ietf, github and both."""
    with pytest.raises(ConfigError, match="headers"):
        RateLimitMiddleware(Counting(), [Rule("1/s")], headers=style)


async def test_per_key_limit_refuses_with_429_and_problem_body() -> None:
    """The N+1-th request of a key gets 429 + Retry-After + an RFC 9457 body; others pass."""
    app = RateLimitMiddleware(Counting(), [Rule("3/minute", key="header:X-API-Key")])
    async with client(app) as c:
        codes = [(await c.get("/", headers={"X-API-Key": "a"})).status_code for _ in range(4)]
        refused = await c.get("/", headers={"X-API-Key": "a"})
        other = await c.get("/", headers={"X-API-Key": "b"})
    assert codes == [200, 200, 200, 429]
    assert other.status_code == 200
    assert refused.headers["content-type"] == "application/problem+json"
    retry_after = int(refused.headers["retry-after"])
    assert 1 <= retry_after <= 120  # a sliding window may ask into the next window
    body = json.loads(refused.content)
    assert (body["status"], body["title"], body["retry_after"]) == (
        429,
        "Too Many Requests",
        retry_after,
    )


async def test_requests_without_the_key_are_not_limited() -> None:
    """A header key absent from a request: the rule does not apply."""
    app = RateLimitMiddleware(Counting(), [Rule("1/minute", key="header:X-API-Key")])
    async with client(app) as c:
        codes = [(await c.get("/")).status_code for _ in range(3)]
    assert codes == [200, 200, 200]


async def test_refused_by_global_does_not_spend_client_quota() -> None:
    """Client and global rules are all or nothing: a global refusal charges no client."""
    rules = [
        Rule("2/minute", key="header:X-API-Key", name="client"),
        Rule("3/minute", key="global", name="global"),
    ]
    app = RateLimitMiddleware(Counting(), rules)
    async with client(app) as c:
        for _ in range(2):
            assert (await c.get("/", headers={"X-API-Key": "a"})).status_code == 200
        assert (await c.get("/", headers={"X-API-Key": "b"})).status_code == 200
        refused = await c.get("/", headers={"X-API-Key": "b"})
    assert refused.status_code == 429
    quotas = {q.name: q for q in parse_rate_limits(refused.headers, now=0)}
    assert quotas["global"].remaining == 0
    assert quotas["client"].remaining == 1  # b's refused request took nothing


@pytest.mark.parametrize(
    ("style", "present", "absent"),
    [
        ("ietf", {"ratelimit", "ratelimit-policy"}, {"x-ratelimit-limit"}),
        ("github", {"x-ratelimit-limit", "x-ratelimit-reset"}, {"ratelimit"}),
        ("both", {"ratelimit", "x-ratelimit-remaining"}, set()),
    ],
)
async def test_header_styles(style: str, present: set[str], absent: set[str]) -> None:
    """Each style renders its own headers, readable by parse_rate_limits."""
    app = RateLimitMiddleware(Counting(), [Rule("1/minute", key="global")], headers=style)
    async with client(app) as c:
        await c.get("/")
        refused = await c.get("/")
    names = set(refused.headers)
    assert present <= names and not (absent & names)
    if "x-ratelimit-reset" in names:
        assert int(refused.headers["x-ratelimit-reset"]) > 1e9  # GitHub: epoch seconds
    quota = parse_rate_limits(refused.headers, now=__import__("time").time())[0]
    assert quota.remaining == 0 and quota.reset_after is not None and quota.reset_after > 0


@pytest.mark.parametrize("on_allowed", [True, False])
async def test_headers_on_allowed_responses(on_allowed: bool) -> None:
    """headers_on_allowed adds the quota headers to admitted responses."""
    app = RateLimitMiddleware(
        Counting(), [Rule("5/minute", key="global")], headers_on_allowed=on_allowed
    )
    async with client(app) as c:
        response = await c.get("/")
    assert response.status_code == 200
    assert ("ratelimit" in response.headers) is on_allowed
    if on_allowed:
        assert parse_rate_limits(response.headers, now=0)[0].remaining == 4


@pytest.mark.parametrize(
    ("trusted", "peer", "forwarded", "same_bucket"),
    [
        ([], "10.0.0.1", {"X-Forwarded-For": "1.1.1.1"}, True),  # never trusted by default
        (["10.8.0.0/16"], "10.8.0.1", {"X-Forwarded-For": "1.1.1.1"}, False),
        (["10.8.0.0/16"], "10.8.0.1", {"Forwarded": 'for="1.1.1.1:99"'}, False),
        (["10.8.0.0/16"], "192.0.2.9", {"X-Forwarded-For": "1.1.1.1"}, True),  # untrusted peer
    ],
)
async def test_forwarded_headers_only_from_trusted_proxies(
    trusted: list[str], peer: str, forwarded: dict[str, str], same_bucket: bool
) -> None:
    """key="ip" believes X-Forwarded-For/Forwarded only when the peer is a trusted proxy."""
    app = RateLimitMiddleware(Counting(), [Rule("1/minute", key="ip")], trusted_proxies=trusted)
    async with client(app, peer=peer) as c:
        first = await c.get("/")
        second = await c.get("/", headers=forwarded)
    assert first.status_code == 200
    assert (second.status_code == 429) is same_bucket


async def test_rightmost_untrusted_forwarded_hop_is_the_client() -> None:
    """A spoofed left-most X-Forwarded-For entry does not choose the bucket."""
    app = RateLimitMiddleware(
        Counting(), [Rule("1/minute", key="ip")], trusted_proxies=["10.8.0.0/16"]
    )
    async with client(app, peer="10.8.0.1") as c:
        first = await c.get("/", headers={"X-Forwarded-For": "6.6.6.6, 1.1.1.1, 10.8.0.7"})
        spoofed = await c.get("/", headers={"X-Forwarded-For": "7.7.7.7, 1.1.1.1"})
    assert (first.status_code, spoofed.status_code) == (200, 429)


async def test_paths_methods_and_callable_keys_select_rules() -> None:
    """A rule covers only its path prefixes and methods; a callable key None skips it."""

    def tenant(scope: dict[str, Any]) -> str | None:
        return None if scope["path"].endswith("/free") else "t"

    rules = [Rule("1/minute", key=tenant, paths=["/api"], methods=["POST"])]
    app = RateLimitMiddleware(Counting(), rules)
    async with client(app) as c:
        posts = [(await c.post("/api/x")).status_code for _ in range(2)]
        gets = [(await c.get("/api/x")).status_code for _ in range(2)]
        other = [(await c.post("/other")).status_code for _ in range(2)]
        free = [(await c.post("/api/free")).status_code for _ in range(2)]
    assert posts == [201, 429]
    assert gets == [200, 200] and other == [201, 201] and free == [201, 201]


async def test_cost_is_charged_per_request() -> None:
    """A rule's cost is what one request takes from the quota."""
    app = RateLimitMiddleware(Counting(), [Rule("5/minute", key="global", cost=2)])
    async with client(app) as c:
        codes = [(await c.get("/")).status_code for _ in range(3)]
    assert codes == [200, 200, 429]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("open", [200, 200, 200]), ("closed", [503, 503, 503]), ("local", [200, 200, 429])],
)
async def test_store_outage_modes_never_500(mode: str, expected: list[int]) -> None:
    """A dead Redis: open admits, closed answers 503 + Retry-After, local limits in memory."""
    from net_support import refused_port

    store = f"redis://127.0.0.1:{refused_port()}/0"  # nothing listens there
    app = RateLimitMiddleware(
        Counting(), [Rule("2/minute", key="global")], store=store, on_store_error=mode
    )
    async with client(app) as c:
        responses = [await c.get("/") for _ in range(3)]
    assert [r.status_code for r in responses] == expected
    for response in responses:
        if response.status_code in (429, 503):
            assert int(response.headers["retry-after"]) >= 1


async def test_lifespan_passes_through() -> None:
    """Non-HTTP scopes reach the app untouched."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    await RateLimitMiddleware(app, [Rule("1/s", key="global")])({"type": "lifespan"}, None, None)
    assert seen == ["lifespan"]


async def test_first_present_key_of_a_list() -> None:
    """key=[header, ip]: the API key when sent, else the address."""
    app = RateLimitMiddleware(Counting(), [Rule("1/minute", key=["header:X-API-Key", "ip"])])
    async with client(app) as c:
        keyed = [(await c.get("/", headers={"X-API-Key": "a"})).status_code for _ in range(2)]
        by_ip = [(await c.get("/")).status_code for _ in range(2)]
    assert keyed == [200, 429] and by_ip == [200, 429]


async def test_store_opened_from_a_url_is_closed_at_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store the middleware opened itself is closed before lifespan shutdown completes."""
    from stormguard.stores import MemoryStore

    closed: list[str] = []

    async def aclose(self: MemoryStore) -> None:
        closed.append("store")

    monkeypatch.setattr(MemoryStore, "aclose", aclose)
    app = RateLimitMiddleware(Counting(), [Rule("1/s")], store="memory://")
    messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[str] = []

    async def receive() -> dict[str, str]:
        return messages.pop(0)

    async def send(message: dict[str, str]) -> None:
        sent.append(message["type"])
        if message["type"] == "lifespan.shutdown.complete":
            assert closed == ["store"]

    await app({"type": "lifespan"}, receive, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


@pytest.mark.parametrize("plain", [True, False])
def test_refusal_answers_like_decide(plain: bool) -> None:
    """RuleSet.refusal: None while decide() admits, decide()'s refusal after, on the
    plain path (every rule for every request) and on the general one (a path rule)."""
    from stormguard.server._decide import RuleSet
    from stormguard.server._view import ScopeView
    from stormguard.stores import MemoryStore
    from stormguard.testing import FakeClock

    def rules() -> list[Rule]:
        paths = None if plain else "/"
        return [
            Rule(TokenBucket(1, 3), key="ip", name="per-ip", paths=paths),
            Rule(TokenBucket(1, 5), key="global", name="all"),
        ]

    clocks = FakeClock(), FakeClock()
    quiet, loud = (RuleSet(rules(), store=MemoryStore(clock=c), asyncio=False) for c in clocks)
    assert (quiet._plain is not None) is plain
    view = ScopeView({"type": "http", "headers": [], "client": ("10.0.0.9", 1)})
    answers = []
    for _ in range(5):
        for clock in clocks:
            clock.advance(0.1)
        refusal, decision = quiet.refusal(view, "GET", "/x"), loud.decide(view, "GET", "/x")
        assert decision is not None
        assert refusal == (None if decision.allowed else decision)
        answers.append(refusal is None)
    assert answers == [True, True, True, False, False]


def _client_of(scope: dict[str, Any]) -> str | None:
    # a key callable: the client a scope names (as the gateway's client_of)
    return scope.get("client-key")  # type: ignore[no-any-return]


def test_a_client_hitter_answers_like_refusal() -> None:
    """RuleSet.client_hitter(key callable): hit(key) answers what refusal() answers
    for a request whose callable returns that key, client after client, and both
    stores end with the same table; rules keyed otherwise, or a single rule (no
    plain path), get no hitter."""
    from stormguard import SlidingWindowCounter
    from stormguard.server._decide import RuleSet
    from stormguard.server._view import ScopeView
    from stormguard.stores import MemoryStore
    from stormguard.testing import FakeClock

    def rules() -> list[Rule]:
        return [
            Rule(TokenBucket(1, 1), key=_client_of, name="per-client"),
            Rule(SlidingWindowCounter(4, 10.0), key="global", name="all"),
        ]

    clocks = FakeClock(), FakeClock()
    stores = [MemoryStore(clock=c) for c in clocks]
    keyed, plain = (RuleSet(rules(), store=s, asyncio=False) for s in stores)
    hit = keyed.client_hitter(_client_of)
    assert hit is not None
    answers = []
    for n, client in enumerate(["a", "b", "a", "c", "a", "b", "a", "d", "e", "f"]):
        for clock in clocks:
            clock.advance(0.05 if n % 3 else 0.4)
        view = ScopeView({"type": "http", "headers": [], "client-key": client})
        answer, expected = hit(client), plain.refusal(view, "GET", "/")
        assert answer == expected
        answers.append(answer.name if answer is not None else None)
        assert list(stores[0]._data.items()) == list(stores[1]._data.items())
    assert "per-client" in answers and "all" in answers  # both limits refused someone
    ip = [Rule(TokenBucket(1, 2), key="ip", name="ip"), Rule(TokenBucket(1, 2), key="global")]
    assert RuleSet(ip, store=MemoryStore(), asyncio=False).client_hitter(_client_of) is None
    one = [Rule(TokenBucket(1, 2), key=_client_of, name="one")]
    assert RuleSet(one, store=MemoryStore(), asyncio=False).client_hitter(_client_of) is None
