# What the circuit breaker hands out and tells: the Permit of one admitted call,
# and the BreakerEvent its listeners receive.
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from ..core._breaker import Admission, BreakerState

__all__ = ["AReport", "BreakerEvent", "EventKind", "Listener", "Outcome", "Permit", "Report"]

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


Outcome = Literal["ok", "fail", "release"]
Report = Callable[["Permit", Outcome], None]
AReport = Callable[["Permit", Outcome], Awaitable[None]]


@dataclass(slots=True, eq=False)
class Permit:
    """One admitted call. Report its outcome once with :meth:`record`.

    ``probe`` is True for a half-open probe. A permit that is never reported
    holds a probe slot until its lease ends (``probe_lease``). The duration used
    for ``slow_call`` runs from the admission to the report, on the breaker's clock.

    A permit is a small value: the admission, when it started, the two functions
    that report back to whoever granted it, and the shared lease it holds (if any).
    """

    admission: Admission
    started: float
    _reports: tuple[Report, AReport]
    remote: bool = False
    lease_id: str = ""
    _done: bool = field(default=False, init=False)

    @property
    def probe(self) -> bool:
        """True when this call is a half-open probe."""
        return self.admission.probe

    @property
    def generation(self) -> int:
        """The breaker generation the permit was granted in."""
        return self.admission.generation

    def record(self, *, failure: bool) -> None:
        """Report the outcome (only the first report counts)."""
        if not self._done:
            self._done = True
            self._reports[0](self, "fail" if failure else "ok")

    async def arecord(self, *, failure: bool) -> None:
        """Async twin of :meth:`record` (awaits the store when it is shared)."""
        if not self._done:
            self._done = True
            await self._reports[1](self, "fail" if failure else "ok")

    def release(self) -> None:
        """Give the permit back without an outcome (the call was cancelled)."""
        if not self._done:
            self._done = True
            self._reports[0](self, "release")

    async def arelease(self) -> None:
        """Async twin of :meth:`release`."""
        if not self._done:
            self._done = True
            await self._reports[1](self, "release")
