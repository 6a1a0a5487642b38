"""The service's decisions in-process, on a MemoryStore with a fake clock: the answers
envoyproxy/ratelimit gives (second-unit windows, hits_addend, shadow, replaces, quota
mode, overrides) and stormguard's own (algorithms, all or nothing, headers)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rls_support import MAX_UINT32, OK, OVER_LIMIT, UNIT, codes, descriptor, headers, request
from rls_support import remaining as remaining_of
from stormguard.gateway.rls._config import parse_domain
from stormguard.gateway.rls._decide import Decider, Outcome, RequestError
from stormguard.stores import MemoryStore
from stormguard.testing import FakeClock

CONFIG = """\
domain: d
descriptors:
  - key: per_second
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: blocked
    rate_limit: {name: blocked, unit: minute, requests_per_unit: 0}
  - key: open
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3}
  - key: slide
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: sliding_window}
  - key: quota
    value: a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota
    value: b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: held
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency, lease: 10}
  - key: user
    rate_limit: {name: user_limit, unit: minute, requests_per_unit: 5}
  - key: vip
    rate_limit:
      replaces: [{name: user_limit}]
      unit: minute
      requests_per_unit: 100
"""


class Harness:
    """A Decider on a MemoryStore driven by a fake clock."""

    def __init__(self, text: str = CONFIG, **options: Any) -> None:
        self.clock = FakeClock(1000.0)
        domain = parse_domain(text)
        self.outcomes: list[Outcome] = []
        self.decider = Decider(
            {domain.name: domain},
            MemoryStore(clock=self.clock),
            clock=self.clock,
            record=self.outcomes.append,
            **options,
        )

    def __call__(self, *descriptors: Any, hits: int = 0, domain: str = "d") -> Any:
        return asyncio.run(self.decider.decide(request(domain, *descriptors, hits=hits)))


@pytest.fixture
def rls() -> Harness:
    """The decision harness over CONFIG."""
    return Harness()


def test_second_window_counts_and_resets(rls: Harness) -> None:
    """Two per second: the third is OVER_LIMIT until the next second begins."""
    answers = [rls([("per_second", "x")]) for _ in range(3)]
    assert [codes(a) for a in answers] == [["OK", "OK"], ["OK", "OK"], ["OVER_LIMIT"] * 2]
    assert [remaining_of(a) for a in answers] == [[1], [0], [0]]
    status = answers[0].statuses[0]
    assert (status.current_limit.requests_per_unit, status.current_limit.unit) == (2, UNIT.SECOND)
    assert status.duration_until_reset.seconds == 1
    rls.clock.advance(1.0)
    assert codes(rls([("per_second", "x")])) == ["OK", "OK"]


def test_values_count_apart(rls: Harness) -> None:
    """A key without a value in the config gives each request value its own count."""
    for _ in range(2):
        rls([("per_second", "a")])
    assert codes(rls([("per_second", "a")]))[0] == "OVER_LIMIT"
    assert codes(rls([("per_second", "b")]))[0] == "OK"


@pytest.mark.parametrize(("hits", "answers"), [(2, ["OK", "OVER_LIMIT"]), (3, ["OVER_LIMIT"])])
def test_request_hits_addend(rls: Harness, hits: int, answers: list[str]) -> None:
    """The request's hits_addend is what each descriptor takes (all of it or none)."""
    seen = [codes(rls([("per_second", "h")], hits=hits))[0] for _ in answers]
    assert seen == answers


def test_descriptor_hits_addend_overrides_the_request(rls: Harness) -> None:
    """A descriptor's own hits_addend wins; 0 looks without taking anything."""
    look = rls(descriptor(("per_second", "z"), hits=0), hits=5)
    assert codes(look) == ["OK", "OK"] and remaining_of(look) == [2]
    take = rls(descriptor(("per_second", "z"), hits=2), hits=1)
    assert codes(take) == ["OK", "OK"] and remaining_of(take) == [0]


def test_unknown_domain_and_descriptor_are_ok(rls: Harness) -> None:
    """No domain or no matching descriptor: OK, no current_limit (envoyproxy/ratelimit)."""
    for answer in (rls([("nothing", "here")]), rls([("per_second", "x")], domain="other")):
        assert codes(answer) == ["OK", "OK"]
        assert not answer.statuses[0].HasField("current_limit")
        assert answer.statuses[0].limit_remaining == 0
        assert not answer.response_headers_to_add


