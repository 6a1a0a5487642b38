"""A real grpcio client sends real RateLimitRequest messages to a `stormguard
ratelimit-service` process; the cases are envoyproxy/ratelimit's README examples and
documented behaviour, each asserting the response fields.

Limits that a test counts up to use hour or day units, so that no window ends while
the test runs (per-second answers are tested in-process with a fake clock)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from rls_process import Service, ServiceFactory
from rls_support import MAX_UINT32, UNIT, codes, descriptor, headers, remaining, request

MONGO = """\
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 500}
"""
MESSAGING = """\
domain: messaging
descriptors:
  # only 5 marketing messages a day to one number
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  # only 100 messages a day to any one number
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
"""
EDGE = """\
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
"""
EXAMPLE4 = """\
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit: {requests_per_unit: 300, unit: second}
"""
INTERNAL = """\
domain: internal
descriptors:
  - key: ldap
    rate_limit: {unlimited: true}
  - key: azure
    rate_limit: {unit: minute, requests_per_unit: 100}
"""
EXAMPLE6 = """\
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 2, unit: day}
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 2, unit: day}
"""
EXAMPLE7 = """\
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
"""
EXAMPLE9 = """\
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 20}
"""
EXAMPLE11 = """\
domain: example11
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit: {unit: hour, requests_per_unit: 10}
"""
STORMGUARD = """\
domain: stormguard
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 3600, algorithm: token_bucket, burst: 2}
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 4}
"""
ALL = (MONGO, MESSAGING, EDGE, EXAMPLE4, INTERNAL, EXAMPLE6, EXAMPLE7, EXAMPLE9, EXAMPLE11)


@pytest.fixture(scope="module")
def rls(module_services: ServiceFactory) -> Service:
    """One service process for every domain above, on the memory store."""
    return module_services(*ALL, STORMGUARD)


def test_example1_a_limit_per_value(rls: Service) -> None:
    """Example 1: (database, users) gets its 500 per second."""
    answer = rls.call(request("mongo_cps", [("database", "users")]))
    assert codes(answer) == ["OK", "OK"]
    limit = answer.statuses[0].current_limit
    assert (limit.requests_per_unit, limit.unit) == (500, UNIT.SECOND)
    assert remaining(answer) == [499]
    assert answer.statuses[0].duration_until_reset.seconds == 1


def test_example2_nested_descriptors_and_the_logical_or(rls: Service) -> None:
    """Example 2: 5 marketing messages a day per number, 100 of any kind; OR of both."""
    marketing = descriptor(("message_type", "marketing"), ("to_number", "2061111111"))
    number = descriptor(("to_number", "2061111111"))
    answers = [rls.call(request("messaging", marketing, number)) for _ in range(6)]
    assert [codes(a) for a in answers[:5]] == [["OK", "OK", "OK"]] * 5
    assert codes(answers[5]) == ["OVER_LIMIT", "OVER_LIMIT", "OK"]
    assert remaining(answers[0]) == [4, 99]
    assert remaining(answers[4]) == [0, 95]
    # all or nothing: the refused sixth took nothing from the 100 a day
    assert remaining(rls.call(request("messaging", number))) == [94]
    assert remaining(rls.call(request("messaging", [("to_number", "2062222222")]))) == [99]


def test_example3_most_specific_match_bans_one_address(rls: Service) -> None:
    """Example 3: 10/s per address, but 50.0.0.5 (requests_per_unit 0) always refused."""
    assert codes(rls.call(request("edge_proxy_per_ip", [("remote_address", "50.0.0.1")]))) == [
        "OK",
        "OK",
    ]
    banned = rls.call(request("edge_proxy_per_ip", [("remote_address", "50.0.0.5")]))
    assert codes(banned) == ["OVER_LIMIT", "OVER_LIMIT"]
    assert banned.statuses[0].current_limit.requests_per_unit == 0


def test_example4_depth_must_match(rls: Service) -> None:
    """Example 4: a two-entry descriptor does not match a one-level limit: OK, no limit."""
    answer = rls.call(request("example4", [("key", "value"), ("subkey", "subvalue")]))
    assert codes(answer) == ["OK", "OK"]
    assert not answer.statuses[0].HasField("current_limit")


def test_example5_unlimited(rls: Service) -> None:
    """Example 5: ldap is unlimited (remaining 2^32-1), azure 100 a minute."""
    answer = rls.call(request("internal", [("ldap", "x")], [("azure", "y")]))
    assert codes(answer) == ["OK", "OK", "OK"]
    assert remaining(answer) == [MAX_UINT32, 99]


def test_example6_shadow_mode(rls: Service) -> None:
    """Example 6: user-a (shadow) is never limited, user-b is; the stats tell them apart."""
    a = descriptor(("service", "auth-service"), ("user", "user-a"))
    b = descriptor(("service", "auth-service"), ("user", "user-b"))
    a_codes = [codes(rls.call(request("example6", a)))[0] for _ in range(3)]
    b_codes = [codes(rls.call(request("example6", b)))[0] for _ in range(3)]
    assert a_codes == ["OK", "OK", "OK"]
    assert b_codes == ["OK", "OK", "OVER_LIMIT"]


def test_example7_replaces(rls: Service) -> None:
    """Example 7: with both descriptors, the replacing 10/s applies and 5/s is dropped."""
    one = descriptor(("key_1", "value_1"), ("user", "bkthomps"))
    two = descriptor(("key_2", "value_2"), ("user", "bkthomps"))
    both = rls.call(request("example7", one, two))
    assert codes(both) == ["OK", "OK", "OK"]
    assert not both.statuses[0].HasField("current_limit")
    assert both.statuses[1].current_limit.requests_per_unit == 10
    alone = rls.call(request("example7", one))
    assert alone.statuses[0].current_limit.requests_per_unit == 5
    assert alone.statuses[0].current_limit.name == "specific_limit"


@pytest.mark.parametrize(
    ("entry", "limited"),
    [
        (("key1", "value1"), True),
        (("key1", "valueXYZ"), True),
        (("key1", "other"), False),
        (("path", "/api/123/action"), True),
        (("path", "/api/user-id/action"), True),
        (("path", "/api/123/other"), False),
    ],
)
def test_example9_wildcards(rls: Service, entry: tuple[str, str], limited: bool) -> None:
    """Example 9: trailing and middle wildcards match; other values are not limited."""
    answer = rls.call(request("example9", [entry]))
    assert answer.statuses[0].HasField("current_limit") is limited


def test_example11_share_threshold(rls: Service) -> None:
    """Example 11: files/* share one count of 10; files_no_share/* count apart."""
    for name in ["files/a.pdf"] * 5 + ["files/b.csv"] * 5:
        assert codes(rls.call(request("example11", [("files", name)])))[0] == "OK"
    assert codes(rls.call(request("example11", [("files", "files/c.txt")])))[0] == "OVER_LIMIT"
    for _ in range(10):
        rls.call(request("example11", [("files_no_share", "files_no_share/a.pdf")]))
    other = rls.call(request("example11", [("files_no_share", "files_no_share/b.csv")]))
    assert codes(other)[0] == "OK"


def test_hits_addend_on_the_wire(rls: Service) -> None:
    """The request's hits_addend counts; a descriptor's own hits_addend wins over it."""
    tenant = [("tenant", "hits")]
    assert remaining(rls.call(request("stormguard", tenant, hits=3))) == [1]
    assert codes(rls.call(request("stormguard", tenant, hits=2)))[0] == "OVER_LIMIT"
    looked = rls.call(request("stormguard", descriptor(*tenant, hits=0), hits=2))
    assert codes(looked)[0] == "OK" and remaining(looked) == [1]


def test_stormguard_algorithm_on_the_wire(rls: Service) -> None:
    """`algorithm: token_bucket` with `burst: 2` refuses the third call of a burst."""
    answers = [rls.call(request("stormguard", [("client", "tb")])) for _ in range(3)]
    assert [codes(a)[0] for a in answers] == ["OK", "OK", "OVER_LIMIT"]
    assert answers[2].statuses[0].duration_until_reset.seconds == 1  # one token per second
    assert headers(answers[2])["Retry-After"] == "1"
    assert headers(answers[0])["RateLimit"] == '"stormguard.client";r=1;t=1'


def test_unknown_domain_and_descriptor_are_ok(rls: Service) -> None:
    """An unknown domain, or a descriptor matching nothing, is OK with no limit."""
    for answer in (
        rls.call(request("nobody", [("database", "users")])),
        rls.call(request("mongo_cps", [("database", "nothing")], [("other", "x")])),
    ):
        assert set(codes(answer)) == {"OK"}
        assert not any(s.HasField("current_limit") for s in answer.statuses)


@pytest.mark.parametrize(
    "message",
    [request("", [("database", "users")]), request("mongo_cps")],
)
def test_a_request_without_domain_or_descriptors_is_invalid(rls: Service, message: Any) -> None:
    """No domain or no descriptors: INVALID_ARGUMENT (envoyproxy/ratelimit errs too)."""
    with pytest.raises(grpc.RpcError) as caught:
        rls.call(message)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_garbage_bytes_are_refused_and_the_service_lives_on(rls: Service) -> None:
    """Bytes that are no RateLimitRequest get a gRPC error; the next call is answered."""
    assert rls.channel is not None
    raw = rls.channel.unary_unary(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    with pytest.raises(grpc.RpcError):
        raw(b"\xff\xff\xff\xff", timeout=10)
    assert codes(rls.call(request("mongo_cps", [("database", "default")])))[0] == "OK"
