# Encoding between LimitRequests and the composed limiter script (lua/limit.lua).
#
# The script is composed once per process from package data: _common.lua, one
# file per algorithm, then the limit.lua driver. Composing keeps each algorithm in
# its own file while a request with several limits stays one EVALSHA.
#
# Keys: `<prefix>{<key>}:<name>` (and `...:aux`). The hash tag is the limited key
# (the client, "global", ...), so on a Redis Cluster every limit of one client --
# per second, per minute, per route -- lives in one slot and a group of them is one
# EVALSHA; a group that mixes keys (per client + global) spans slots and is decided
# slot by slot (see `across_slots`).
from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import replace
from importlib import resources
from typing import Any, Protocol, TypeAlias

from ..core._limiters import Decision, LimitRequest

__all__ = [
    "LIMIT_SCRIPT",
    "across_slots",
    "decode",
    "decode_batch",
    "encode",
    "encode_batch",
    "encode_release",
    "limit_script_source",
]

LIMIT_SCRIPT = "limit"
_PARTS = (
    "_common",
    "token_bucket",
    "gcra",
    "sliding_window_log",
    "sliding_window_counter",
    "fixed_window",
    "concurrency",
    "limit",
)


class _Keyed(Protocol):
    def key(self, *parts: str) -> str: ...


def limit_script_source() -> str:
    """The composed limiter script: helpers, the six algorithms, the driver."""
    lua = resources.files(__package__).joinpath("lua")
    return "\n".join(lua.joinpath(f"{part}.lua").read_text("utf-8") for part in _PARTS)


def _keys(store: _Keyed, request: LimitRequest) -> tuple[str, str]:
    key = f"{store.key(request.key)}:{request.name}"
    return key, key + ":aux"


def encode(store: _Keyed, requests: Sequence[LimitRequest]) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of a "hit" call deciding ``requests`` together (one group)."""
    return encode_batch(store, [requests])


def encode_batch(
    store: _Keyed, groups: Sequence[Sequence[LimitRequest]]
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of a "hit" call deciding several independent groups."""
    keys: list[str] = []
    args: list[Any] = ["hit", len(groups)]
    for requests in groups:
        args.append(len(requests))
        for request in requests:
            keys.extend(_keys(store, request))
            first, second = request.algorithm.params()
            args += [request.algorithm.kind, repr(first), repr(second), repr(request.cost)]
            args.append(request.lease)
    return keys, args


def encode_refund(
    store: _Keyed, requests: Sequence[LimitRequest], stamp: bytes | str
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of a "refund" call giving back ``requests``, allowed at ``stamp``."""
    keys, args = encode_batch(store, [requests])
    args[0] = "refund"
    args.append(stamp)
    return keys, args


def encode_release(
    store: _Keyed, request: LimitRequest, mode: str = "release"
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of a "release" (or "renew") call for one concurrency lease."""
    return list(_keys(store, request)), [mode, request.lease, repr(request.algorithm.params()[1])]


def decode(requests: Sequence[LimitRequest], reply: Any) -> list[Decision]:
    """Decisions from the script's reply to :func:`encode`."""
    return decode_batch([requests], reply)[0]


def decode_batch(groups: Sequence[Sequence[LimitRequest]], reply: Any) -> list[list[Decision]]:
    """Decisions per group from the script's reply to :func:`encode_batch`."""
    out = []
    at = 1  # reply[0]: the TIME stamp of the decision
    for requests in groups:
        committed = reply[at] == 1
        decisions = []
        for i, request in enumerate(requests):
            base = at + 1 + 4 * i
            allowed = reply[base] == 1
            retry = reply[base + 3]
            algorithm = request.algorithm
            decisions.append(
                Decision(
                    allowed,
                    algorithm.limit,
                    reply[base + 1] / 1e6,
                    reply[base + 2] / 1e6,
                    math.inf if retry < 0 else retry / 1e6,
                    request.name,
                    algorithm.window,
                    (request.lease or None) if committed and request.cost > 0 else None,
                )
            )
        out.append(decisions)
        at += 1 + 4 * len(requests)
    return out


# -- Redis Cluster: a group whose keys live in several slots ------------------
#
# No script can touch two slots, so such a group is decided one slot at a time,
# in order, each slot's part all or nothing. When a part refuses, the parts taken
# before it are refunded (a "refund" call, which also reports their quotas) and the
# parts after it are only peeked (cost 0): the group still takes nothing when one
# limit refuses and never admits more than any limit allows. The cost: one round
# trip per slot, plus one per slot taken before a refusal. If the store fails in
# between, a taken part is not given back and expires with its window (fail safe:
# it under-admits, never over-admits).
#
# Written once, without I/O: the generator yields (KEYS, ARGV) of each script call
# and is sent its reply; RedisStore and AsyncRedisStore each drive it in a loop.

Call: TypeAlias = tuple[list[str], list[Any]]


def _peeked(requests: Sequence[LimitRequest]) -> list[LimitRequest]:
    return [replace(r, cost=0.0) for r in requests]


def across_slots(
    store: _Keyed, requests: Sequence[LimitRequest], parts: Sequence[Sequence[int]]
) -> Generator[Call, Any, list[Decision]]:
    """Decide ``requests`` all or nothing, ``parts`` (indices per slot) one by one."""
    decisions: list[Decision] = [None] * len(requests)  # type: ignore[list-item]
    taken: list[tuple[Sequence[int], Any]] = []
    refused = False
    for part in parts:
        asked = [requests[i] for i in part]
        if refused:
            asked = _peeked(asked)
        reply = yield encode(store, asked)
        if not refused:
            if reply[1] == 1:
                taken.append((part, reply[0]))
            else:
                refused = True
        for i, decision in zip(part, decode(asked, reply)):
            decisions[i] = decision
    if refused:
        for part, stamp in taken:
            given_back = [requests[i] for i in part]
            reply = yield encode_refund(store, given_back, stamp)
            for i, decision in zip(part, decode(_peeked(given_back), reply)):
                decisions[i] = decision
    return decisions
