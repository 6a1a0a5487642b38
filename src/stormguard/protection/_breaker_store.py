# The shared breaker's side of the Redis protocol: encoding the arguments of the
# breaker_*.lua scripts and decoding their replies, and the near cache. The rules
# themselves live in the scripts (the same table as core/_breaker.py); outage
# handling lives in the CircuitBreaker, which runs these methods through its
# StoreHealth (they let StoreError through).
#
# Near cache (`staleness` > 0). A closed breaker is by far the common case, and
# asking Redis twice per call (admit, record) makes a shared breaker cost two
# round trips per call. Instead the store keeps the last state it read, and for
# `staleness` seconds after reading it:
#   closed    -> calls are admitted without a round trip; their successes are
#                counted here and sent as one batch (breaker_record.lua, "batch"),
#                which also reads the state again: one round trip per `staleness`
#                seconds per process, whatever the call rate. A failure is sent at
#                once with the batch so far (it may trip the breaker, and this
#                process must see its own trip at once);
#   open      -> calls are refused without a round trip until the open time ends.
# Every other case asks Redis: a stale cache (the batch goes with it), and the
# half-open state, whose probes are handed out by breaker_acquire.lua alone, so
# the fleet-wide `half_open_probes` limit holds exactly. A cached "closed" can never
# admit a call in a later half-open episode: the staleness used is at most half
# the shortest open time (open_for * (1 - jitter)), and a closed breaker must trip
# and stay open that long before it half-opens. The price of the cache: another
# process sees a trip (or this process's outcomes) up to `staleness` seconds late.
#
# ARGV of every breaker script: failure_rate min_calls window kind buckets
# open_for open_for_max half_open_probes probe_lease jitter draw ttl | extra...
# `draw` is one uniform draw from the breaker's RNG (the open-time jitter), so a
# seeded breaker is reproducible; `ttl` lets idle breakers expire from Redis.
from __future__ import annotations

import asyncio
import math
import random
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from ..core._breaker import Admission, BreakerConfig
from ..stores._fallback import ScriptStore
from ._permit import Permit

__all__ = ["BreakerStore", "CachedAdmission", "RemoteAdmission"]


@dataclass(frozen=True, slots=True)
class RemoteAdmission:
    """A shared breaker's answer (from a script, or from the near cache)."""

    allowed: bool
    probe: bool
    generation: int
    remaining: float
    lease_id: str
    state: str


