"""Clients named by a header on the callback path (issue 24): named once per
connection while the naming headers stay the same, named afresh when they change; and
the upstream header lines patched when only end-to-end values changed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stormguard.gateway._clients import ClientIdentity
from stormguard.gateway._h1client import H1Pool
from stormguard.gateway._wire import (
    block_patch,
    changed_only_at,
    patched,
    patched_block,
    request_headers,
)
from stormguard.server._view import ScopeView

Factory = Callable[..., Any]
LONG = 1_000_000

Headers = list[tuple[bytes, bytes]]


@pytest.mark.parametrize(
    ("rules", "trusted", "names"),
    [
        (["header:X-API-Key"], [], frozenset({b"x-api-key"})),
        (["header:X-API-Key", "Header:X-Team", "ip"], [], frozenset({b"x-api-key", b"x-team"})),
        (["ip"], [], None),  # one client per connection already
        (["header:X-API-Key", "ip"], ["10.0.0.0/8"], None),  # forwarded addresses count
    ],
)
def test_which_identities_are_named_by_their_headers_alone(
    rules: list[str], trusted: list[str], names: frozenset[bytes] | None
) -> None:
    """Only `header:NAME` and `ip` rules with no trusted proxy make a key follow from
    the headers on one connection."""
    assert ClientIdentity(rules, trusted).header_names == names


def test_the_token_holds_the_naming_headers_in_order_whatever_their_case() -> None:
    """The token is every naming header, repeated ones too, in the request's order."""
    identity = ClientIdentity(["header:X-API-Key", "ip"], [])
    headers = [(b"host", b"h"), (b"x-api-key", b"a"), (b"accept", b"*/*"), (b"X-API-Key", b"b")]
    assert identity.token(headers) == ((b"x-api-key", b"a"), (b"X-API-Key", b"b"))


@pytest.mark.parametrize(
    "headers",
    [
        [(b"host", b"h"), (b"x-api-key", b"a")],
        [(b"host", b"h"), (b"x-api-key", b"a"), (b"x-team", b"t"), (b"X-API-Key", b"b")],
        [(b"host", b"h"), (b"x-api-key", b"")],  # empty: the next rule names the client
        [(b"host", b"h"), (b"x-team", b"t")],
        [(b"host", b"h"), (b"x-api-key", b"caf\xe9")],
        [(b"host", b"h")],  # no header: by address
    ],
)
def test_naming_from_the_token_is_naming_from_the_whole_scope(headers: Headers) -> None:
    """The rules read from the token name the client exactly as from a ScopeView."""
    identity = ClientIdentity(["header:X-API-Key", "header:X-Team", "ip"], [])
    scope = _scope(headers)
    view = identity.view(scope, identity.token(headers))
    assert identity.identify(view) == identity.identify(ScopeView(scope))
    assert view.header("host") == "h"  # other headers still read from the scope


@pytest.mark.parametrize(
    "rules",
    [
        ["header:X-API-Key", "header:X-Team", "ip"],
        ["header:X-API-Key"],
        ["ip", "header:X-API-Key"],  # the address first: never read off the token
        ["Header: X-Team ", "header:X-API-Key"],
    ],
)
@given(
    headers=st.lists(
        st.tuples(
            st.sampled_from([b"host", b"x-api-key", b"X-API-Key", b"x-team", b"accept"]),
            st.binary(max_size=4),
        ),
        max_size=6,
    )
)
def test_naming_off_the_token_alone_is_naming_from_the_whole_scope(
    rules: list[str], headers: Headers
) -> None:
    """ClientIdentity.from_token: where it names the client, it names it as the
    rules do from a ScopeView of the whole request; it defers (None) only where the
    address would be asked first."""
    identity = ClientIdentity(rules, [])
    scope = _scope(headers)
    found = identity.from_token(identity.token(headers))
    expected = identity.identify(ScopeView(scope))
    if found is None:
        assert expected[0] == "ip"
    else:
        assert found == expected


def _scope(headers: Headers) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "scheme": "http",
        "headers": headers,
        "client": ("127.0.0.1", 5000),
    }


def _block(headers: Headers) -> bytes:
    """The header lines the gateway renders for ``headers`` (no patching)."""
    return H1Pool.header_block("GET", request_headers(_scope(headers), False))


BASE: Headers = [(b"host", b"gw"), (b"x-api-key", b"client-1"), (b"accept", b"*/*")]
OTHER_KEY: Headers = [(b"host", b"gw"), (b"x-api-key", b"client-2"), (b"accept", b"*/*")]


@pytest.mark.parametrize(
    "changed",
    [
        [(b"host", b"gw"), (b"x-api-key", b"client-2"), (b"accept", b"*/*")],
        [(b"host", b"gw"), (b"x-api-key", b"a-much-longer-client-key"), (b"accept", b"*/*")],
        [(b"host", b"gw"), (b"x-api-key", b"client-1"), (b"accept", b"text/html")],
        [(b"host", b"gw"), (b"x-api-key", b"client-2"), (b"accept", b"text/html")],
        [(b"host", b"gw"), (b"x-api-key", b""), (b"accept", b"")],
        BASE,
    ],
)
def test_a_patched_block_is_the_block_rendered_afresh(changed: Headers) -> None:
    """End-to-end values changed (one or more): the patched lines are exactly the
    fresh ones."""
    assert patched_block(BASE, _block(BASE), changed) == _block(changed)


