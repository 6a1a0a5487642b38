# The shared breaker's side of the Redis protocol: encoding the arguments of the
# breaker_*.lua scripts and decoding their replies. The rules themselves live in
# the scripts (the same table as core/_breaker.py); outage handling lives in the
# CircuitBreaker, which catches the StoreError these methods let through.
#
# ARGV of every breaker script: failure_rate min_calls window kind buckets
# open_for open_for_max half_open_probes probe_lease jitter draw ttl | extra...
# `draw` is one uniform draw from the breaker's RNG (the open-time jitter), so a
# seeded breaker is reproducible; `ttl` lets idle breakers expire from Redis.
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ..core._breaker import BreakerConfig
from ..stores._fallback import ScriptStore

__all__ = ["BreakerStore", "RemoteAdmission"]


@dataclass(frozen=True, slots=True)
class RemoteAdmission:
    """The reply of breaker_acquire.lua."""

    allowed: bool
    probe: bool
    generation: int
    remaining: float
    lease_id: str
    state: str


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class BreakerStore:
    """Runs one named breaker's scripts on a shared store (raises StoreError)."""

    __slots__ = ("_static", "_ttl", "keys", "rng", "shared")

    def __init__(self, shared: ScriptStore, name: str, config: BreakerConfig, rng: random.Random):
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

    def acquire(self, *, peek: bool = False) -> RemoteAdmission:
        """Admit one call (or, with ``peek``, only read the state)."""
        args = self._args("1" if peek else "0")
        return self._admission(self.shared.run("breaker_acquire", self.keys, args))

    async def aacquire(self, *, peek: bool = False) -> RemoteAdmission:
        """Async twin of :meth:`acquire`."""
        args = self._args("1" if peek else "0")
        return self._admission(await self.shared.arun("breaker_acquire", self.keys, args))

    def _record_args(self, generation: int, probe: bool, lease_id: str, outcome: str) -> list[Any]:
        return self._args(str(generation), "1" if probe else "0", lease_id, outcome)

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
        reply = self.shared.run(script, self.keys, [self._ttl])
        return _text(reply[0]), int(reply[1])

    async def aadmin(self, script: str) -> tuple[str, int]:
        """Async twin of :meth:`admin`."""
        reply = await self.shared.arun(script, self.keys, [self._ttl])
        return _text(reply[0]), int(reply[1])
