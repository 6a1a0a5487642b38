# Priority classes and the shedding order, as pure values and one waiting line.
#
# Classes, ordered: critical > default > sheddable (Google SRE's criticality,
# trimmed to the three a service needs). Every request gets a rank; under overload
# the lowest ranks are refused first:
#
#   rank = (class, first attempt?, -usage-share band)       compared left to right
#
#   1. a lower class is refused before any request of a higher class;
#   2. within a class, retries (attempt >= 2) before first attempts: a retry is
#      load the overload itself made, and its caller has already waited once;
#   3. then the heaviest clients first: usage is each client's recent request
#      count, decayed with a half-life (ClientUsage), and a client ranks by its
#      share of everyone's usage, so one tenant flooding the service is shed
#      before the light ones sharing its class. Shares rank by band,
#      floor(2 * log2(1 + 64 * share)) (half an octave each): clients several
#      times apart are ordered, while one client's own requests tie and keep the
#      LIFO order below. A share, unlike a count, does not climb while traffic
#      ramps up (a lone client's share stays 1): a count stamped on each request
#      would rank a client's older requests above its newer ones. A client's band
#      moves only once its share is half a band past the edge (hysteresis), so a
#      share that hovers at an edge does not alternate between two ranks.
#   Equal ranks: the newest waiter is admitted first and the oldest pushed out
#   first (LIFO, as Facebook's "adaptive LIFO"): under overload the request that
#   has waited longest is the likeliest to miss its deadline or to have been given
#   up by its caller, while the newest still has all its time; no wait lasts past
#   the runtime's max_wait, so nobody starves for long.
#
# ShedLine is where the order acts. It holds the in-flight count and a line of
# waiters sorted by (rank, age); the limit is passed to every call, so a fixed
# limit and an adaptive one are the same to it. Its rules:
#
#   arrive:  a free slot and nobody waiting      -> ADMITTED (in flight + 1)
#            else the line has room              -> QUEUED
#            else the line's lowest ranks below  -> QUEUED; the lowest waiter is
#            the newcomer (or equal and older)      EVICTED (refused now)
#            else                                -> REFUSED
#   grant:   while a slot is free, the best waiter is admitted (after a leave, or
#            when the limit rose)
#   withdraw a waiter whose wait ended (timeout, cancelled) leaves the line
#
# Pure: no clock, no I/O, no locks; the runtime (server/_overload.py) holds the
# lock and wakes the waiters this line names.
from __future__ import annotations

import bisect
import enum
import math
from collections import OrderedDict
from typing import Any, Final, NamedTuple

from .._errors import ConfigError

__all__ = [
    "ADMITTED",
    "EVICTED",
    "QUEUED",
    "REFUSED",
    "ClientUsage",
    "Priority",
    "Rank",
    "ShedLine",
    "rank_of",
    "SHARE_SCALE",
    "usage_band",
]

_ALIASES = {
    "critical": 2,
    "critical_plus": 2,
    "high": 2,
    "default": 1,
    "normal": 1,
    "sheddable_plus": 1,
    "sheddable": 0,
    "low": 0,
    "best_effort": 0,
}


class Priority(enum.IntEnum):
    """A request's priority class: ``CRITICAL`` > ``DEFAULT`` > ``SHEDDABLE``.

    Under overload a lower class is refused before any request of a higher one.
    ``str(Priority.CRITICAL)`` is ``"critical"`` (the name used in configuration,
    headers and the refusal reason ``shed:<class>``).
    """

    SHEDDABLE = 0
    DEFAULT = 1
    CRITICAL = 2

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: object) -> Priority | None:
        """The class named by ``value`` (case-insensitive; also ``high``/``normal``/
        ``low`` and SRE's ``critical_plus``/``sheddable_plus``), a Priority as it is;
        None for anything else (never raises)."""
        if isinstance(value, Priority):
            return value
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if not isinstance(value, str) or len(value) > 32:
            return None
        found = _ALIASES.get(value.strip().lower().replace("-", "_"))
        return None if found is None else cls(found)

    @classmethod
    def of(cls, value: object, field: str = "priority") -> Priority:
        """Like :meth:`parse` for configuration: ConfigError naming ``field`` when unknown."""
        found = cls.parse(value)
        if found is None:
            names = ", ".join(str(p) for p in cls)
            raise ConfigError(field, f"must be one of {names}, got {value!r}")
        return found


