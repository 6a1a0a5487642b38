# The retry-contract checker: reads a mock journal and says, per logical operation,
# how the client retried and which rules it broke. It trusts only the journal — the
# server's record of what arrived and what it answered — never the client.
#
# Which requests are attempts of one operation:
#  * the same idempotency key is one operation, whatever happened in between;
#  * without a key, the same client + method + path + query + body (the fingerprint,
#    _journal.operation_of) is one operation until it succeeds: a request after a
#    success is a new operation (a poll, a second read), not a retry;
#  * a client may label its attempts (journal field `attempt`, from the
#    Stormguard-Attempt header, 1 = first; X-Stainless-Retry-Count and AWS's
#    amz-sdk-request are read too): a keyless request labelled as a first attempt,
#    or with a number not above the previous one, starts a new operation.
# Between two attempts of one operation, the gap is measured from the end of the
# earlier answer (or the moment the client gave up on a hung connection) to the
# arrival of the next request.
#
# Violations (kind: meaning):
#   early-retry            the next attempt came sooner than the Retry-After it was given
#   non-retryable-retried  an error status outside the retryable set was retried
#                          (408, 425, 429, 502, 503, 504: stormguard's decision table;
#                          a 403 refusing for a rate limit, GitHub-style, counts as 429)
#   unsafe-retry           POST/PATCH without an Idempotency-Key retried after a failure
#                          that may have been processed (anything but 429: 5xx, reset,
#                          empty or broken response, timeout)
#   body-changed           the body changed between attempts under one key
#   key-changed            after a failure, the same request came back under another key
#                          (or lost / gained its key)
#   duplicate-side-effect  more than one side effect in the ledger for one operation
#   synchronized-retries   across the fleet (>= 3 clients), the gaps before the n-th
#                          retry cluster around one value instead of spreading: backoff
#                          without jitter, or immediate retries. Only retries the server
#                          gave no Retry-After to are counted.
from __future__ import annotations

import itertools
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._journal import operation_of

__all__ = ["Checker", "Operation", "Report", "Violation", "check_journal", "validate_journal"]

