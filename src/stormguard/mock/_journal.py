# The mock's memory: the journal (one entry per request, what arrived and what was
# answered), the ledger (side effects per resource) and the idempotency records.
#
# A request's operation fingerprint is the same here, in the server's sequences and
# in the checker: the idempotency key when the request carries one, else client +
# method + path + query + SHA-256 of the body. `operation_of` is that rule. The
# checker then splits a keyless fingerprint into successive operations (after a
# success, or where the client labels an attempt as a first one): see _checker.py.
#
# All of it is touched from the server's event-loop thread and read (or reset)
# from the test's thread, so every method takes one lock and returns copies.
from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ATTEMPT_HEADERS", "IdempotencyRecord", "MockState", "attempt_of", "operation_of"]

# Journal entry fields (public: README documents them; the checker reads them).
#   id              int, 1, 2, ... in arrival order
#   time            Unix seconds when the request (headers and body) had arrived
#   end             Unix seconds when the answer was complete (None while in flight)
#   method, path    as received (path without the query string); query kept apart
#   attempt         the client's own attempt number (1 = first) when it sends one of
#                   ATTEMPT_HEADERS, else None
#   client          X-Client-Id header, else the peer's IP address
#   idempotency_key Idempotency-Key header or None
#   body_sha256     hex digest of the request body
#   route, step     indices into the scenario (None when nothing matched / no step)
#   status          status code sent, or None when no response was sent
#   outcome         ok | error | replayed | conflict | mismatch | rate-limited |
#                   invalid-key | no-route | reset | empty | malformed-chunked | hang |
#                   commit-then-reset | commit-then-504 | client-gone (the client
#                   closed the connection during the delay, before any answer) |
#                   send-failed (the answer could not be sent; `error` says why)
#   error           why the answer could not be sent (send-failed), else absent
#   retry_after     seconds of the Retry-After header sent, else None
#   resource        the route's resource or None
#   side_effect     ledger id of the side effect this request created, else None
#   operation       the logical-operation id (see operation_of)


# Headers by which a client labels its attempts, and how to read each into an
# attempt number (1 = the first attempt). Ours first; the others are sent by real
# SDKs (OpenAI/Anthropic/Stainless count retries from 0; AWS SDKs send attempt=N).
ATTEMPT_HEADERS = ("stormguard-attempt", "x-stainless-retry-count", "amz-sdk-request")


def attempt_of(headers: Mapping[str, str]) -> int | None:
    """The attempt number a request's headers (lower-case names) state, else None."""
    try:
        if "stormguard-attempt" in headers:
            number = int(headers["stormguard-attempt"].strip())
        elif "x-stainless-retry-count" in headers:
            number = int(headers["x-stainless-retry-count"].strip()) + 1
        elif "amz-sdk-request" in headers:
            fields = dict(
                part.strip().partition("=")[::2] for part in headers["amz-sdk-request"].split(";")
            )
            number = int(fields.get("attempt", "").strip())
        else:
            return None
    except ValueError:
        return None
    return number if 1 <= number <= 1_000_000 else None


def operation_of(entry: Mapping[str, Any]) -> str:
    """The operation fingerprint of a journal entry (key, else request + query + body)."""
    key = entry.get("idempotency_key")
    if key:
        return f"key:{key}"
    query = entry.get("query")
    target = f"{entry.get('path')}?{query}" if query else str(entry.get("path"))
    return (
        f"request:{entry.get('client')} {entry.get('method')} {target} {entry.get('body_sha256')}"
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
