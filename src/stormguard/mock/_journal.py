# The mock's memory: the journal (one entry per request, what arrived and what was
# answered), the ledger (side effects per resource) and the idempotency records.
#
# A logical operation is identified the same way here, in the server's sequences
# and in the checker: the idempotency key when the request carries one, else
# client + method + path + SHA-256 of the body. `operation_of` is that rule.
#
# All of it is touched from the server's event-loop thread and read (or reset)
# from the test's thread, so every method takes one lock and returns copies.
from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["IdempotencyRecord", "MockState", "operation_of"]

# Journal entry fields (public: README documents them; the checker reads them).
#   id              int, 1, 2, ... in arrival order
#   time            Unix seconds when the request (headers and body) had arrived
#   end             Unix seconds when the answer was complete (None while in flight)
#   method, path    as received (path without the query string); query kept apart
#   client          X-Client-Id header, else the peer's IP address
#   idempotency_key Idempotency-Key header or None
#   body_sha256     hex digest of the request body
#   route, step     indices into the scenario (None when nothing matched / no step)
#   status          status code sent, or None when no response was sent
#   outcome         ok | error | replayed | conflict | mismatch | rate-limited |
#                   no-route | reset | empty | malformed-chunked | hang |
#                   commit-then-reset | commit-then-504 | client-gone (the client
#                   closed the connection during the delay, before any answer)
#   retry_after     seconds of the Retry-After header sent, else None
#   resource        the route's resource or None
#   side_effect     ledger id of the side effect this request created, else None
#   operation       the logical-operation id (see operation_of)


def operation_of(entry: Mapping[str, Any]) -> str:
    """The logical operation a journal entry belongs to."""
    key = entry.get("idempotency_key")
    if key:
        return f"key:{key}"
    return (
        f"request:{entry.get('client')} {entry.get('method')} {entry.get('path')} "
        f"{entry.get('body_sha256')}"
    )


@dataclass(slots=True)
class IdempotencyRecord:
    body_sha256: str
    committed: bool = False
    response: tuple[int, tuple[tuple[str, str], ...], bytes] | None = None


@dataclass(slots=True)
class MockState:
    """Journal, ledger, sequence positions and idempotency records, under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    entries: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[str, dict[str, int]] = field(default_factory=dict)
    positions: dict[tuple[int, str], int] = field(default_factory=dict)
    records: dict[tuple[str, str], IdempotencyRecord] = field(default_factory=dict)
    in_flight: set[tuple[str, str]] = field(default_factory=set)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.ledger.clear()
            self.positions.clear()
            self.records.clear()
            self.in_flight.clear()

    def journal(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(entry) for entry in self.entries]

    def ledger_copy(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {name: dict(effects) for name, effects in self.ledger.items()}
