# A request head replayed with other values (the listener's _replay, _listener.py).
#
# The listener keeps the last read that held exactly one bodyless head, with what
# llhttp made of it. A client whose heads differ only in the values of a few
# headers (an API key per request, a request id, a trace context) sends the same
# bytes around those values each time. When two heads kept one after the other
# differ only so, the second read is cut into its fixed pieces and its value
# slots (a pattern: one match finds a later read's values): a later read made of
# the same pieces with other values in the slots is the same head with those
# values, as llhttp would parse it, provided that
#
# * each value in a slot is a run of visible ASCII characters (``!`` to ``~``, no
#   space, tab or control character): llhttp takes such a value as it is, and its
#   first CR LF ends it, so the next piece starts there;
# * the header line of each slot is written ``name: value`` exactly (one space, no
#   trailing whitespace) and every line of the head ends with CR LF;
# * no slot is a header llhttp or the listener reads (Host, Connection,
#   Proxy-Connection, Content-Length, Transfer-Encoding, Upgrade, Expect): those
#   change how the head is parsed or routed, not only a value.
#
# Anything else is parsed. Pure functions; the listener owns the state.
from __future__ import annotations

import re

__all__ = ["Patch", "head_patch"]

# A pattern that matches the reads made of the pieces around values in the slots
# (group i: the value of slot i), and the slots: indices into the head's headers.
Patch = tuple["re.Pattern[bytes]", tuple[int, ...]]

_VALUE = re.compile(rb"[!-~]+")
_SLOT = b"(" + _VALUE.pattern + b")"  # (a value's first CR LF starts the next piece)
_READ = frozenset(
    {
        b"host",
        b"connection",
        b"proxy-connection",
        b"content-length",
        b"transfer-encoding",
        b"upgrade",
        b"expect",
    }
)


def head_patch(
    before: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
    headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...],
    data: bytes,
) -> Patch | None:
    """Where ``data`` (one whole head, whose headers are ``headers``) holds the
    values that differ from ``before`` (the headers of the head kept before it,
    with the same request line): a pattern of its pieces around those slots, and
    the slots; None when the two differ otherwise, or ``data`` is not written so
    that its values can be cut out."""
    if len(before) != len(headers):
        return None
    slots = []
    for index, (old, new) in enumerate(zip(before, headers, strict=True)):
        if old != new:
            if old[0] != new[0] or new[0] in _READ or _VALUE.fullmatch(new[1]) is None:
                return None
            slots.append(index)
    if not slots or data.count(b"\n") != data.count(b"\r\n"):
        return None
    lines = data.split(b"\r\n")  # request line, header lines, b"", b""
    if len(lines) != len(headers) + 3:
        return None
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 2)
    pattern = []
    begin = 0
    for index in slots:
        name, value = headers[index]
        line = lines[1 + index]
        if line[: len(name)].lower() != name or line[len(name) :] != b": " + value:
            return None
        at = starts[1 + index] + len(name) + 2
        pattern += [re.escape(data[begin:at]), _SLOT]
        begin = at + len(value)
    pattern.append(re.escape(data[begin:]))
    return re.compile(b"".join(pattern)), tuple(slots)