@pytest.mark.parametrize(
    ("kept", "changed"),
    [
        (BASE, [(b"host", b"other"), (b"x-api-key", b"client-1"), (b"accept", b"*/*")]),
        (BASE, [(b"host", b"other"), (b"x-api-key", b"client-2"), (b"accept", b"*/*")]),
        (BASE, [(b"host", b"gw"), (b"x-api-key", b"client-1")]),
        (BASE, [(b"host", b"gw"), (b"x-team", b"client-1"), (b"accept", b"*/*")]),
        (
            [*BASE, (b"x-forwarded-for", b"1.2.3.4")],
            [*BASE, (b"x-forwarded-for", b"5.6.7.8")],
        ),
        (
            [*BASE, (b"connection", b"x-api-key")],  # names x-api-key hop-by-hop: dropped
            [*OTHER_KEY, (b"connection", b"x-api-key")],
        ),
        (
            [(b"x-api-key", b"same"), (b"x-api-key", b"same")],  # which line is which?
            [(b"x-api-key", b"other"), (b"x-api-key", b"same")],
        ),
    ],
)
def test_any_other_change_renders_the_block_afresh(kept: Headers, changed: Headers) -> None:
    """A rewritten header changed (alone or with another), a renamed or dropped one,
    one fewer, an ambiguous line: no patch (None), the lines are rendered from scratch."""
    assert patched_block(kept, _block(kept), changed) is None


@pytest.mark.parametrize(
    "keys",
    [
        [b"client-2", b"client-3", b"a-much-longer-client-key", b"c"],
        [b"client-1", b"client-1"],  # the same key again
    ],
)
def test_a_kept_patch_renders_each_next_value_as_afresh(keys: list[bytes]) -> None:
    """The patch found once makes, for every next value of the same header, exactly
    the lines rendered from scratch."""
    patch = block_patch(BASE, _block(BASE), OTHER_KEY)
    assert patch is not None and patch[0] == (1,)
    kept = OTHER_KEY
    for key in keys:
        changed = [(b"host", b"gw"), (b"x-api-key", key), (b"accept", b"*/*")]
        assert changed_only_at(kept, changed, patch[0])
        assert patched(patch, changed) == _block(changed)
        kept = changed


@pytest.mark.parametrize(
    "changed",
    [
        [(b"host", b"gw"), (b"x-api-key", b"client-2"), (b"accept", b"text/html")],
        [(b"host", b"gw"), (b"x-api-key", b"client-1"), (b"accept", b"text/html")],
        [(b"host", b"gw"), (b"x-team", b"client-2"), (b"accept", b"*/*")],
        [(b"host", b"gw"), (b"x-api-key", b"client-2")],
    ],
)
def test_a_kept_patch_is_not_used_for_any_other_change(changed: Headers) -> None:
    """Another header changed too, instead, renamed, or one fewer: not at the kept place."""
    assert not changed_only_at(OTHER_KEY, changed, (1,))


VALUES = st.binary(max_size=6).filter(lambda v: b"\r" not in v and b"\n" not in v)


@given(
    names=st.lists(
        st.sampled_from([b"x-api-key", b"accept", b"x-request-id", b"traceparent", b"via"]),
        min_size=1,
        max_size=5,
    ),
    data=st.data(),
)
def test_a_patch_for_any_changed_values_is_the_block_rendered_afresh(
    names: list[bytes], data: st.DataObject
) -> None:
    """For any headers and any new values of them, a patch, where there is one, gives
    exactly the lines rendered afresh, for the headers it was found for and for a third
    request whose values change at the same places."""
    kept = [(b"host", b"gw"), *((name, data.draw(VALUES)) for name in names)]
    changed = [(name, data.draw(VALUES) if i else value) for i, (name, value) in enumerate(kept)]
    patch = block_patch(kept, _block(kept), changed)
    if patch is None:
        return
    assert patched(patch, changed) == _block(changed)
    third = [
        (name, data.draw(VALUES) if i in patch[0] else value)
        for i, (name, value) in enumerate(changed)
    ]
    assert changed_only_at(changed, third, patch[0])
    assert patched(patch, third) == _block(third)


def test_clients_changing_on_one_connection_keep_their_own_limits_and_headers(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """On one keep-alive connection, requests naming clients A, B, A, B, A by X-API-Key
    are limited per client (2 each) and reach the upstream with their own key."""
    up = upstream_factory()
    config: dict[str, Any] = {
        "clients": {"key": ["header:X-API-Key", "ip"]},
        "upstreams": {"a": {"url": up.url}},
        "limits": {"per-client": {"algorithm": "fixed_window", "limit": 2, "window": LONG}},
        "routes": [{"path": "/", "upstream": "a", "limits": ["per-client"]}],
    }
    gw = gateway_factory(config)
    order = ["A", "B", "A", "B", "A", "B", "C"]
    answers = []
    with httpx.Client(timeout=10) as client:
        for key in order:
            r = client.get(f"{gw.url}/echo", headers={"X-API-Key": key})
            got = {k.lower(): v for k, v in r.json()["headers"].items()} if r.is_success else {}
            seen = got.get("x-api-key")
            answers.append((r.status_code, seen))
    assert answers == [
        (200, "A"),
        (200, "B"),
        (200, "A"),
        (200, "B"),
        (429, None),
        (429, None),
        (200, "C"),
    ]
