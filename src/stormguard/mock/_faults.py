# Deciding what the mock does with one request: route, rate limit, idempotency
# checks, the next step of the sequence, the delay and the side effect. The result
# is a Plan; the server (_server.py) plays it on the socket. Nothing here does I/O.
#
# Rules, in the order they apply (README "Mock server" documents them):
#  1. No route matches -> 404, outcome "no-route".
#  2. The route's rate limit refuses -> 429 (or the limit's `status`, 403) with the
#     chosen header style and Retry-After (unless `retry_after: false`); a GitHub
#     `secondary` limit sends Retry-After and no X-RateLimit-* headers, as GitHub
#     does. The request takes no step. Allowed requests carry the same headers.
#  3. On a `resource` route, an Idempotency-Key that is empty, blank or longer than
#     255 characters -> 400 ("invalid-key", as Stripe answers). A key first
#     seen with another body -> 422 ("mismatch"); whose key is still in flight ->
#     409 ("conflict"). Neither takes a step.
#  4. The request takes the next step of its sequence; `sequence_per` says who
#     shares a place: the idempotency key (falling back to the logical operation,
#     client + method + path + body, when there is no key), the client, or everyone.
#     The last step repeats once the sequence is used up. A step with `probability`
#     plays when the seeded RNG draws below it; otherwise the request falls through
#     to the following step (the last step always answers).
#  5. Side effects, on a `resource` route only: a success step (status < 400) and
#     `commit-then-reset`/`commit-then-504` create one, unless the key already
#     committed one — then a success step replays the stored response with
#     `Idempotent-Replayed: true`. A request without a key is always a new one.
from __future__ import annotations

import email.utils
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._journal import IdempotencyRecord, MockState, operation_of
from ._scenario import RateLimit, Route, Scenario, Step

__all__ = ["MAX_KEY_LENGTH", "Plan", "Planner", "rate_limit_headers"]

MAX_KEY_LENGTH = 255  # Stripe's limit for an Idempotency-Key


@dataclass(slots=True)
class Plan:
    """What to do with one request."""

    entry: dict[str, Any]
    action: str  # "respond" or a fault name
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    delay: float = 0.0
    in_flight: tuple[str, str] | None = None
    wait: float | None = None  # the wait asked without Retry-After (GitHub's reset)


@dataclass(frozen=True, slots=True)
class Quota:
    allowed: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: float


# --- rate limiting ------------------------------------------------------------------


def make_limiter(spec: RateLimit) -> Callable[[str], Quota]:
    """A function ``hit(key) -> Quota`` for one route's rate limit.

    Built on stormguard's own limiters (FixedWindow / TokenBucket + RateLimiter in
    memory): the mock refuses exactly as a stormguard gateway would.
    """
    from .. import FixedWindow, RateLimiter, TokenBucket

    algorithm: FixedWindow | TokenBucket
    if spec.algorithm == "token-bucket":
        algorithm = TokenBucket(spec.limit / spec.window, spec.limit)
    else:
        algorithm = FixedWindow(spec.limit, spec.window)
    limiter = RateLimiter(algorithm)

    def hit(key: str) -> Quota:
        decision = limiter.hit(key)
        retry_after = decision.retry_after
        if not math.isfinite(retry_after):
            retry_after = spec.window
        return Quota(
            allowed=decision.allowed,
            limit=int(decision.limit),
            remaining=max(0, int(decision.remaining)),
            reset_after=max(0.0, float(decision.reset_after)),
            retry_after=max(0.0, float(retry_after)),
        )

    return hit


def _go_duration(seconds: float) -> str:
    # OpenAI style: "1s", "250ms", "6m0s".
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    if minutes:
        return f"{int(minutes)}m{rest:.0f}s"
    return f"{seconds:.3g}s"


def rate_limit_headers(spec: RateLimit, quota: Quota, *, now: float) -> list[tuple[str, str]]:
    """The rate-limit headers of ``spec.headers`` style (github/stripe/ietf/openai)."""
    reset = max(0.0, quota.reset_after)
    reset_s = str(math.ceil(reset))
    remaining = str(quota.remaining)
    limit = str(quota.limit)
    if spec.secondary:  # GitHub's secondary limits: only Retry-After says anything
        headers = []
    elif spec.headers == "github":
        headers = [
            ("X-RateLimit-Limit", limit),
            ("X-RateLimit-Remaining", remaining),
            ("X-RateLimit-Used", str(quota.limit - quota.remaining)),
            ("X-RateLimit-Reset", str(math.ceil(now + reset))),
            ("X-RateLimit-Resource", "core"),
        ]
    elif spec.headers == "stripe":
        headers = [
            ("Stripe-RateLimit-Limit", limit),
            ("Stripe-RateLimit-Remaining", remaining),
            ("Stripe-RateLimit-Reset", reset_s),
        ]
        if not quota.allowed:
            headers.append(("Stripe-Rate-Limited-Reason", "global-rate"))
    elif spec.headers == "openai":
        headers = [
            ("x-ratelimit-limit-requests", limit),
            ("x-ratelimit-remaining-requests", remaining),
            ("x-ratelimit-reset-requests", _go_duration(reset)),
        ]
    else:  # ietf (draft-ietf-httpapi-ratelimit-headers, structured fields)
        window = f"{spec.window:g}"
        headers = [
            ("RateLimit-Policy", f'"default";q={limit};w={window}'),
            ("RateLimit", f'"default";r={remaining};t={reset_s}'),
        ]
    if not quota.allowed and (spec.retry_after or spec.secondary):
        headers.append(("Retry-After", str(max(1, math.ceil(quota.retry_after)))))
    return headers