class Rank(NamedTuple):
    """Where a request stands in the shedding order; a smaller rank is refused first.

    ``priority``: its class; ``first``: a first attempt (True) or a retry;
    ``lightness``: minus its client's usage-share band (lighter clients rank higher).
    """

    priority: int
    first: bool
    lightness: int

    @property
    def label(self) -> str:
        """The class name, as in the refusal reason ``shed:<class>``."""
        return str(Priority(self.priority))


SHARE_SCALE = 64.0  # bands resolve shares down to about 1/64


def _exact_band(share: float) -> float:
    return 2.0 * math.log2(1.0 + SHARE_SCALE * min(1.0, max(0.0, share)))


def usage_band(share: float) -> int:
    """``floor(2 * log2(1 + 64 * share))``: half-octave bands of a client's share of
    the recent usage (0 to 12)."""
    return int(_exact_band(share))


def rank_of(
    priority: Priority | int, attempt: int = 1, share: float = 0.0, *, band: int | None = None
) -> Rank:
    """The rank of a request of class ``priority``, attempt number ``attempt`` (1 =
    first attempt), whose client made ``share`` of the recent requests (or whose
    band is ``band``, as ClientUsage.band gives it)."""
    return Rank(int(priority), attempt <= 1, -(usage_band(share) if band is None else band))


class ClientUsage:
    """Each client's recent request count, decayed with a half-life.

    ``touch(client, now)`` counts one request and returns the client's usage::

        usage(now) = usage(then) * 2 ** (-(now - then) / half_life) + 1

    and the same decayed total over every client is kept, so :meth:`band` can rank
    a client by its share of it.
    At most ``max_clients`` are remembered (the least recently seen is forgotten
    first), so a flood of new client keys costs bounded memory.
    """

    __slots__ = ("_clients", "_total", "half_life", "max_clients")

    def __init__(self, *, half_life: float = 10.0, max_clients: int = 10_000) -> None:
        if not isinstance(half_life, int | float) or not 0 < half_life < math.inf:
            raise ConfigError("half_life", f"must be > 0 seconds, got {half_life!r}")
        if isinstance(max_clients, bool) or not isinstance(max_clients, int) or max_clients < 1:
            raise ConfigError("max_clients", f"must be an integer >= 1, got {max_clients!r}")
        self.half_life = float(half_life)
        self.max_clients = max_clients
        # client -> (usage, when, band)
        self._clients: OrderedDict[str, tuple[float, float, int]] = OrderedDict()
        self._total: tuple[float, float, int] = (0.0, 0.0, 0)  # everyone's usage, when

    def __len__(self) -> int:
        return len(self._clients)

    def _decayed(self, entry: tuple[float, float, int] | None, now: float) -> float:
        if entry is None:
            return 0.0
        value, then, _ = entry
        return value * math.pow(2.0, -max(0.0, now - then) / self.half_life)

    def _count(self, client: str, now: float) -> tuple[float, int]:
        clients = self._clients
        entry = clients.pop(client, None)
        value = self._decayed(entry, now) + 1.0
        total = self._decayed(self._total, now) + 1.0
        self._total = (total, max(now, self._total[1]), 0)
        exact = _exact_band(value / total)
        band = int(exact)
        if entry is not None and abs(exact - (entry[2] + 0.5)) <= 1.0:
            band = entry[2]  # within half a band of its own: the band stays
        clients[client] = (value, now, band)
        if len(clients) > self.max_clients:
            clients.popitem(last=False)
        return value, band

    def touch(self, client: str, now: float) -> float:
        """Count one request of ``client`` at ``now``; its usage including this one."""
        return self._count(client, now)[0]

    def band(self, client: str, now: float) -> int:
        """Count one request of ``client`` at ``now``; the band of its share of all
        usage (see the module notes): ``floor(2 * log2(1 + 64 * share))``, moved only
        half a band past an edge."""
        return self._count(client, now)[1]

    def usage(self, client: str, now: float) -> float:
        """The usage of ``client`` at ``now``, without counting a request."""
        return self._decayed(self._clients.get(client), now)


