# The request head's rules, as pure functions on bytes (no I/O, no parser state):
# the listener (_listener.py) calls them once per request head it has parsed.
#
# * Paths are matched and forwarded normalised (normalise_path): a percent-encoded
#   octet is decoded only where it is unreserved (ALPHA / DIGIT / "-" "." "_" "~",
#   RFC 3986 2.3); every other encoding, "%2F" included, stays as it was, case and
#   all. Runs of "/" are merged, then dot segments are removed as RFC 3986 5.2.4
#   does; a path that would climb above "/" is refused (None), as nginx answers 400,
#   where the RFC's algorithm would quietly stop at the root.
# * Host (host_of): HTTP/1.1 needs exactly one, and it must be a host as RFC 3986
#   3.2.2 draws it (reg-name, IPv4, or an IP literal in brackets) with an optional
#   port; two Host headers are refused whatever the version, so that no part of the
#   gateway can route on one and rate-limit on the other. An absolute-form target
#   (``GET http://a.example/x``) carries the authority the request routes by
#   (RFC 9112 3.2.2: the Host header is then replaced by it).
# * Status lines for any code 100-999 (a generic reason phrase for unknown ones),
#   and header lines rendered with CR, LF and NUL checked once per block.
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from http import HTTPStatus

__all__ = [
    "HeaderValueError",
    "host_of",
    "normalise_path",
    "render_headers",
    "status_line",
    "valid_host",
]

_HEX = b"0123456789abcdefABCDEF"
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _decode_unreserved(raw: bytes) -> bytes:
    # Only "%XX" that names an unreserved octet is decoded; anything else is kept.
    parts = raw.split(b"%")
    out = [parts[0]]
    for part in parts[1:]:
        if len(part) >= 2 and part[0] in _HEX and part[1] in _HEX:
            octet = int(part[:2], 16)
            if octet in _UNRESERVED:
                out.append(bytes((octet,)) + part[2:])
                continue
        out.append(b"%" + part)
    return b"".join(out)


def normalise_path(raw: bytes) -> bytes | None:
    """The path a request is matched and forwarded by, or None (answer 400).

    ``raw`` is the path of an origin-form target (no query). Unreserved octets
    are percent-decoded, runs of ``/`` merged and dot segments removed (RFC 3986
    5.2.4); a path that climbs above ``/``, or does not start with ``/``, is None.
    """
    if not raw.startswith(b"/"):
        return None
    if b"%" not in raw and b"//" not in raw and b"/." not in raw:
        return raw  # the common case: nothing to do
    path = _decode_unreserved(raw) if b"%" in raw else raw
    while b"//" in path:
        path = path.replace(b"//", b"/")
    if b"/." not in path:
        return path
    segments = path.split(b"/")[1:]
    out: list[bytes] = []
    last = len(segments) - 1
    trailing = False
    for i, segment in enumerate(segments):
        if segment == b".":
            trailing = i == last
        elif segment == b"..":
            if not out:
                return None  # above the root
            out.pop()
            trailing = i == last
        else:
            out.append(segment)
            trailing = False
    joined = b"/" + b"/".join(out)
    return joined + b"/" if trailing and out else joined


# RFC 3986 3.2.2: host = IP-literal / IPv4address / reg-name; ":" port. The IP
# literal is checked for its alphabet only (IPv6 digits, ":" and "."), which is
# what a router needs: it names no header line and no other host.
_HOST = re.compile(
    rb"(?:\[[0-9A-Fa-f:.]+\]|(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})+)(?::[0-9]*)?"
)


def valid_host(value: bytes) -> bool:
    """Whether ``value`` is a host[:port] as RFC 3986 draws it (not empty)."""
    return _HOST.fullmatch(value) is not None


def host_of(
    hosts: Sequence[bytes], http_version: str, authority: bytes | None = None
) -> bytes | None:
    """The host a request routes by, ``b""`` for none, or None (answer 400).

    ``hosts`` are the values of its Host headers, ``authority`` that of an
    absolute-form target. HTTP/1.1 without Host, two Host headers, or an invalid
    host are None; HTTP/1.0 may send none.
    """
    if len(hosts) > 1:
        return None
    if authority is not None:
        return authority if valid_host(authority) else None
    if not hosts:
        return b"" if http_version == "1.0" else None
    host = hosts[0]
    return host if valid_host(host) else None


_GENERIC = {1: "Informational", 2: "Successful", 3: "Redirection", 4: "Client Error"}


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = _GENERIC.get(status // 100, "Server Error" if status < 600 else "Unknown")
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase.encode("ascii"))


_STATUS_LINES = {status: _status_line(status) for status in range(100, 1000)}


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n`` for any status 100-999 (a generic
    reason phrase when the status is not registered); ValueError otherwise."""
    try:
        return _STATUS_LINES[status]
    except (KeyError, TypeError):
        raise ValueError(f"status {status!r} is not in 100-999") from None


class HeaderValueError(ValueError):
    """A header name or value holds CR, LF or NUL (it would split the head)."""


def render_headers(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """Header lines ``name: value\\r\\n`` (names lower-cased), CR/LF/NUL checked once
    over the whole block (HeaderValueError)."""
    parts: list[bytes] = []
    for name, value in headers:
        parts += (name.lower(), b": ", value, b"\r\n")
    # One scan of names and values (the separators carry the only CR/LF allowed).
    fields = b" ".join(parts[0::4] + parts[2::4])
    if b"\r" in fields or b"\n" in fields or b"\0" in fields:
        raise HeaderValueError("a header name or value holds CR, LF or NUL")
    return b"".join(parts)
