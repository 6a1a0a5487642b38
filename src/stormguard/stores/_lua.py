# Encoding between LimitRequests and the composed limiter script (lua/limit.lua).
#
# The script is composed once per process from package data: _common.lua, one
# file per algorithm, then the limit.lua driver. Composing keeps each algorithm in
# its own file while a request with several limits stays one EVALSHA.
from __future__ import annotations

import math
from collections.abc import Sequence
from importlib import resources
from typing import Any, Protocol

from ..core._limiters import Decision, LimitRequest

__all__ = [
    "LIMIT_SCRIPT",
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
    key = store.key(request.name, request.key)
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
    at = 0
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
