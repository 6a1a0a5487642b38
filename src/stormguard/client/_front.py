# What the two HTTP front ends (httpx, requests) share, with no HTTP library
# imported: their configuration, and one logical request's facts — its method and
# idempotency key, whether its body can be replayed, its origin's guard, and the
# translation of a response or a transport error into the engine's Outcome.
# Each adapter keeps only what its library spells differently.
from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from typing import Any

from .._clock import SYSTEM_CLOCK, Clock
from ..core._engine import Outcome
from ..core._outcome import Failure
from ..core._policy import RetryFailure, RetryPolicy
from ..core._ratelimit_headers import Quota, parse_rate_limits
from ..protection._origin import COOLDOWN_STATUSES, OriginGuards, guards_for
from ._driver import Detail, Engine, RetryHook, Run
from ._http import (
    IDEMPOTENCY_KEY,
    KEYED_METHODS,
    describe,
    error_failure,
    mentions_quota,
    new_idempotency_key,
    response_failure,
)

__all__ = ["HttpCall", "HttpFront", "Observation", "one_shot", "with_retry_if"]

# What an origin guard observes of a response: status, header pairs, parsed hint.
Observation = tuple[int, list[tuple[str, str]], float | None]

_PROTECTION = ("breaker", "budget", "bulkhead", "cooldown", "pacing", "store", "guards")


def with_retry_if(policy: RetryPolicy | None, retry_if: Any) -> RetryPolicy:
    """``policy`` (default ``RetryPolicy()``) with an adapter's ``retry_if`` keyword, if given."""
    policy = policy if policy is not None else RetryPolicy()
    return policy if retry_if is None else policy.replace(retry_if=retry_if)


# A response body in a log line or record is cut here (the body itself is read
# only when small: 429/503 up to 64 KiB, for wait hints).
BODY_EXCERPT = 4096


def excerpt(body: bytes | None, limit: int = BODY_EXCERPT) -> str | None:
    """A failed response's body for the log: decoded leniently, cut past ``limit``."""
    if not body:
        return None
    text = body[: limit * 4].decode("utf-8", errors="replace")
    if len(text) > limit or len(body) > limit * 4:
        return text[:limit] + f"… [{len(body)} bytes in all]"
    return text


def exhausted_quota(pairs: list[tuple[str, str]], wall_now: float) -> Quota | None:
    """The quota the response's rate-limit headers say is used up, if any."""
    try:
        quotas = parse_rate_limits(pairs, now=wall_now)
    except Exception:  # a hostile header never breaks a request
        return None
    return next((quota for quota in quotas if quota.remaining == 0), None)


def one_shot(failure: RetryFailure) -> RetryFailure:
    """DESIGN rule 5: a body that cannot be replayed is never retried, whoever asks."""
    return RetryFailure(False, failure.reason + " (one-shot body)", failure.hint)


class HttpFront:
    """The configuration both HTTP adapters take (see RetryTransport's docstring)."""

    policy: RetryPolicy
    idempotency_keys: bool
    hooks: tuple[RetryHook, ...]
    clock: Clock
    rng: random.Random | None
    guards: OriginGuards
    engine: Engine

    def _configure(self, keywords: dict[str, Any]) -> None:
        """Take the adapter's keywords (its ``locals()``): policy, keys, hooks, protection."""
        policy: RetryPolicy | None = keywords["policy"]
        on_retry: RetryHook | Sequence[RetryHook] = keywords["on_retry"]
        clock: Clock | None = keywords["clock"]
        rng: random.Random | None = keywords["rng"]
        self.policy = with_retry_if(policy, keywords["retry_if"])
        self.idempotency_keys = bool(keywords["idempotency_keys"])
        self.hooks = (on_retry,) if callable(on_retry) else tuple(on_retry)
        self.clock = clock or SYSTEM_CLOCK
        self.rng = rng
        protection = {name: keywords[name] for name in _PROTECTION}
        self.guards = guards_for(**protection, clock=clock, rng=rng)
        self.engine = Engine(clock=self.clock, rng=rng, hooks=self.hooks)