def test_requests_per_unit_zero_refuses_without_the_store(rls: Harness) -> None:
    """requests_per_unit: 0 blocks every request (envoyproxy/ratelimit's ban)."""
    answer = rls([("blocked", "1.2.3.4")])
    assert codes(answer) == ["OVER_LIMIT"] * 2
    assert answer.statuses[0].current_limit.name == "blocked"
    assert answer.statuses[0].current_limit.requests_per_unit == 0


def test_unlimited_is_ok_with_max_remaining(rls: Harness) -> None:
    """An unlimited descriptor is OK with limit_remaining 2^32-1 and no current_limit."""
    answer = rls([("per_second", "u")], [("nothing", "x")], [("open", "x")])
    assert codes(answer) == ["OK"] * 4
    assert remaining_of(answer) == [1, 0, MAX_UINT32]
    assert not answer.statuses[2].HasField("current_limit")


def test_shadow_mode_never_refuses_and_is_counted_apart(rls: Harness) -> None:
    """Over its limit a shadow descriptor answers OK; the stats say shadow_refused."""
    answers = [rls([("shadow", "s")]) for _ in range(3)]
    assert [codes(a) for a in answers] == [["OK", "OK"]] * 3
    results = [o.result for o in rls.outcomes]
    assert results == ["allowed", "shadow_refused", "shadow_refused"]


def test_a_refusing_shadow_limit_does_not_stop_the_others(rls: Harness) -> None:
    """Mixed: the enforced descriptor still counts while the shadow one is over."""
    rls([("shadow", "m")])
    first = rls([("shadow", "m")], [("per_second", "m")])
    second = rls([("shadow", "m")], [("per_second", "m")])
    third = rls([("shadow", "m")], [("per_second", "m")])
    assert [codes(a) for a in (first, second, third)] == [
        ["OK", "OK", "OK"],
        ["OK", "OK", "OK"],
        ["OVER_LIMIT", "OK", "OVER_LIMIT"],
    ]
    assert [remaining_of(a)[1] for a in (first, second)] == [1, 0]


def test_refused_request_takes_nothing_from_the_other_descriptors(rls: Harness) -> None:
    """All or nothing: a descriptor over its limit leaves the others' counts alone."""
    rls([("per_second", "full")], hits=2)
    refused = rls([("per_second", "full")], [("slide", "free")])
    assert codes(refused) == ["OVER_LIMIT", "OVER_LIMIT", "OK"]
    assert remaining_of(refused) == [0, 4]  # the sliding window was not charged
    assert remaining_of(rls([("slide", "free")])) == [3]


def test_replaces_drops_the_named_limit(rls: Harness) -> None:
    """A matched limit that replaces another makes that one as if unmatched (uncounted)."""
    answer = rls([("user", "u1")], [("vip", "u1")])
    assert codes(answer) == ["OK", "OK", "OK"]
    assert not answer.statuses[0].HasField("current_limit")
    assert answer.statuses[1].current_limit.requests_per_unit == 100
    assert remaining_of(rls([("user", "u1")])) == [4]  # the replaced limit took nothing


@pytest.mark.parametrize(
    ("descriptors", "overall"),
    [
        ([[("quota", "a")], [("quota", "b")]], ["OK", "OK"]),  # a over, b not: OK
        ([[("quota", "a")]], ["OVER_LIMIT"]),  # every quota descriptor over
    ],
)
def test_quota_mode_refuses_only_when_every_quota_descriptor_is_over(
    descriptors: list[Any], overall: list[str]
) -> None:
    """quota_mode: OVER_LIMIT only when all quota descriptors are over their limit."""
    rls = Harness()
    rls([("quota", "a")])  # a's one request is used
    answer = rls(*descriptors)
    assert [codes(answer)[0]] == overall[:1]
    assert codes(answer)[1] == "OVER_LIMIT"  # the descriptor itself says it is over