ADMITTED: Final = "admitted"
QUEUED: Final = "queued"
REFUSED: Final = "refused"
EVICTED: Final = "evicted"


class ShedLine:
    """In-flight slots and a line of waiters in shedding order (see the module notes).

    ``max_queue`` waiters at most (0: nobody waits; a full limit refuses at once).
    Items are the runtime's waiter objects; the line never looks inside them.
    """

    __slots__ = ("_entries", "_line", "_sequence", "in_flight", "max_queue")

    def __init__(self, *, max_queue: int) -> None:
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0:
            raise ConfigError("max_queue", f"must be an integer >= 0, got {max_queue!r}")
        self.max_queue = max_queue
        self.in_flight = 0
        # Sorted ascending by (rank, sequence): the end is the best, newest waiter
        # (admitted next), the front the lowest, oldest one (evicted next).
        self._line: list[tuple[Rank, int, int]] = []
        self._entries: dict[int, tuple[tuple[Rank, int, int], Any]] = {}
        self._sequence = 0

    @property
    def waiting(self) -> int:
        """Waiters in the line now."""
        return len(self._line)

    def lowest(self) -> Rank | None:
        """The rank refused next (the line's lowest waiter), if anyone waits."""
        return self._line[0][0] if self._line else None

    def arrive(self, item: Any, rank: Rank, limit: int) -> tuple[str, Any]:
        """A request of ``rank`` arrives under ``limit``: ``(ADMITTED, None)``,
        ``(QUEUED, None)``, ``(EVICTED, lower_item)`` (queued; ``lower_item`` left the
        line refused) or ``(REFUSED, None)``."""
        if self.in_flight < limit and not self._line:
            self.in_flight += 1
            return ADMITTED, None
        if self.max_queue == 0:
            return REFUSED, None
        self._sequence += 1
        key = (rank, self._sequence, id(item))
        if len(self._line) < self.max_queue:
            self._insert(key, item)
            return QUEUED, None
        lowest = self._line[0]
        if key <= lowest:
            return REFUSED, None
        del self._line[0]
        _, evicted = self._entries.pop(lowest[2])
        self._insert(key, item)
        return EVICTED, evicted

    def _insert(self, key: tuple[Rank, int, int], item: Any) -> None:
        bisect.insort(self._line, key)
        self._entries[key[2]] = (key, item)

    def leave(self) -> None:
        """An admitted request ended: its slot is free (then :meth:`grant`)."""
        if self.in_flight <= 0:
            raise RuntimeError("ShedLine.leave() without an admitted request")
        self.in_flight -= 1

    def grant(self, limit: int) -> list[Any]:
        """Admit the best waiters while a slot is free under ``limit``; their items."""
        granted = []
        line = self._line
        while line and self.in_flight < limit:
            key = line.pop()
            granted.append(self._entries.pop(key[2])[1])
            self.in_flight += 1
        return granted

    def withdraw(self, item: Any) -> bool:
        """Take a waiter out of the line (its wait ended); False when it is not
        waiting (it was granted or evicted meanwhile)."""
        entry = self._entries.pop(id(item), None)
        if entry is None:
            return False
        key = entry[0]
        index = bisect.bisect_left(self._line, key)
        del self._line[index]
        return True