VIOLATION_KINDS = (
    "body-changed",
    "duplicate-side-effect",
    "early-retry",
    "key-changed",
    "non-retryable-retried",
    "synchronized-retries",
    "unsafe-retry",
)
_RETRYABLE_4XX = frozenset({408, 425, 429})
RETRYABLE_STATUSES = frozenset({408, 425, 429, 502, 503, 504})
_UNSAFE_METHODS = frozenset({"POST", "PATCH"})
_FAULTS = frozenset(
    {
        "reset",
        "empty",
        "malformed-chunked",
        "hang",
        "commit-then-reset",
        "commit-then-504",
        "client-gone",
        "send-failed",
    }
)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: its kind, the operation, a message and the journal ids."""

    kind: str
    operation: str
    message: str
    entries: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "operation": self.operation,
            "message": self.message,
            "entries": list(self.entries),
        }


@dataclass(frozen=True, slots=True)
class Operation:
    """The attempts of one logical operation and the gaps between them (seconds)."""

    id: str
    client: str | None
    method: str
    path: str
    idempotency_key: str | None
    attempts: tuple[Mapping[str, Any], ...]
    gaps: tuple[float, ...]
    side_effects: int
    query: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "client": self.client,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "idempotency_key": self.idempotency_key,
            "attempts": len(self.attempts),
            "entries": [a.get("id") for a in self.attempts],
            "gaps": [round(g, 6) for g in self.gaps],
            "side_effects": self.side_effects,
        }


@dataclass(frozen=True, slots=True)
class Report:
    """What the checker found. ``ok`` is true when there is no violation."""

    operations: tuple[Operation, ...]
    violations: tuple[Violation, ...]
    requests: int = 0
    by_kind: Mapping[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def __bool__(self) -> bool:
        return self.ok

    def kinds(self) -> set[str]:
        """The kinds of violation found."""
        return {v.kind for v in self.violations}

    def summary(self, *, limit: int = 20) -> str:
        """A human-readable report (at most ``limit`` violation lines)."""
        if not self.requests:
            return "empty journal: no requests to check"
        retried = sum(1 for op in self.operations if len(op.attempts) > 1)
        lines = [
            f"{self.requests} requests, {len(self.operations)} operations "
            f"({retried} retried), {len(self.violations)} violations"
        ]
        for kind, count in sorted(self.by_kind.items()):
            lines.append(f"  {kind}: {count}")
        for violation in self.violations[:limit]:
            lines.append(f"- {violation.kind}: {violation.message}")
        if len(self.violations) > limit:
            lines.append(f"  ... and {len(self.violations) - limit} more")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "requests": self.requests,
            "violations": [v.to_dict() for v in self.violations],
            "by_kind": dict(self.by_kind),
            "operations": [op.to_dict() for op in self.operations],
        }


def _failed(entry: Mapping[str, Any]) -> bool:
    status = entry.get("status")
    return entry.get("outcome") in _FAULTS or status is None or int(status) >= 400


def _judged_status(entry: Mapping[str, Any]) -> int | None:
    # A GitHub-style 403 that refused for a rate limit (the mock's own limiter, or an
    # answer that asked for a wait) is judged as the 429 it stands for.
    status = entry.get("status")
    if status is None:
        return None
    refusal = entry.get("outcome") == "rate-limited" or entry.get("retry_after") is not None
    return 429 if int(status) == 403 and refusal else int(status)


def _maybe_processed(entry: Mapping[str, Any]) -> bool:
    # Anything but 429 (and a 4xx the server rejected up front) may have been
    # processed: the server got the request and then the answer was lost or failed.
    if entry.get("outcome") in _FAULTS:
        return True
    status = entry.get("status")
    return status is None or int(status) >= 500


@dataclass(frozen=True, kw_only=True, slots=True)
class Checker:
    """Checks a journal against the retry contract.

    ``tolerance``: seconds an attempt may come before its Retry-After (clock skew
    and rounding). ``retryable_statuses``: error statuses that may be retried
    (default 408, 425, 429, 502, 503, 504, as in ``stormguard.RetryPolicy``).
    Synchronised retries are reported when, for some retry number, at least
    ``min_samples`` gaps from ``min_clients`` clients exist and at least
    ``cluster_share`` of them lie within ``10% of the median + cluster_width``
    seconds of the median gap.
    """

    tolerance: float = 0.05
    min_samples: int = 8
    min_clients: int = 3
    cluster_share: float = 0.75
    cluster_width: float = 0.01
    retryable_statuses: Iterable[int] = RETRYABLE_STATUSES

    def __post_init__(self) -> None:
        object.__setattr__(self, "retryable_statuses", frozenset(self.retryable_statuses))

    def check(self, journal: Iterable[Mapping[str, Any]]) -> Report:
        """Check journal entries (dicts as served by ``GET /__mock/journal``)."""
        entries = sorted(validate_journal(journal), key=lambda e: (float(e["time"]), int(e["id"])))
        groups = _operations(entries)

        violations: list[Violation] = []
        operations: list[Operation] = []
        retry_gaps: dict[int, list[tuple[float, str]]] = defaultdict(list)
        for op_id, attempts in groups.items():
            gaps = []
            for n, (prev, cur) in enumerate(itertools.pairwise(attempts), start=1):
                gap = float(cur["time"]) - float(prev.get("end") or prev["time"])
                gaps.append(gap)
                violations.extend(self._pair(op_id, prev, cur, gap))
                if _failed(prev) and prev.get("retry_after") is None:
                    retry_gaps[n].append((gap, str(cur.get("client"))))
            effects = [a for a in attempts if a.get("side_effect") is not None]
            if len(effects) > 1:
                violations.append(
                    Violation(
                        "duplicate-side-effect",
                        op_id,
                        f"{_describe(attempts[0])}: {len(effects)} side effects "
                        f"({', '.join(str(e['side_effect']) for e in effects)})",
                        tuple(int(e["id"]) for e in effects),
                    )
                )
            first = attempts[0]
            operations.append(
                Operation(
                    id=op_id,
                    client=first.get("client"),
                    method=str(first.get("method")),
                    path=str(first.get("path")),
                    query=str(first.get("query") or ""),
                    idempotency_key=first.get("idempotency_key"),
                    attempts=tuple(attempts),
                    gaps=tuple(gaps),
                    side_effects=len(effects),
                )
            )
        violations.extend(self._key_changes(entries))
        violations.extend(self._synchronized(retry_gaps))
        by_kind: dict[str, int] = defaultdict(int)
        for violation in violations:
            by_kind[violation.kind] += 1
        return Report(tuple(operations), tuple(violations), len(entries), dict(by_kind))

    def _pair(
        self, op_id: str, prev: Mapping[str, Any], cur: Mapping[str, Any], gap: float
    ) -> list[Violation]:
        found = []
        ids = (int(prev.get("id") or 0), int(cur.get("id") or 0))
        what = _describe(cur)
        retry_after = prev.get("retry_after")
        if retry_after is not None and gap < float(retry_after) - self.tolerance:
            found.append(
                Violation(
                    "early-retry",
                    op_id,
                    f"{what}: retried {gap:.3f}s after a {prev.get('status')} "
                    f"that said Retry-After {float(retry_after):g}s",
                    ids,
                )
            )
        status = _judged_status(prev)
        retryable = self.retryable_statuses
        if status is not None and status >= 400 and status not in retryable:
            found.append(
                Violation(
                    "non-retryable-retried",
                    op_id,
                    f"{what}: retried after {prev.get('status')}, which must not be retried",
                    ids,
                )
            )
        if (
            str(prev.get("method")).upper() in _UNSAFE_METHODS
            and not prev.get("idempotency_key")
            and _maybe_processed(prev)
        ):
            cause = prev.get("outcome") if prev.get("outcome") in _FAULTS else status
            found.append(
                Violation(
                    "unsafe-retry",
                    op_id,
                    f"{what}: retried without an Idempotency-Key after {cause}, "
                    "which may have been processed",
                    ids,
                )
            )
        if prev.get("idempotency_key") and prev.get("body_sha256") != cur.get("body_sha256"):
            found.append(
                Violation(
                    "body-changed",
                    op_id,
                    f"{what}: body changed between attempts under one key",
                    ids,
                )
            )
        return found

    def _key_changes(self, entries: list[Mapping[str, Any]]) -> list[Violation]:
        by_request: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
        for entry in entries:
            fingerprint = (
                entry.get("client"),
                entry.get("method"),
                entry.get("path"),
                entry.get("query") or "",
                entry.get("body_sha256"),
            )
            by_request[fingerprint].append(entry)
        found = []
        for attempts in by_request.values():
            for prev, cur in itertools.pairwise(attempts):
                same_key = (prev.get("idempotency_key") or None) == (
                    cur.get("idempotency_key") or None
                )
                if not _failed(prev) or same_key:
                    continue
                if _starts_anew(prev, cur):
                    continue  # the client says this is a new operation
                status = _judged_status(prev)
                if status is not None and 400 <= status < 500 and status not in _RETRYABLE_4XX:
                    continue  # a rejected request: a new key is a new attempt
                found.append(
                    Violation(
                        "key-changed",
                        str(cur.get("operation") or operation_of(cur)),
                        f"{_describe(cur)}: key changed from {prev.get('idempotency_key')!r} "
                        f"to {cur.get('idempotency_key')!r} after a failure",
                        (int(prev.get("id") or 0), int(cur.get("id") or 0)),
                    )
                )
        return found

    def _synchronized(self, retry_gaps: Mapping[int, list[tuple[float, str]]]) -> list[Violation]:
        found = []
        for n, samples in sorted(retry_gaps.items()):
            clients = {client for _, client in samples}
            if len(samples) < self.min_samples or len(clients) < self.min_clients:
                continue
            gaps = [gap for gap, _ in samples]
            median = statistics.median(gaps)
            width = 0.1 * abs(median) + self.cluster_width
            share = sum(1 for gap in gaps if abs(gap - median) <= width) / len(gaps)
            if share >= self.cluster_share:
                found.append(
                    Violation(
                        "synchronized-retries",
                        "*",
                        f"retry #{n}: {share:.0%} of {len(gaps)} gaps from {len(clients)} "
                        f"clients lie within {width:.3f}s of {median:.3f}s (no jitter?)",
                    )
                )
        return found


def _attempt(entry: Mapping[str, Any]) -> int | None:
    number = entry.get("attempt")
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def _starts_anew(prev: Mapping[str, Any], cur: Mapping[str, Any]) -> bool:
    # The client's own label: attempt 1, or a count that did not go up.
    number = _attempt(cur)
    if number is None:
        return False
    before = _attempt(prev)
    return number == 1 or (before is not None and number <= before)


def _operations(entries: list[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Entries (in time order) grouped into operations, by the rules at the top."""
    by_fingerprint: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for entry in entries:
        by_fingerprint[operation_of(entry)].append(entry)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for fingerprint, attempts in by_fingerprint.items():
        keyed = fingerprint.startswith("key:")
        number = 1
        current: list[Mapping[str, Any]] = []
        for entry in attempts:
            if (
                current
                and not keyed
                and (not _failed(current[-1]) or _starts_anew(current[-1], entry))
            ):
                groups[fingerprint if number == 1 else f"{fingerprint} #{number}"] = current
                number += 1
                current = []
            current.append(entry)
        groups[fingerprint if number == 1 else f"{fingerprint} #{number}"] = current
    return groups


