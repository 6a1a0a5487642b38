# Where idempotency claims live: in this process (a dict under a lock, the core
# table applied directly) or in Redis (lua/idempotency.lua: one round trip per
# claim, completion or release, on Redis' clock). Both speak the same small
# protocol, with sync and async twins, so ASGI, gRPC (sync and aio) and the
# gateway share one implementation.
#
# Store keys: the scope (tenant) and the client's key are hashed together
# (length-prefixed SHA-256) so "a:b"+"c" never meets "a"+"b:c" and raw keys never
# sit in Redis.
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from .._errors import ConfigError
from ..core._idempotency import (
    ClaimEntry,
    ClaimOutcome,
    ClaimResult,
    Step,
    claim,
    complete,
    fingerprint,
    release,
)
from ..stores import MemoryStore

__all__ = ["ClaimStore", "MemoryClaims", "RedisClaims", "claim_key", "claims_for"]


def claim_key(scope: str, key: str) -> str:
    """The store key of ``key`` within ``scope`` (a tenant)."""
    return "idem:" + fingerprint(scope.encode(), key.encode())[:40]


class ClaimStore(Protocol):
    """Claims, completions and releases; sync and async twins."""

    def claim(self, key: str, fp: str, owner: str, lease: float) -> ClaimResult: ...
    def complete(self, key: str, owner: str, response: bytes, ttl: float) -> bool: ...
    def release(self, key: str, owner: str) -> bool: ...
    async def aclaim(self, key: str, fp: str, owner: str, lease: float) -> ClaimResult: ...
    async def acomplete(self, key: str, owner: str, response: bytes, ttl: float) -> bool: ...
    async def arelease(self, key: str, owner: str) -> bool: ...


class MemoryClaims:
    """Claims in this process: the core table under one lock; ``clock()`` gives seconds.

    Bounded: expired entries are dropped as writes pass them, and past ``max_keys``
    the least recently written entry goes (that key could then run again).
    """

    __slots__ = ("_clock", "_data", "_lock", "max_keys")

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000):
        self._clock = clock
        self._data: OrderedDict[str, ClaimEntry] = OrderedDict()
        self._lock = threading.Lock()
        self.max_keys = max_keys

    def _apply(self, key: str, event: Callable[[ClaimEntry | None, float], Step]) -> ClaimResult:
        with self._lock:
            now = self._clock()
            data = self._data
            entry, result = event(data.get(key), now)
            if entry is None:
                data.pop(key, None)
                return result
            data[key] = entry
            data.move_to_end(key)
            # Oldest writes first: drop up to two expired ones per write (amortized
            # O(1), like MemoryStore), and the oldest entry past max_keys.
            for _ in range(2):
                oldest = next(iter(data))
                if data[oldest].until > now:
                    break
                del data[oldest]
            if len(data) > self.max_keys:
                data.popitem(last=False)
            return result

    def claim(self, key: str, fp: str, owner: str, lease: float) -> ClaimResult:
        """Take ``key`` for a request with fingerprint ``fp`` (see core/_idempotency.py)."""
        return self._apply(key, lambda entry, now: claim(entry, fp, owner, now, lease))

    def complete(self, key: str, owner: str, response: bytes, ttl: float) -> bool:
        """Store the owner's response; False when its claim was lost."""
        result = self._apply(key, lambda entry, now: complete(entry, owner, response, now, ttl))
        return result.outcome is ClaimOutcome.COMPLETED

    def release(self, key: str, owner: str) -> bool:
        """Drop the owner's claim so a retry runs again."""
        result = self._apply(key, lambda entry, now: release(entry, owner, now))
        return result.outcome is ClaimOutcome.RELEASED

    async def aclaim(self, key: str, fp: str, owner: str, lease: float) -> ClaimResult:
        """Async twin of :meth:`claim` (never blocks on I/O)."""
        return self.claim(key, fp, owner, lease)

    async def acomplete(self, key: str, owner: str, response: bytes, ttl: float) -> bool:
        """Async twin of :meth:`complete`."""
        return self.complete(key, owner, response, ttl)

    async def arelease(self, key: str, owner: str) -> bool:
        """Async twin of :meth:`release`."""
        return self.release(key, owner)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _result(reply: Any) -> ClaimResult:
    outcome = ClaimOutcome(_text(reply[0]))
    if outcome is ClaimOutcome.IN_FLIGHT:
        return ClaimResult(outcome, retry_after=int(reply[1]) / 1000)
    if outcome is ClaimOutcome.REPLAY:
        raw = reply[1]
        return ClaimResult(outcome, response=raw if isinstance(raw, bytes) else str(raw).encode())
    return ClaimResult(outcome)


class RedisClaims:
    """Claims in Redis through ``lua/idempotency.lua`` on a RedisStore or AsyncRedisStore."""

    __slots__ = ("store",)
    SCRIPT = "idempotency"

    def __init__(self, store: Any) -> None:
        if not callable(getattr(store, "run_script", None)):
            raise ConfigError("store", f"{store!r} cannot run scripts (need a Redis store)")
        self.store = store

    def _key(self, key: str) -> list[str]:
        return [self.store.key(key)]

    def claim(self, key: str, fp: str, owner: str, lease: float) -> ClaimResult:
        """Take ``key`` (one round trip)."""
        return _result(
            self.store.run_script(self.SCRIPT, self._key(key), ["claim", fp, owner, _ms(lease)])
        )

    def complete(self, key: str, owner: str, response: bytes, ttl: float) -> bool:
        """Store the owner's response (one round trip)."""
        args = ["complete", owner, _ms(ttl), response]
        return _result(self.store.run_script(self.SCRIPT, self._key(key), args)).outcome is (
            ClaimOutcome.COMPLETED
        )

    def release(self, key: str, owner: str) -> bool:
        """Drop the owner's claim (one round trip)."""
        reply = self.store.run_script(self.SCRIPT, self._key(key), ["release", owner])
        return _result(reply).outcome is ClaimOutcome.RELEASED

    async def aclaim(self, key: str, fp: str, owner: str, lease: float) -> ClaimResult:
        """Async twin of :meth:`claim`."""
        args = ["claim", fp, owner, _ms(lease)]
        return _result(await self.store.run_script(self.SCRIPT, self._key(key), args))

    async def acomplete(self, key: str, owner: str, response: bytes, ttl: float) -> bool:
        """Async twin of :meth:`complete`."""
        args = ["complete", owner, _ms(ttl), response]
        reply = await self.store.run_script(self.SCRIPT, self._key(key), args)
        return _result(reply).outcome is ClaimOutcome.COMPLETED

    async def arelease(self, key: str, owner: str) -> bool:
        """Async twin of :meth:`release`."""
        reply = await self.store.run_script(self.SCRIPT, self._key(key), ["release", owner])
        return _result(reply).outcome is ClaimOutcome.RELEASED


def claims_for(store: Any) -> ClaimStore:
    """The claim backend of a limiter store object (MemoryStore or a Redis store)."""
    if store is None or isinstance(store, MemoryStore):
        clock = getattr(store, "clock", None)
        return MemoryClaims(clock=clock.monotonic if clock is not None else time.monotonic)
    if isinstance(store, MemoryClaims | RedisClaims):
        return store
    return RedisClaims(store)