class HttpCall:
    """One logical HTTP request across its attempts."""

    __slots__ = ("front", "guard", "has_key", "method", "pairs", "replayable", "run")

    def __init__(
        self,
        front: HttpFront,
        method: str,
        url: Any,
        headers: MutableMapping[str, str],
        *,
        origin_of: Callable[[Any], str],
        replayable: bool,
        pairs: Callable[[Any], list[tuple[str, str]]],
    ) -> None:
        self.front = front
        self.pairs = pairs  # the library's (name, value) list of a header mapping
        self.method = method = method.upper()
        if front.idempotency_keys and method in KEYED_METHODS and IDEMPOTENCY_KEY not in headers:
            headers[IDEMPOTENCY_KEY] = new_idempotency_key()
        self.has_key = IDEMPOTENCY_KEY in headers
        self.replayable = replayable
        # Per-origin protection: the origin's breaker and budget join the policy;
        # its cooldown and pacing answer the engine's PACE.
        guards = front.guards
        guard = self.guard = guards.get(origin_of(url)) if guards.enabled else None
        policy = front.policy
        pace = None
        if guard is not None:
            policy = guard.policy(policy)
            pace = (guard.wait_before, guard.await_before)
        self.run: Run = front.engine.start(
            policy, target=lambda: describe(method, str(url)), pace=pace, discard=_DISCARD
        )

    @property
    def policy(self) -> RetryPolicy:
        """The call's policy (with the origin's breaker and budget)."""
        return self.run.conversation.policy

    def slot(self) -> contextlib.AbstractContextManager[None]:
        """The origin's bulkhead slot for one attempt (waits at most the deadline)."""
        if self.guard is None:
            return contextlib.nullcontext()
        return self.guard.slot(max(0.0, self.run.remaining()))

    def aslot(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Async twin of :meth:`slot`."""
        if self.guard is None:
            return contextlib.nullcontext()
        return self.guard.aslot(max(0.0, self.run.remaining()))

    def settle(
        self,
        response: Any,
        status: int,
        headers: Any,
        names: Callable[[], Iterable[str]],
        body: bytes | None,
    ) -> tuple[Outcome, Observation | None]:
        """A response as the attempt's Outcome (5xx count against the server, 4xx
        not), and what the origin's guard should observe of it (or None).

        ``headers`` is the library's header mapping, ``names()`` its lower-cased
        names; ``body`` the small 429/503 body already read, if any.
        """
        observation: Observation | None = None
        if self.guard is not None and (status in COOLDOWN_STATUSES or mentions_quota(names())):
            observation = (status, self.pairs(headers), None)
        if status < 400:
            return Outcome(None, False, response), observation
        pairs = self.pairs(headers) if observation is None else observation[1]
        wall_now = self.front.clock.time()
        failure = response_failure(
            self.policy,
            status,
            pairs,
            method=self.method,
            has_key=self.has_key,
            wall_now=wall_now,
            body=body,
            content_type=headers.get("content-type"),
            subject=response,
        )
        if failure is None:
            return Outcome(None, status >= 500, response), observation
        if observation is not None:  # the guard reuses the hint parsed here
            observation = (status, observation[1], failure.hint)
        if not self.replayable:
            failure = one_shot(failure)
        detail = Detail(excerpt(body), exhausted_quota(pairs, wall_now))
        return Outcome(failure, status >= 500, response, None, detail), observation

    def error(self, kind: Failure, exc: Exception) -> Outcome:
        """A transport error as the attempt's Outcome (FINAL ones end the call)."""
        if kind is Failure.FINAL:
            return Outcome(None, False, None, exc)
        failure = error_failure(kind, exc, method=self.method, has_key=self.has_key)
        if not self.replayable:
            failure = one_shot(failure)
        return Outcome(failure, True, None, exc)


def _discard(outcome: Outcome) -> None:
    outcome.value.close()


async def _adiscard(outcome: Outcome) -> None:
    await outcome.value.aclose()


_DISCARD = (_discard, _adiscard)
