# Admission: a bulkhead per route group plus a share per client, built on
# protection.Bulkhead (no second copy of its queueing).
#
#   1. the client's share (per_client slots, no waiting: a client already holding
#      its share is refused at once -- waiting for your own slot helps nobody, and
#      it is what keeps one tenant from holding every slot of the group);
#   2. the group's slots (limit), waiting up to max_wait in FIFO order.
# Refused -> 503 + Retry-After (reason "bulkhead_full"). Every admitted request
# gives both slots back exactly once, whatever ends it (see `leave`).
#
# Per-client bulkheads are created on first use and dropped when idle, so the
# table holds only clients with requests in flight.
from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from .. import AsyncRateLimiter, Bulkhead, Concurrency
from .._clock import Clock
from .._errors import BulkheadFull, ConfigError
from ..core._decision import Decision
from ._refusal import Refusal

__all__ = ["Admission", "AdmissionGroups", "SharedAdmission"]


class Admission:
    """Slots of one group (``limit``) and per client (``per_client``; None: no share cap).

    ``clock`` measures the group's waits (``max_wait``; default: the system clock),
    as :class:`~stormguard.Bulkhead`'s ``clock`` does.
    """

    __slots__ = ("_clients", "_lock", "bulkhead", "per_client", "retry_after")

    def __init__(
        self,
        limit: int,
        *,
        per_client: int | None = None,
        max_wait: float = 0.0,
        retry_after: float = 1.0,
        name: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.bulkhead = Bulkhead(limit, max_wait=max_wait, name=name, clock=clock)
        if per_client is not None and (
            isinstance(per_client, bool) or not isinstance(per_client, int) or per_client < 1
        ):
            raise ConfigError("per_client", f"must be an integer >= 1, got {per_client!r}")
        if not retry_after > 0:
            raise ConfigError("retry_after", f"must be > 0 seconds, got {retry_after!r}")
        self.per_client = per_client
        self.retry_after = float(retry_after)
        self._clients: dict[str, Bulkhead] = {}
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        """Requests holding a slot of this group now."""
        return self.bulkhead.in_flight

    def client_in_flight(self, client: str) -> int:
        """Requests of ``client`` holding a slot now."""
        share = self._clients.get(client)
        return share.in_flight if share is not None else 0

    def _refusal(self, detail: str) -> Refusal:
        return Refusal.of(503, detail, reason="bulkhead_full", retry_after=self.retry_after)

    def _take_share(self, client: str | None) -> bool:
        if client is None or self.per_client is None:
            return True
        with self._lock:
            share = self._clients.get(client)
            if share is None:
                share = self._clients[client] = Bulkhead(self.per_client)
            try:
                share.acquire(0)
            except BulkheadFull:
                return False
            return True

    def _give_share(self, client: str | None) -> None:
        if client is None or self.per_client is None:
            return
        with self._lock:
            share = self._clients[client]
            share.release()
            if share.in_flight == 0:
                del self._clients[client]

    def try_enter(self, client: str | None = None) -> Refusal | bool:
        """Take a slot only if one is free now: True. A Refusal (503) when the client's
        share is used up, or the group is full and ``max_wait`` is 0; False when the
        caller could wait for a slot (then :meth:`aenter` or :meth:`enter`)."""
        shared = client is not None and self.per_client is not None
        if shared and not self._take_share(client):
            return self._refusal("this client already has its share of requests in flight")
        bulkhead = self.bulkhead
        if bulkhead.try_acquire():  # lock-free; False also while others wait in line
            return True
        if shared:
            self._give_share(client)
        if bulkhead.max_wait > 0:
            return False
        return self._refusal("too many requests in flight")

    async def aenter(self, client: str | None = None) -> Refusal | None:
        """Take a slot for ``client`` (None: no share); a Refusal (503) when full."""
        if not self._take_share(client):
            return self._refusal("this client already has its share of requests in flight")
        try:
            await self.bulkhead.aacquire()
        except BulkheadFull:
            self._give_share(client)
            return self._refusal("too many requests in flight")
        except BaseException:
            self._give_share(client)
            raise
        return None

    def enter(self, client: str | None = None) -> Refusal | None:
        """Sync twin of :meth:`aenter` (blocks the thread up to ``max_wait``)."""
        if not self._take_share(client):
            return self._refusal("this client already has its share of requests in flight")
        try:
            self.bulkhead.acquire()
        except BaseException as exc:
            self._give_share(client)
            if isinstance(exc, BulkheadFull):
                return self._refusal("too many requests in flight")
            raise
        return None

    def leave(self, client: str | None = None) -> None:
        """Give back the slots taken by a successful :meth:`enter`/:meth:`aenter`."""
        self.bulkhead.release()
        if client is not None and self.per_client is not None:
            self._give_share(client)


class AdmissionGroups:
    """Route groups by path prefix (longest wins), each its own :class:`Admission`."""

    __slots__ = ("default", "groups")

    def __init__(
        self,
        limit: int,
        *,
        groups: Mapping[str, int] | None = None,
        per_client: int | None = None,
        max_wait: float = 0.0,
        retry_after: float = 1.0,
    ) -> None:
        self.default = Admission(
            limit, per_client=per_client, max_wait=max_wait, retry_after=retry_after
        )
        items = sorted((groups or {}).items(), key=lambda kv: -len(kv[0]))
        for prefix, _ in items:
            if not prefix.startswith("/"):
                raise ConfigError("groups", f"group prefixes must start with '/': {prefix!r}")
        self.groups = [
            (
                prefix,
                Admission(
                    size,
                    per_client=None if per_client is None else min(per_client, size),
                    max_wait=max_wait,
                    retry_after=retry_after,
                    name=prefix,
                ),
            )
            for prefix, size in items
        ]

    def for_path(self, path: str) -> Admission:
        """The group of ``path``."""
        for prefix, admission in self.groups:
            if path.startswith(prefix):
                return admission
        return self.default


class SharedAdmission:
    """Fleet-wide slots in a store: ``limit`` for the group, ``per_client`` per client.

    Both are :class:`stormguard.Concurrency` leases decided in one store call (all or
    nothing) and given back when the request ends; a holder that dies frees its
    slot after ``lease`` seconds (keep it above the longest request). No waiting:
    a full group answers 503 + ``Retry-After`` at once. ``on_store_error`` as for
    the limiters.
    """

    __slots__ = ("_client", "_group", "per_client", "retry_after")

    def __init__(
        self,
        limit: int,
        *,
        store: Any,
        per_client: int | None = None,
        lease: float = 60.0,
        retry_after: float = 1.0,
        on_store_error: str = "open",
        name: str = "concurrency",
    ) -> None:
        for field, value in (("limit", limit), ("per_client", per_client)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(field, f"must be an integer >= 1, got {value!r}")
        if not retry_after > 0:
            raise ConfigError("retry_after", f"must be > 0 seconds, got {retry_after!r}")
        mode: Any = on_store_error
        self._group = AsyncRateLimiter(
            Concurrency(limit, lease),
            store,
            name=name,
            on_store_error=mode,
        )
        self._client = (
            None
            if per_client is None
            else AsyncRateLimiter(
                Concurrency(per_client, lease),
                store,
                name=f"{name}-client",
                on_store_error=mode,
            )
        )
        self.per_client = per_client
        self.retry_after = float(retry_after)

    async def aenter(self, client: str | None = None) -> Refusal | Decision:
        """Take the slots: the decision (keep it for :meth:`aleave`) or a Refusal (503)."""
        items = [(self._group, "all")]
        if self._client is not None and client is not None:
            items.append((self._client, client))
        decision = await AsyncRateLimiter.hit_many(items)
        if decision.allowed:
            return decision
        return Refusal.of(
            503, "too many requests in flight", reason="bulkhead_full", retry_after=self.retry_after
        )

    async def aleave(self, client: str | None, decision: Decision) -> None:
        """Give back the slots of an admitted request."""
        parts = decision.parts or (decision,)
        await self._group.release("all", parts[0])
        if self._client is not None and client is not None and len(parts) > 1:
            await self._client.release(client, parts[1])