@dataclass(frozen=True, slots=True)
class CachedAdmission(Admission):
    """A closed admission handed out from a shared breaker's fresh near cache
    (CircuitBreaker.try_enter_cached): its success joins the next batch, its
    failure is sent with the batch at once."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_NEVER = -math.inf


class BreakerStore:
    """Runs one named breaker's scripts on a shared store (raises StoreError)."""

    __slots__ = (
        "_arefreshing",
        "_batch",
        "_cache",
        "_lock",
        "_refreshing",
        "_static",
        "_ttl",
        "keys",
        "rng",
        "shared",
        "staleness",
    )

    def __init__(
        self,
        shared: ScriptStore,
        name: str,
        config: BreakerConfig,
        rng: random.Random,
        staleness: float = 0.0,
    ):
        self.shared = shared
        self.rng = rng
        base = shared.key("breaker", name)
        self.keys = [base, base + ":leases", base + ":window"]
        buckets = config.buckets if config.window_kind == "time" else int(config.window)
        self._static: list[Any] = [
            repr(config.failure_rate),
            config.min_calls,
            repr(config.window),
            config.window_kind,
            buckets,
            repr(config.open_for),
            repr(config.open_for_max),
            config.half_open_probes,
            repr(config.probe_lease),
            repr(config.jitter),
        ]
        self._ttl = repr(2.0 * (config.window + config.open_for_max + config.probe_lease))
        self.staleness = min(staleness, 0.5 * config.open_for * (1.0 - config.jitter))
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._arefreshing: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        # (read at, closed admission or None, open until, generation, state, closed
        # ticket or None): one tuple replaced at once, so a lock-free reader sees one
        # consistent reading.
        self._cache: tuple[float, RemoteAdmission | None, float, int, str, Admission | None] = (
            _NEVER,
            None,
            _NEVER,
            0,
            "closed",
            None,
        )
        self._batch = [0, 0, 0, _NEVER]  # generation, successes, failures, first at

    def _args(self, *extra: str) -> list[Any]:
        return [*self._static, repr(self.rng.random()), self._ttl, *extra]

    @staticmethod
    def _admission(reply: Any) -> RemoteAdmission:
        allowed, probe, generation, remaining, lease_id, state = reply
        return RemoteAdmission(
            bool(int(allowed)),
            bool(int(probe)),
            int(generation),
            float(remaining),
            _text(lease_id),
            _text(state),
        )

    # -- the near cache ------------------------------------------------------------------

    def cached(self, now: float) -> RemoteAdmission | None:
        """The answer of a fresh cached state, or None when the store must be asked."""
        read_at, closed, open_until, generation, state, _ = self._cache
        if now - read_at >= self.staleness:
            return None
        if closed is not None:
            return closed
        if state == "open" and now < open_until:
            return RemoteAdmission(False, False, generation, open_until - now, "", state)
        return None

    def ticket(self, now: float) -> Admission | None:
        """The closed ticket of a fresh cached "closed" (no lock, no round trip), or
        None when the store must be asked."""
        read_at, _, _, _, _, ticket = self._cache
        if ticket is None or now - read_at >= self.staleness:
            return None
        return ticket

    def batched(self, generation: int, failure: bool, now: float) -> bool:
        """Count a closed outcome for the next batch; True when the batch is due.

        A batch is due when its first outcome is ``staleness`` old, or at once when
        it holds a failure (a failure may trip the breaker: this process must see
        its own trip at once, and the fleet within ``staleness``).
        """
        with self._lock:
            batch = self._batch
            if generation != batch[0]:
                if generation < batch[0]:
                    return False  # stale: the breaker moved on since this call began
                batch[:] = [generation, 0, 0, now]
            elif batch[1] + batch[2] == 0:
                batch[3] = now
            batch[2 if failure else 1] += 1
            return failure or now - batch[3] >= self.staleness

    def _take_batch(self) -> list[str]:
        with self._lock:
            generation, ok, fail, _ = self._batch
            self._batch[1:] = [0, 0, _NEVER]
        gen = generation if ok + fail else self._cache[3]
        return self._args(str(gen), "0", "", "batch", str(ok), str(fail))

    def _cache_reply(self, reply: Any, now: float) -> RemoteAdmission:
        state, generation, remaining = _text(reply[0]), int(reply[1]), float(reply[2])
        answer = RemoteAdmission(state == "closed", False, generation, remaining, "", state)
        closed = answer if state == "closed" else None
        ticket = CachedAdmission(True, False, generation) if closed is not None else None
        self._cache = (now, closed, now + remaining, generation, state, ticket)
        return answer

    def forget(self) -> None:
        """Drop the cached state (the next call asks the store)."""
        self._cache = (_NEVER, None, _NEVER, 0, "closed", None)

    def refresh(self, now: float) -> RemoteAdmission:
        """Send the batch and read the state (one round trip); refreshes the cache."""
        reply = self.shared.run("breaker_record", self.keys, self._take_batch())
        return self._cache_reply(reply, now)

    async def arefresh(self, now: float) -> RemoteAdmission:
        """Async twin of :meth:`refresh`."""
        reply = await self.shared.arun("breaker_record", self.keys, self._take_batch())
        return self._cache_reply(reply, now)

    def admit(self, now: float) -> RemoteAdmission:
        """Admit one call: from a fresh cache, else from the store."""
        self.shared.check_sync()
        if self.staleness > 0:
            answer = self.cached(now) or self._refresh_once(now)
            if answer.state != "half_open":
                return answer
        return self.acquire()

    def _refresh_once(self, now: float) -> RemoteAdmission:
        # Threads finding the cache stale together make one round trip, not one
        # each: the first refreshes, the others wait for it and read its answer.
        with self._refreshing:
            return self.cached(now) or self.refresh(now)

    async def aadmit(self, now: float) -> RemoteAdmission:
        """Async twin of :meth:`admit`."""
        if self.staleness > 0:
            answer = self.cached(now) or await self._arefresh_once(now)
            if answer.state != "half_open":
                return answer
        return await self.aacquire()

    def peek(self, now: float) -> RemoteAdmission:
        """The state without taking a slot (cached when fresh)."""
        if self.staleness > 0:
            return self.cached(now) or self.refresh(now)
        return self.acquire(peek=True)

    async def apeek(self, now: float) -> RemoteAdmission:
        """Async twin of :meth:`peek`."""
        if self.staleness > 0:
            return self.cached(now) or await self.arefresh(now)
        return await self.aacquire(peek=True)

    def _route(self, permit: Permit, outcome: str, now: float) -> str:
        # A closed call admitted on the near cache is counted for the next batch:
        # "later", or "refresh" when the batch is due. Anything else: "record" now.
        admission = permit.admission
        if not self.staleness or admission.probe:
            return "record"
        if outcome != "release" and self.batched(admission.generation, outcome == "fail", now):
            return "refresh"
        return "later"

    def report(self, permit: Permit, outcome: str, now: float) -> str | None:
        """Report a permit's outcome; the state the store answered (None: not asked)."""
        route = self._route(permit, outcome, now)
        if route == "refresh":
            return self.refresh(now).state
        if route == "record":
            adm = permit.admission
            return self.record(adm.generation, adm.probe, permit.lease_id, outcome)[0]
        return None

    async def areport(self, permit: Permit, outcome: str, now: float) -> str | None:
        """Async twin of :meth:`report`."""
        route = self._route(permit, outcome, now)
        if route == "refresh":
            return (await self.arefresh(now)).state
        if route == "record":
            adm = permit.admission
            return (await self.arecord(adm.generation, adm.probe, permit.lease_id, outcome))[0]
        return None

    # -- the scripts ---------------------------------------------------------------------

    def acquire(self, *, peek: bool = False) -> RemoteAdmission:
        """Admit one call (or, with ``peek``, only read the state)."""
        args = self._args("1" if peek else "0")
        return self._admission(self.shared.run("breaker_acquire", self.keys, args))

    async def _arefresh_once(self, now: float) -> RemoteAdmission:
        # The tasks of one event loop finding the cache stale together: the first
        # refreshes, the others wait for it (never blocking the loop on a lock).
        loop = asyncio.get_running_loop()
        running = self._arefreshing.get(loop)
        if running is not None:
            await asyncio.shield(running)
            return self.cached(now) or await self.arefresh(now)
        done: asyncio.Future[None] = loop.create_future()
        self._arefreshing[loop] = done
        try:
            return await self.arefresh(now)
        finally:
            del self._arefreshing[loop]
            done.set_result(None)

    async def aacquire(self, *, peek: bool = False) -> RemoteAdmission:
        """Async twin of :meth:`acquire`."""
        args = self._args("1" if peek else "0")
        return self._admission(await self.shared.arun("breaker_acquire", self.keys, args))

    def _record_args(self, generation: int, probe: bool, lease_id: str, outcome: str) -> list[Any]:
        return self._args(str(generation), "1" if probe else "0", lease_id, outcome, "0", "0")

    def record(self, generation: int, probe: bool, lease_id: str, outcome: str) -> tuple[str, int]:
        """Report ``outcome`` ("ok", "fail", "release"); returns (state, generation)."""
        args = self._record_args(generation, probe, lease_id, outcome)
        reply = self.shared.run("breaker_record", self.keys, args)
        return _text(reply[0]), int(reply[1])

    async def arecord(
        self, generation: int, probe: bool, lease_id: str, outcome: str
    ) -> tuple[str, int]:
        """Async twin of :meth:`record`."""
        args = self._record_args(generation, probe, lease_id, outcome)
        reply = await self.shared.arun("breaker_record", self.keys, args)
        return _text(reply[0]), int(reply[1])

    def admin(self, script: str) -> tuple[str, int]:
        """Run breaker_force_open or breaker_reset; returns (state, generation)."""
        self.forget()
        reply = self.shared.run(script, self.keys, [self._ttl])
        return _text(reply[0]), int(reply[1])

    async def aadmin(self, script: str) -> tuple[str, int]:
        """Async twin of :meth:`admin`."""
        self.forget()
        reply = await self.shared.arun(script, self.keys, [self._ttl])
        return _text(reply[0]), int(reply[1])