def _refusal_body(spec: RateLimit) -> bytes:
    if spec.headers != "github":
        return _json({"error": {"type": "rate_limited", "message": "too many requests"}})
    docs = "https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api"
    if spec.secondary:
        message = (
            "You have exceeded a secondary rate limit. Please wait a few minutes before "
            "you try again."
        )
    else:
        message = "API rate limit exceeded."
    return _json({"message": message, "documentation_url": docs})


def _key_problem(key: str) -> str | None:
    if not key.strip():
        return "the Idempotency-Key header is empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"the Idempotency-Key is longer than {MAX_KEY_LENGTH} characters"
    return None


def _retry_after(headers: list[tuple[str, str]], now: float) -> float | None:
    for name, value in headers:
        if name.lower() != "retry-after":
            continue
        text = value.strip()
        try:
            return max(0.0, float(text))
        except ValueError:
            pass
        try:
            return max(0.0, email.utils.parsedate_to_datetime(text).timestamp() - now)
        except (TypeError, ValueError):
            return None
    return None


def _json(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


# --- the planner ------------------------------------------------------------------------


class Planner:
    """Turns a request into a Plan, updating journal, ledger and sequences."""

    def __init__(self, scenario: Scenario, state: MockState, seed: int | None = None) -> None:
        self.scenario = scenario
        self.state = state
        self.seed = scenario.seed if seed is None else seed
        self.rng = random.Random(self.seed)
        self.limiters: dict[int, Callable[[str], Quota]] = {}
        self._reset_limiters()

    def _reset_limiters(self) -> None:
        self.limiters = {
            index: make_limiter(route.rate_limit)
            for index, route in enumerate(self.scenario.routes)
            if route.rate_limit is not None
        }

    def reset(self) -> None:
        """Forget journal, ledger, sequences and limits; reseed the RNG."""
        self.state.clear()
        with self.state.lock:
            self.rng = random.Random(self.seed)
            self._reset_limiters()

    def plan(
        self,
        *,
        method: str,
        path: str,
        query: str,
        client: str,
        idempotency_key: str | None,
        body_sha256: str,
        attempt: int | None = None,
    ) -> Plan:
        now = time.time()
        with self.state.lock:
            entry: dict[str, Any] = {
                "id": len(self.state.entries) + 1,
                "time": now,
                "end": None,
                "method": method,
                "path": path,
                "query": query,
                "attempt": attempt,
                "client": client,
                "idempotency_key": idempotency_key,
                "body_sha256": body_sha256,
                "route": None,
                "step": None,
                "status": None,
                "outcome": None,
                "retry_after": None,
                "resource": None,
                "side_effect": None,
            }
            entry["operation"] = operation_of(entry)
            self.state.entries.append(entry)
            plan = self._plan(entry, now)
            if plan.action == "respond":
                entry["status"] = plan.status
            elif plan.action == "commit-then-504":
                entry["status"] = 504
            entry["retry_after"] = _retry_after(plan.headers, now)
            if entry["retry_after"] is None:
                entry["retry_after"] = plan.wait
            return plan

    def client_gone(self, plan: Plan) -> None:
        """The client closed the connection before the answer was sent."""
        with self.state.lock:
            plan.entry["outcome"] = "client-gone"
            plan.entry["status"] = None
            plan.entry["retry_after"] = None

    def send_failed(self, plan: Plan, reason: str) -> None:
        """The answer could not be written: no status reached the client."""
        with self.state.lock:
            plan.entry["outcome"] = "send-failed"
            plan.entry["status"] = None
            plan.entry["retry_after"] = None
            plan.entry["error"] = reason

    def finish(self, plan: Plan) -> None:
        """The answer is complete (or the connection is gone): close the entry."""
        with self.state.lock:
            plan.entry["end"] = time.time()
            if plan.in_flight is not None:
                self.state.in_flight.discard(plan.in_flight)

    # the rules, in order -----------------------------------------------------------

    def _plan(self, entry: dict[str, Any], now: float) -> Plan:
        found = self.scenario.route_for(entry["method"], entry["path"])
        if found is None:
            entry["outcome"] = "no-route"
            body = _json({"error": "no route", "method": entry["method"], "path": entry["path"]})
            return Plan(entry, "respond", 404, [("Content-Type", "application/json")], body)
        index, route = found
        entry["route"] = index
        entry["resource"] = route.resource

        limit_headers: list[tuple[str, str]] = []
        if route.rate_limit is not None:
            spec = route.rate_limit
            quota = self.limiters[index](entry["client"] if spec.per == "client" else "*")
            limit_headers = rate_limit_headers(spec, quota, now=now)
            if not quota.allowed:
                entry["outcome"] = "rate-limited"
                headers = [("Content-Type", "application/json"), *limit_headers]
                refusal = Plan(entry, "respond", spec.status, headers, _refusal_body(spec))
                if spec.headers == "github" and not spec.secondary:
                    # GitHub's primary limit: wait until X-RateLimit-Reset (epoch s).
                    refusal.wait = max(0.0, math.ceil(now + quota.reset_after) - now)
                return refusal

        key = entry["idempotency_key"]
        problem = _key_problem(key) if key is not None and route.resource else None
        if problem is not None:
            entry["outcome"] = "invalid-key"
            body = _json({"error": {"type": "idempotency_error", "message": problem}})
            headers = [("Content-Type", "application/json"), *limit_headers]
            return Plan(entry, "respond", 400, headers, body)
        record_key = (route.resource, key) if route.resource and key else None
        if record_key is not None:
            record = self.state.records.get(record_key)
            if record is not None and record.body_sha256 != entry["body_sha256"]:
                entry["outcome"] = "mismatch"
                body = _json({"error": "idempotency key reused with a different body"})
                headers = [("Content-Type", "application/json"), *limit_headers]
                return Plan(entry, "respond", 422, headers, body)
            if record_key in self.state.in_flight:
                entry["outcome"] = "conflict"
                body = _json({"error": "a request with this idempotency key is in flight"})
                headers = [("Content-Type", "application/json"), *limit_headers]
                return Plan(entry, "respond", 409, headers, body)
            if record is None:
                self.state.records[record_key] = IdempotencyRecord(entry["body_sha256"])
            self.state.in_flight.add(record_key)

        step_index, step = self._next_step(index, route, entry)
        entry["step"] = step_index
        delay = 0.0
        if route.delay is not None:
            delay += route.delay.draw(self.rng)
        if step.delay is not None:
            delay += step.delay.draw(self.rng)
        plan = Plan(entry, "respond", step.status, [*step.headers, *limit_headers], step.body)
        plan.delay = delay
        plan.in_flight = record_key

        if step.fault is not None:
            plan.action = step.fault
            entry["outcome"] = step.fault
            if step.fault.startswith("commit-then-"):
                self._commit(route, entry, record_key)
            return plan
        if not step.is_success:
            entry["outcome"] = "error"
            return plan
        entry["outcome"] = "ok"
        if route.resource is None:
            return plan
        record = self.state.records.get(record_key) if record_key else None
        if record is not None and record.committed and record.response is not None:
            status, stored_headers, body = record.response
            entry["outcome"] = "replayed"
            plan.status = status
            plan.headers = [*stored_headers, ("Idempotent-Replayed", "true"), *limit_headers]
            plan.body = body
            return plan
        self._commit(route, entry, record_key, response=step)
        return plan

    def _next_step(self, index: int, route: Route, entry: dict[str, Any]) -> tuple[int, Step]:
        if route.sequence_per == "client":
            who = entry["client"]
        elif route.sequence_per == "idempotency-key":
            who = entry["operation"]
        else:
            who = ""
        position = self.state.positions.get((index, who), 0)
        self.state.positions[(index, who)] = position + 1
        last = len(route.sequence) - 1
        for step_index in range(min(position, last), last + 1):
            step = route.sequence[step_index]
            if step_index == last or step.probability is None:
                return step_index, step
            if self.rng.random() < step.probability:
                return step_index, step
        raise AssertionError("unreachable: the last step always answers")  # pragma: no cover

    def _commit(
        self,
        route: Route,
        entry: dict[str, Any],
        record_key: tuple[str, str] | None,
        response: Step | None = None,
    ) -> None:
        if route.resource is None:
            return
        if response is None:  # commit-then-*: what a later replay answers
            response = next((s for s in route.sequence if s.is_success), Step())
        stored = (response.status, response.headers, response.body)
        if record_key is not None:
            record = self.state.records[record_key]
            if record.committed:
                return  # the key already has its side effect: never a second one
            record.committed = True
            record.response = stored
            effect_id = record_key[1]
        else:
            effect_id = f"request-{entry['id']}"
        effects = self.state.ledger.setdefault(route.resource, {})
        effects[effect_id] = effects.get(effect_id, 0) + 1
        entry["side_effect"] = effect_id
