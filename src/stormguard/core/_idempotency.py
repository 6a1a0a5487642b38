# Idempotency claims: one key's life as a table (the Redis script, lua/idempotency.lua,
# plays the same rules; the contract tests hold both to them).
#
# States of a key (per scope):
#   absent                      nobody has used it (or its entry expired);
#   in_flight(fp, owner, until) the first request holds it until `until` (its lease);
#   done(fp, response)          the first request finished; kept for `ttl`.
#
#   event      state                          -> outcome      new state
#   claim      absent / in_flight expired     -> CLAIMED      in_flight(fp, owner, now+lease)
#   claim      in_flight, other fingerprint   -> MISMATCH     (unchanged)
#   claim      in_flight, same fingerprint    -> IN_FLIGHT    (unchanged; retry in `until-now`)
#   claim      done, other fingerprint        -> MISMATCH     (unchanged)
#   claim      done, same fingerprint         -> REPLAY       (unchanged)
#   complete   in_flight, same owner, live    -> COMPLETED    done(fp, response), ttl
#   complete   anything else                  -> REFUSED      (unchanged: a crashed owner's
#                                                              late answer is not stored)
#   release    in_flight, same owner          -> RELEASED     absent (a 5xx: retry runs again)
#   release    anything else                  -> KEPT         (unchanged)
#
# Nothing here reads a clock: `now` comes in, like every core decision.
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias

__all__ = [
    "ClaimEntry",
    "ClaimOutcome",
    "ClaimResult",
    "claim",
    "complete",
    "fingerprint",
    "release",
]


class ClaimOutcome(StrEnum):
    """What a claim, completion or release came to."""

    CLAIMED = "claimed"
    IN_FLIGHT = "in_flight"
    MISMATCH = "mismatch"
    REPLAY = "replay"
    COMPLETED = "completed"
    REFUSED = "refused"
    RELEASED = "released"
    KEPT = "kept"


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    """A key's stored state: ``response`` is None while in flight."""

    fingerprint: str
    owner: str
    until: float  # in flight: lease end; done: expiry
    response: bytes | None = None


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """An outcome plus what the caller needs: the stored response or the wait."""

    outcome: ClaimOutcome
    response: bytes | None = None
    retry_after: float = 0.0


Step: TypeAlias = tuple["ClaimEntry | None", ClaimResult]


def _live(entry: ClaimEntry | None, now: float) -> ClaimEntry | None:
    return entry if entry is not None and entry.until > now else None


def claim(entry: ClaimEntry | None, fp: str, owner: str, now: float, lease: float) -> Step:
    """Try to take a key for a request with fingerprint ``fp``."""
    entry = _live(entry, now)
    if entry is None:
        return ClaimEntry(fp, owner, now + lease), ClaimResult(ClaimOutcome.CLAIMED)
    if entry.fingerprint != fp:
        return entry, ClaimResult(ClaimOutcome.MISMATCH)
    if entry.response is None:
        return entry, ClaimResult(ClaimOutcome.IN_FLIGHT, retry_after=entry.until - now)
    return entry, ClaimResult(ClaimOutcome.REPLAY, response=entry.response)


def complete(entry: ClaimEntry | None, owner: str, response: bytes, now: float, ttl: float) -> Step:
    """Store the owner's response (refused when its lease ended or it lost the key)."""
    entry = _live(entry, now)
    if entry is None or entry.response is not None or entry.owner != owner:
        return entry, ClaimResult(ClaimOutcome.REFUSED)
    done = ClaimEntry(entry.fingerprint, owner, now + ttl, response)
    return done, ClaimResult(ClaimOutcome.COMPLETED)


def release(entry: ClaimEntry | None, owner: str, now: float) -> Step:
    """Give the key back so a retry runs again (only its live owner can)."""
    entry = _live(entry, now)
    if entry is not None and entry.response is None and entry.owner == owner:
        return None, ClaimResult(ClaimOutcome.RELEASED)
    return entry, ClaimResult(ClaimOutcome.KEPT)


def fingerprint(*parts: bytes) -> str:
    """SHA-256 over length-prefixed parts (method, path, body ...): equal iff parts equal."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
