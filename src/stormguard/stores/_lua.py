# Encoding between limit decisions and the composed limiter script (lua/limit.lua).
#
# The script is composed once per process from package data: _common.lua, one
# file per algorithm, then the limit.lua driver. Composing keeps each algorithm in
# its own file while a request with several limits stays one EVALSHA.
#
# Keys: `<prefix>{<key>}:<name>` (and `...:aux` for Concurrency). The hash tag is
# the limited key (the client, "global", ...), so on a Redis Cluster every limit of
# one client -- per second, per minute, per route -- lives in one slot and a group
# of them is one EVALSHA; a group that mixes keys (per client + global) spans slots
# and is decided slot by slot (see `across_slots`).
#
# A batch ("b" mode) is a run of groups, each `header, (spec, cost, extra) * n`
# (see limit.lua). What does not change from one request to the next -- a limit's
# key, its spec string, the cost -- is encoded once: `Piece` holds one limit of one
# key as RESP bytes (and plain bytes for redis-py clients), and `Item` the groups of
# one request, ready to be appended to a batch. `decode_item` reads an item's part
# of the reply; a quiet group that committed answers one flag and builds nothing.
from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import replace
from importlib import resources
from typing import Any, NamedTuple, Protocol, TypeAlias

from ..core._limiters import Algorithm, Concurrency, Decision, LimitRequest

