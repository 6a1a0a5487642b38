"""The request head's pure rules (gateway/http/_head.py)."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stormguard.gateway.http._head import (
    HeaderValueError,
    host_of,
    normalise_path,
    render_headers,
    status_line,
    valid_host,
)

# -- normalise_path ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"/", b"/"),
        (b"/login", b"/login"),
        (b"/x/../login", b"/login"),
        (b"//login", b"/login"),
        (b"/./login", b"/login"),
        (b"/%6Cogin", b"/login"),
        (b"/%6cogin", b"/login"),
        (b"/a/b/c/./../../g", b"/a/g"),
        (b"/a/b/..", b"/a/"),
        (b"/a/b/.", b"/a/b/"),
        (b"/a/..", b"/"),
        (b"/a///b", b"/a/b"),
        (b"/a%2Fb", b"/a%2Fb"),
        (b"/a%2fb", b"/a%2fb"),
        (b"/%2e%2e/x/../y", None),
        (b"/x/%2E%2E/y", b"/y"),
        (b"/%E2%82%AC", b"/%E2%82%AC"),
        (b"/a%20b", b"/a%20b"),
        (b"/%7e", b"/~"),
        (b"/%zz", b"/%zz"),
        (b"/%", b"/%"),
        (b"/..", None),
        (b"/../x", None),
        (b"/a/../../x", None),
        (b"/.../x", b"/.../x"),
        (b"/a/.b", b"/a/.b"),
        (b"*", None),
        (b"", None),
    ],
)
def test_normalise_path_cases(raw: bytes, expected: bytes | None) -> None:
    """Unreserved octets decoded, dot segments removed, slashes merged; above / is None."""
    assert normalise_path(raw) == expected


_SEGMENT = st.sampled_from([b"a", b"b", b".", b"..", b"", b"%2F", b"%41", b"c.d", b"%2e"])


@given(st.lists(_SEGMENT, max_size=8))
def test_normalise_path_is_idempotent_and_clean(segments: list[bytes]) -> None:
    """A normalised path normalises to itself and holds no dot segment or empty one."""
    out = normalise_path(b"/" + b"/".join(segments))
    if out is None:
        return
    assert normalise_path(out) == out
    inner = out.split(b"/")[1:-1]
    assert b"." not in inner and b".." not in inner and b"" not in inner


@given(st.lists(st.sampled_from([b"a", b"b", b".", b".."]), max_size=8))
def test_normalise_path_agrees_with_posix_where_it_stays_below_the_root(
    segments: list[bytes],
) -> None:
    """Without encodings or empty segments, the result is posixpath's (trailing "/" aside)."""
    raw = b"/" + b"/".join(segments)
    out = normalise_path(raw)
    depth, climbed = 0, False
    for segment in segments:
        if segment == b"..":
            climbed = climbed or depth == 0
            depth = max(depth - 1, 0)
        elif segment != b".":
            depth += 1
    if climbed:
        assert out is None
    else:
        assert out is not None
        assert (out.rstrip(b"/") or b"/") == b"/" + posixpath.normpath(raw).lstrip(b"/")


@given(st.binary(max_size=40))
def test_normalise_path_never_raises(raw: bytes) -> None:
    """Any bytes give a path or None, never an exception."""
    out = normalise_path(b"/" + raw)
    assert out is None or out.startswith(b"/")


# -- host_of -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [b"a.example", b"a.example:8080", b"10.0.0.1:80", b"[::1]", b"[::1]:443", b"a-b_c~d", b"x:"],
)
def test_valid_hosts(host: bytes) -> None:
    """reg-name, IPv4, [IPv6], each with an optional port, are valid."""
    assert valid_host(host) and host_of([host], "1.1") == host


@pytest.mark.parametrize(
    "host", [b"", b"a b", b"a/b", b"u@a", b"a:b:c", b"[zz]", b"a\\b", b"a:8o", b"a\x00"]
)
def test_invalid_hosts(host: bytes) -> None:
    """Anything else is invalid: host_of gives None (400)."""
    assert not valid_host(host) and host_of([host], "1.1") is None


def test_host_rules_by_version_and_count() -> None:
    """HTTP/1.1 needs one Host; HTTP/1.0 may send none; two are refused on both."""
    assert host_of([], "1.1") is None
    assert host_of([], "1.0") == b""
    assert host_of([b"a", b"a"], "1.1") is None
    assert host_of([b"a", b"b"], "1.0") is None


def test_an_absolute_form_authority_replaces_the_host() -> None:
    """The authority of an absolute-form target is the host (when it is valid)."""
    assert host_of([b"other"], "1.1", b"a.example:81") == b"a.example:81"
    assert host_of([], "1.1", b"a.example") == b"a.example"
    assert host_of([], "1.1", b"bad host") is None


# -- status lines and header rendering -----------------------------------------------------


@given(st.integers(100, 999))
def test_every_status_100_to_999_has_a_line(status: int) -> None:
    """Any status 100-999 gives a status line ending in CRLF (never a KeyError)."""
    line = status_line(status)
    assert line.startswith(b"HTTP/1.1 %d " % status) and line.endswith(b"\r\n")
    assert len(line) > len(b"HTTP/1.1 100 \r\n")


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (200, b"HTTP/1.1 200 OK\r\n"),
        (299, b"HTTP/1.1 299 Successful\r\n"),
        (499, b"HTTP/1.1 499 Client Error\r\n"),
        (599, b"HTTP/1.1 599 Server Error\r\n"),
        (999, b"HTTP/1.1 999 Unknown\r\n"),
    ],
)
def test_status_lines(status: int, line: bytes) -> None:
    """Registered statuses get their phrase; others their class's."""
    assert status_line(status) == line


@pytest.mark.parametrize("status", [99, 1000, 0, -1])
def test_a_status_out_of_range_is_refused(status: int) -> None:
    """Statuses outside 100-999 are a ValueError."""
    with pytest.raises(ValueError):
        status_line(status)


def test_render_headers() -> None:
    """Lines come out in order, names lower-cased."""
    assert render_headers([(b"X-A", b"1"), (b"b", b"two words")]) == b"x-a: 1\r\nb: two words\r\n"


@pytest.mark.parametrize("bad", [b"a\r\nb", b"a\nb", b"a\rb", b"a\x00b"])
@pytest.mark.parametrize("where", ["name", "value"])
def test_render_headers_refuses_cr_lf_nul(bad: bytes, where: str) -> None:
    """CR, LF or NUL in a name or a value is a HeaderValueError."""
    pair = (bad, b"v") if where == "name" else (b"n", bad)
    with pytest.raises(HeaderValueError):
        render_headers([(b"ok", b"fine"), pair])