def test_token_bucket_per_descriptor(rls: Harness) -> None:
    """algorithm: token_bucket -- a burst of 3, then one per second."""
    assert [codes(rls([("tb", "t")]))[0] for _ in range(4)] == ["OK"] * 3 + ["OVER_LIMIT"]
    refused = rls([("tb", "t")])
    assert refused.statuses[0].duration_until_reset.seconds == 1  # the next token
    rls.clock.advance(1.0)
    assert codes(rls([("tb", "t")]))[0] == "OK"


def test_concurrency_slots_are_freed_by_their_lease(rls: Harness) -> None:
    """algorithm: concurrency -- Envoy never says a request ended: a lease frees a slot."""
    assert [codes(rls([("held", "c")]))[0] for _ in range(3)] == ["OK", "OK", "OVER_LIMIT"]
    rls.clock.advance(10.0)
    assert codes(rls([("held", "c")]))[0] == "OK"


def test_sliding_window_does_not_reset_at_the_edge(rls: Harness) -> None:
    """algorithm: sliding_window -- the previous minute still counts after its end."""
    for _ in range(4):
        rls([("slide", "w")])
    rls.clock.advance(21.0)  # t=1021: one second into the next fixed minute
    assert codes(rls([("slide", "w")]))[0] == "OVER_LIMIT"  # a fixed window would admit


def test_limit_override_from_the_request(rls: Harness) -> None:
    """A descriptor's limit override replaces the configured limit (a fixed window)."""
    override = descriptor(("per_second", "o"), limit=(3, "HOUR"))
    answers = [rls(override) for _ in range(4)]
    assert [codes(a)[0] for a in answers] == ["OK", "OK", "OK", "OVER_LIMIT"]
    limit = answers[0].statuses[0].current_limit
    assert (limit.requests_per_unit, limit.unit) == (3, UNIT.HOUR)


def test_same_counter_twice_in_one_request_takes_both(rls: Harness) -> None:
    """Two descriptors naming one counter are one hit of both costs."""
    answer = rls([("per_second", "dup")], [("per_second", "dup")])
    assert codes(answer) == ["OK", "OK", "OK"] and remaining_of(answer) == [0, 0]
    assert codes(rls([("per_second", "dup")]))[0] == "OVER_LIMIT"


def test_response_headers_carry_the_ratelimit_fields(rls: Harness) -> None:
    """response_headers_to_add: IETF RateLimit/RateLimit-Policy; Retry-After when refused."""
    allowed = headers(rls([("per_second", "hd")]))
    assert allowed == {
        "RateLimit-Policy": '"d.per_second";q=2;w=1',
        "RateLimit": '"d.per_second";r=1;t=1',
    }
    rls([("per_second", "hd")])
    refused = headers(rls([("per_second", "hd")]))
    assert refused["Retry-After"] == "1"


def test_github_headers_and_none() -> None:
    """`--headers github` renders X-RateLimit-*; `none` adds nothing."""
    github = Harness(headers="github")([("per_second", "g")])
    assert headers(github)["X-RateLimit-Limit"] == "2"
    assert headers(github)["X-RateLimit-Remaining"] == "1"
    assert not Harness(headers=None)([("per_second", "g")]).response_headers_to_add


@pytest.mark.parametrize(
    ("domain", "descriptors", "message"),
    [
        ("", [[("per_second", "x")]], "rate limit domain must not be empty"),
        ("d", [], "rate limit descriptor list must not be empty"),
    ],
)
def test_requests_without_domain_or_descriptors_are_errors(
    rls: Harness, domain: str, descriptors: list[Any], message: str
) -> None:
    """What envoyproxy/ratelimit refuses (no domain, no descriptors) is a RequestError."""
    with pytest.raises(RequestError, match=message):
        rls(*descriptors, domain=domain)


def test_hostile_values_never_make_huge_keys(rls: Harness) -> None:
    """A very long value is counted under its SHA-256, and still counted."""
    long = "x" * 100_000
    assert codes(rls([("per_second", long)]))[0] == "OK"
    assert rls.outcomes[-1].value.startswith("sha256:")
    assert remaining_of(rls([("per_second", long)])) == [0]


def test_overall_and_statuses_keep_the_request_order(rls: Harness) -> None:
    """One status per descriptor, in the request's order."""
    answer = rls([("open", "1")], [("blocked", "2")], [("nothing", "3")])
    assert answer.overall_code == OVER_LIMIT
    assert [s.code for s in answer.statuses] == [OK, OVER_LIMIT, OK]