__all__ = [
    "COMMITTED",
    "LIMIT_SCRIPT",
    "QUIET",
    "REFUSED",
    "SKIPPED",
    "Group",
    "Item",
    "Piece",
    "across_slots",
    "decode",
    "decode_batch",
    "decode_item",
    "encode",
    "encode_batch",
    "encode_give_back",
    "encode_refund",
    "encode_release",
    "item_of",
    "limit_script_source",
    "piece",
    "resp",
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
# Group flags of a reply (limit.lua).
REFUSED, COMMITTED, QUIET, SKIPPED = 0, 1, 2, 3
# Group header flags.
_QUIET_FLAG, _IF_COMMITTED = 1, 2

_new = tuple.__new__


class _Keyed(Protocol):
    def key(self, *parts: str) -> str: ...


def limit_script_source() -> str:
    """The composed limiter script: helpers, the six algorithms, the driver."""
    lua = resources.files(__package__).joinpath("lua")
    return "\n".join(lua.joinpath(f"{part}.lua").read_text("utf-8") for part in _PARTS)


_SPECS: dict[Algorithm, str] = {}


def _spec(algorithm: Algorithm) -> str:
    # "<kind>:<p1>:<p2>", made once per algorithm (frozen, hashable values).
    spec = _SPECS.get(algorithm)
    if spec is None:
        first, second = algorithm.params()
        spec = f"{algorithm.kind}:{first!r}:{second!r}"
        if len(_SPECS) < 4096:
            _SPECS[algorithm] = spec
    return spec


def resp(values: Sequence[bytes]) -> bytes:
    """``values`` as RESP bulk strings, joined."""
    return b"".join(b"$%d\r\n%s\r\n" % (len(v), v) for v in values)


def _number(value: float) -> str:
    return "1" if value == 1.0 else repr(value)


class Piece(NamedTuple):
    """One limit of one key, encoded: its KEYS and ARGV (plain and as RESP)."""

    keys: tuple[bytes, ...]
    args: tuple[bytes, ...]
    resp_keys: bytes
    resp_args: bytes


def piece(
    store: _Keyed, algorithm: Algorithm, name: str, key: str, cost: float, extra: str = ""
) -> Piece:
    """The encoded limit ``name`` of ``key`` (``extra``: a lease, or a reservation size)."""
    skey = f"{store.key(key)}:{name}".encode()
    keys = (skey, skey + b":aux") if type(algorithm) is Concurrency else (skey,)
    args = (_spec(algorithm).encode(), _number(cost).encode(), extra.encode())
    return Piece(keys, args, resp(keys), resp(args))


class Group(NamedTuple):
    """How to read one group of an item back: its limits' algorithms and names, the
    leases they took, which limits asked for a reservation, and its flags."""

    algorithms: tuple[Algorithm, ...]
    names: tuple[str, ...]
    leases: tuple[str, ...]  # "" where none
    reserves: tuple[bool, ...]
    quiet: bool
    conditional: bool


class Item(NamedTuple):
    """The groups of one request, encoded for a batch (see the module notes)."""

    keys: list[bytes]
    args: list[bytes]
    resp_keys: bytes
    resp_args: bytes
    groups: tuple[Group, ...]
    slot_key: str  # the first key's hash tag part, for Redis Cluster routing


def item_of(pieces: Sequence[Sequence[Piece]], groups: Sequence[Group], slot_key: str) -> Item:
    """An :class:`Item` of ``groups``, each made of the ``pieces`` at the same index."""
    keys: list[bytes] = []
    args: list[bytes] = []
    resp_parts: list[bytes] = []
    resp_keys: list[bytes] = []
    for group, parts in zip(groups, pieces, strict=True):
        flags = _QUIET_FLAG * group.quiet + _IF_COMMITTED * group.conditional
        header = b"%d" % (4 * len(parts) + flags)
        args.append(header)
        resp_parts.append(b"$%d\r\n%s\r\n" % (len(header), header))
        for part in parts:
            keys.extend(part.keys)
            args.extend(part.args)
            resp_keys.append(part.resp_keys)
            resp_parts.append(part.resp_args)
    return Item(keys, args, b"".join(resp_keys), b"".join(resp_parts), tuple(groups), slot_key)


def _request_pieces(store: _Keyed, requests: Sequence[LimitRequest]) -> list[Piece]:
    return [piece(store, r.algorithm, r.name, r.key, r.cost, r.lease) for r in requests]


def _group_of(requests: Sequence[LimitRequest], quiet: bool = False) -> Group:
    return Group(
        tuple(r.algorithm for r in requests),
        tuple(r.name for r in requests),
        tuple(r.lease if r.cost > 0 else "" for r in requests),
        (False,) * len(requests),
        quiet,
        False,
    )


def request_item(store: _Keyed, requests: Sequence[LimitRequest]) -> Item:
    """The item deciding ``requests`` together (one group)."""
    slot_key = requests[0].key if requests else ""
    return item_of([_request_pieces(store, requests)], [_group_of(requests)], slot_key)


def encode(store: _Keyed, requests: Sequence[LimitRequest]) -> tuple[list[bytes], list[bytes]]:
    """KEYS and ARGV of a batch call deciding ``requests`` together (one group)."""
    return encode_batch(store, [requests])


def encode_batch(
    store: _Keyed, groups: Sequence[Sequence[LimitRequest]]
) -> tuple[list[bytes], list[bytes]]:
    """KEYS and ARGV of a batch call deciding several independent groups."""
    keys: list[bytes] = []
    args: list[bytes] = [b"b"]
    for requests in groups:
        item = request_item(store, requests)
        keys += item.keys
        args += item.args
    return keys, args


def encode_refund(
    store: _Keyed, requests: Sequence[LimitRequest], stamp: bytes | str
) -> tuple[list[bytes], list[bytes]]:
    """KEYS and ARGV of a "refund" call giving back ``requests``, allowed at ``stamp``."""
    item = request_item(store, requests)
    raw = stamp if isinstance(stamp, bytes) else stamp.encode()
    return item.keys, [b"refund", raw, *item.args]


def encode_give_back(
    store: _Keyed, reservations: Sequence[tuple[Algorithm, str, str, float, bytes]]
) -> tuple[list[bytes], list[bytes]]:
    """KEYS and ARGV of a "g" call: ``(algorithm, name, key, units, stamp)`` per
    reservation, its unused units given back (one-string algorithms only)."""
    keys: list[bytes] = []
    args: list[bytes] = [b"g"]
    for algorithm, name, key, units, stamp in reservations:
        keys.append(f"{store.key(key)}:{name}".encode())
        args += [_spec(algorithm).encode(), repr(float(units)).encode(), stamp]
    return keys, args


def encode_release(
    store: _Keyed, request: LimitRequest, mode: str = "release"
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of a "release" (or "renew") call for one concurrency lease."""
    key = f"{store.key(request.key)}:{request.name}"
    return [key, key + ":aux"], [mode, request.lease, repr(request.algorithm.params()[1])]


def decode_item(
    groups: Sequence[Group], reply: Sequence[Any], at: int
) -> tuple[list[tuple[int, list[Decision] | None, list[float] | None]], int]:
    """Each group's ``(flag, decisions, granted)`` from ``reply`` at ``at``, and the
    index after them. ``decisions`` is None for a quiet or skipped group;
    ``granted`` (units per limit, for the reservations asked) is None without any."""
    out: list[tuple[int, list[Decision] | None, list[float] | None]] = []
    for group in groups:
        flag = reply[at]
        at += 1
        if flag in (QUIET, SKIPPED):
            out.append((flag, None, None))
            continue
        committed = flag == COMMITTED
        decisions = []
        granted: list[float] | None = None
        for algorithm, name, lease, reserve in zip(
            group.algorithms, group.names, group.leases, group.reserves
        ):
            retry = reply[at + 3]
            decisions.append(
                _new(
                    Decision,
                    (
                        reply[at] == 1,
                        algorithm.limit,
                        reply[at + 1] / 1e6,
                        reply[at + 2] / 1e6,
                        math.inf if retry < 0 else retry / 1e6,
                        name,
                        algorithm.window,
                        (lease or None) if committed else None,
                        (),
                    ),
                )
            )
            at += 4
            if reserve:
                if granted is None:
                    granted = [0.0] * len(group.names)
                granted[len(decisions) - 1] = reply[at] / 1e6
                at += 1
        out.append((flag, decisions, granted))
    return out, at


def decode(requests: Sequence[LimitRequest], reply: Any) -> list[Decision]:
    """Decisions from the script's reply to :func:`encode`."""
    return decode_batch([requests], reply)[0]


def decode_batch(groups: Sequence[Sequence[LimitRequest]], reply: Any) -> list[list[Decision]]:
    """Decisions per group from the script's reply to :func:`encode_batch`."""
    out = []
    at = 1  # reply[0]: the TIME stamp of the decision
    for requests in groups:
        results, at = decode_item([_group_of(requests)], reply, at)
        out.append(results[0][1] or [])
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

Call: TypeAlias = tuple[list[bytes], list[bytes]]


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
            if reply[1] == COMMITTED:
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
