# The gateway's upstream attempts, driven by the one retry conversation
# (core/_engine.Conversation), as the clients' are: the same decision table
# (status x method x keyed; never sent vs maybe processed), the same order of
# budget and breaker. This module holds no decision of its own: it builds the
# upstream's policy once, translates one attempt into an Outcome with the HTTP
# adapters' functions (client/_http.py), and performs the conversation's effects.
#
# The driver is the gateway's, not client/_driver.Run's, for one reason: the first
# attempt's breaker permit was taken with the bulkhead slot by the upstream guard
# (UpstreamPool.admit), before the body was read, so the conversation's first
# ADMIT is answered with that permit; every later ADMIT asks the breaker. The
# effects are the same ones; hooks and the retry log are the clients' (the gateway
# has its access log and metrics), so NOTIFY and GIVE_UP go to the debug log.
#
# The policy (UpstreamPool.policy): `retries.attempts` attempts, no backoff and no
# server-advised wait (max_wait 0: an upstream asking to wait gets its answer
# passed to the client, who can wait; the gateway retries at once, on the next
# target), no deadline of its own (the upstream timeouts bound each attempt), and
# 502/503/504 as the statuses worth another attempt (a 429 or 408 is the client's
# to retry). A request whose body streams cannot be replayed: one attempt.
from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import CircuitOpen
from ..client._attempt import RETRY_ATTEMPT
from ..client._http import error_failure, response_failure
from ..core._backoff import NoBackoff
from ..core._engine import (
    ADMIT,
    COUNT,
    DISCARD,
    GIVE_UP,
    NOTIFY,
    OUTCOME,
    PACE,
    PEEK,
    RECORD,
    SEND,
    SLEEP,
    SPEND,
    Conversation,
    Finish,
    Outcome,
)
from ..core._outcome import Failure, counts_against_server
from ..core._policy import GiveUpReason, RetryPolicy

if TYPE_CHECKING:
    from ._h1client import H1Response

__all__ = [
    "GATEWAY_RETRY_STATUSES",
    "SHOULD_NOT_RETRY",
    "drive",
    "error_outcome",
    "gave_up",
    "numbered",
    "policy_of",
    "response_outcome",
    "stale_resend",
]

log = logging.getLogger("stormguard.gateway")

GATEWAY_RETRY_STATUSES: Final = frozenset({502, 503, 504})
# The answer after the gateway gave up retrying (DESIGN: "Attempt numbers on the wire").
SHOULD_NOT_RETRY: Final = (b"x-should-retry", b"false")
_RETRY_ATTEMPT: Final = RETRY_ATTEMPT.lower().encode("latin-1")
_SHOULD_RETRY: Final = SHOULD_NOT_RETRY[0]
_RNG = random.Random()


def policy_of(attempts: int, budget: Any, breaker: Any) -> RetryPolicy:
    """An upstream's retry policy (see the module comment)."""
    return RetryPolicy(
        attempts=attempts,
        backoff=NoBackoff(),
        deadline=None,
        max_wait=0.0,
        retry_statuses=GATEWAY_RETRY_STATUSES,
        budget=budget,
        breaker=breaker,
    )


def response_outcome(
    policy: RetryPolicy,
    response: H1Response,
    method: str,
    keyed: bool,
    clock: Clock = SYSTEM_CLOCK,
) -> Outcome:
    """One answered attempt as the conversation judges it (client/_http.py's table);
    an HTTP-date ``Retry-After`` is read against ``clock``'s wall time."""
    status = response.status
    if status < 400:  # a success: nothing to read
        return Outcome(None, False, response)
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers]
    failure = response_failure(
        policy, status, headers, method=method, has_key=keyed, wall_now=clock.time()
    )
    return Outcome(failure, counts_against_server(status, None), response)


def error_outcome(exc: BaseException, never_sent: bool, method: str, keyed: bool) -> Outcome:
    """A failed exchange: ``never_sent`` (no connection: UpstreamConnectError), or
    maybe processed."""
    kind = Failure.NOT_SENT if never_sent else Failure.MAYBE_PROCESSED
    failure = error_failure(kind, exc, method=method, has_key=keyed)
    return Outcome(failure, counts_against_server(None, kind), error=exc)