# The fields every journal entry has (the checker reads these; others are optional).
_REQUIRED: dict[str, tuple[type, ...]] = {
    "id": (int,),
    "time": (int, float),
    "method": (str,),
    "path": (str,),
    "status": (int, type(None)),
    "outcome": (str,),
}


def validate_journal(journal: Any, *, source: str = "journal") -> list[Mapping[str, Any]]:
    """The entries of ``journal`` if it is a mock journal, else ValueError saying why.

    A journal is a list (possibly empty) of objects, each with at least ``id``,
    ``time``, ``method``, ``path``, ``status`` and ``outcome`` of the right types.
    """
    if isinstance(journal, Mapping | str | bytes) or not isinstance(journal, Iterable):
        raise ValueError(
            f"{source}: not a mock journal: expected a list of journal entries, got "
            f"{type(journal).__name__}"
        )
    entries = list(journal)
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ValueError(
                f"{source}: not a mock journal: entry {index} is {type(entry).__name__}, "
                "not an object"
            )
        missing = [name for name in _REQUIRED if name not in entry]
        if missing:
            raise ValueError(
                f"{source}: not a mock journal: entry {index} lacks {', '.join(missing)}"
            )
        for name, types in _REQUIRED.items():
            value = entry[name]
            if isinstance(value, bool) or not isinstance(value, types):
                raise ValueError(
                    f"{source}: not a mock journal: entry {index}: {name} is "
                    f"{type(value).__name__} {str(value)[:40]!r}"
                )
    return entries


def _describe(entry: Mapping[str, Any]) -> str:
    key = entry.get("idempotency_key")
    who = f"key {key}" if key else f"client {entry.get('client')}"
    query = entry.get("query")
    target = f"{entry.get('path')}?{query}" if query else entry.get("path")
    return f"{entry.get('method')} {target} ({who})"


def check_journal(journal: Iterable[Mapping[str, Any]] | str | Path, **options: Any) -> Report:
    """Check a journal (entries, or a path to a JSON file) against the retry contract.

    The JSON file holds the list served by ``GET /__mock/journal`` (or an object
    with a ``"journal"`` list). Options are those of :class:`Checker`.
    """
    if isinstance(journal, str | Path):
        source = str(journal)
        try:
            data = json.loads(Path(journal).read_bytes())
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"{source}: not JSON: {str(exc)[:200]}") from None
        if isinstance(data, Mapping) and set(data) == {"journal"}:
            data = data["journal"]
        journal = validate_journal(data, source=source)
    return Checker(**options).check(journal)
