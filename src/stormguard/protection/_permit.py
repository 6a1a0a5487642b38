# What the circuit breaker hands out and tells: the Permit of one admitted call,
# and the BreakerEvent its listeners receive.
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..core._breaker import Admission, BreakerState

if TYPE_CHECKING:
    from ._breaker import CircuitBreaker

__all__ = ["BreakerEvent", "EventKind", "Listener", "Permit"]

EventKind = Literal["state_change", "store_unavailable", "store_available"]


@dataclass(frozen=True, slots=True)
class BreakerEvent:
    """What a listener receives: a state change, or the shared store going/coming.

    ``kind`` is ``"state_change"`` (``old_state`` -> ``new_state``; ``detail`` is
    ``"shared"`` when the change was seen in the store), ``"store_unavailable"``
    (the breaker now decides locally; ``detail`` says why) or
    ``"store_available"`` (it rejoined the shared state).
    """

    name: str | None
    kind: EventKind
    old_state: BreakerState
    new_state: BreakerState
    detail: str = ""


Listener = Callable[[BreakerEvent], None]


class Permit:
    """One admitted call. Report its outcome once with :meth:`record`.

    ``probe`` is True for a half-open probe. A permit that is never reported
    holds a probe slot until its lease ends (``probe_lease``). The duration used
    for ``slow_call`` runs from the admission to the report, on the breaker's clock.
    """

    __slots__ = ("_admission", "_breaker", "_done", "_lease_id", "_remote", "started")

    def __init__(
        self,
        breaker: CircuitBreaker,
        admission: Admission,
        started: float,
        remote: bool = False,
        lease_id: str = "",
    ) -> None:
        self._breaker = breaker
        self._admission = admission
        self.started = started
        self._remote = remote
        self._lease_id = lease_id
        self._done = False

    @property
    def probe(self) -> bool:
        """True when this call is a half-open probe."""
        return self._admission.probe

    @property
    def generation(self) -> int:
        """The breaker generation the permit was granted in."""
        return self._admission.generation

    def record(self, *, failure: bool) -> None:
        """Report the outcome (only the first report counts)."""
        if not self._done:
            self._done = True
            self._breaker._record(self, failure, "fail" if failure else "ok")

    async def arecord(self, *, failure: bool) -> None:
        """Async twin of :meth:`record` (awaits the store when it is shared)."""
        if not self._done:
            self._done = True
            await self._breaker._arecord(self, failure, "fail" if failure else "ok")

    def release(self) -> None:
        """Give the permit back without an outcome (the call was cancelled)."""
        if not self._done:
            self._done = True
            self._breaker._record(self, False, "release")

    async def arelease(self) -> None:
        """Async twin of :meth:`release`."""
        if not self._done:
            self._done = True
            await self._breaker._arecord(self, False, "release")