def stale_resend(method: str, keyed: bool) -> bool:
    """Whether a request written to a pooled connection the upstream had closed
    (nothing of an answer came back) may go once more on a new connection: the
    table's row for a request that may have been processed."""
    return error_failure(Failure.MAYBE_PROCESSED, _STALE, method=method, has_key=keyed).retryable


class _Stale(Exception):
    pass


_STALE = _Stale("the pooled connection was closed by the upstream")


def numbered(headers: list[tuple[bytes, bytes]], attempt: int) -> list[tuple[bytes, bytes]]:
    """The headers of attempt ``attempt``: from the second on, ``Retry-Attempt: N``
    in place of any the client sent."""
    if attempt == 1:
        return headers
    out = [pair for pair in headers if pair[0] != _RETRY_ATTEMPT]
    out.append((_RETRY_ATTEMPT, b"%d" % attempt))
    return out


def gave_up(finish: Finish) -> bool:
    """Whether the gateway gave up retrying (its answer then says
    ``x-should-retry: false``): after a retry, or when its budget or the breaker
    stopped the retry the table allowed."""
    give_up = finish.give_up
    if give_up is None:
        return False
    return finish.attempts > 1 or give_up.reason in (
        GiveUpReason.BUDGET_EXHAUSTED,
        GiveUpReason.CIRCUIT_OPEN,
    )


def marked(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``x-should-retry: false`` in place of the upstream's verdict."""
    out = [pair for pair in headers if pair[0] != _SHOULD_RETRY]
    out.append(SHOULD_NOT_RETRY)
    return out


async def drive(
    policy: RetryPolicy,
    permit: Any,
    send: Callable[[int], Awaitable[Outcome]],
    discard: Callable[[Outcome], None],
    clock: Clock = SYSTEM_CLOCK,
) -> Finish:
    """Run the conversation to its end: ``send(n)`` makes attempt ``n`` (1-based);
    ``permit`` is the first attempt's, taken by the upstream guard. ``discard``
    drops a failed attempt's answer before the next. A ``send`` that raises (the
    client's body failed, a cancellation) gives the attempt's permit back. The
    conversation's times are read on ``clock`` (the runtime's)."""
    monotonic = clock.monotonic
    conversation = Conversation(policy, started_at=monotonic(), rng=_RNG)
    steps = conversation.steps()
    breaker, budget = policy.breaker, policy.budget
    first = True
    held = None  # the permit of the attempt in progress
    reply: Any = None
    while True:
        try:
            effect, arg = steps.send(reply)
        except StopIteration as stop:
            finish: Finish = stop.value
            return finish
        reply = None
        if effect is SEND:
            try:
                outcome = await send(conversation.attempts)
            except BaseException:
                if held is not None:
                    await held.arelease()  # not the upstream's failure
                raise
            reply = (outcome, monotonic())
        elif effect is ADMIT:
            if first:
                reply = held = permit
            else:
                try:
                    reply = held = await breaker.aacquire()
                except CircuitOpen as refused:
                    reply = refused
            first = False
        elif effect is RECORD:
            held = None
            await arg[0].arecord(failure=arg[1])
        elif effect is COUNT:
            budget.record_request()
        elif effect is SPEND:
            reply = bool(budget.try_retry())
        elif effect is PEEK:
            reply = await breaker.aopen_remaining()
        elif effect is DISCARD:
            discard(arg)
        elif effect is NOTIFY or effect is GIVE_UP:
            log.debug("upstream attempt %d: %s (%s)", arg.attempt, arg.retry, arg.failure)
        elif effect is OUTCOME:
            budget.record_outcome(**arg._asdict())
        elif effect is SLEEP:
            assert arg == 0.0, "the gateway's policy never waits"
        else:  # pragma: no cover - the policy is not paced
            assert effect is PACE
            reply = 0.0
