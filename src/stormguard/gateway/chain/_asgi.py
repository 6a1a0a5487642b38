# The chain's stages that run a coroutine on the ASGI leg (the listener's Cycle,
# in a task): shaping's wait, a Concurrency limit's lease, the idempotency claim
# around the rest of the chain, and the upstream attempts with the request body.
#
# Retries: the upstream attempts are run by the retry conversation the clients
# use (core/_engine.Conversation, driven by _retries.drive): only failures the
# client decision table (core/_outcome.py) calls safe for this method and key --
# a connection never established always; a 502/503/504 or a lost connection only
# for idempotent or keyed requests -- and only with a replayable body (small
# bodies are read whole; a streamed body is never replayed), each retry asking
# the upstream's RetryBudget and then its breaker, as a client's retry does. A
# retry carries `Retry-Attempt: N`; an answer after the gateway gave up retrying
# carries `x-should-retry: false`.
#
# A small body is read whole before the overload stage or the upstream guard takes a
# slot (unread / prefetched): a client trickling its body holds none.
#
# The client's disconnect cancels the upstream exchange (an upstream with overload
# control: once its answer came, hold_abandoned): our listener reports it
# (the cycle's on_lost); under another ASGI server a watcher waits for
# `http.disconnect` and cancels the task, once the exchange lasted WATCH_AFTER.
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Final

from ...core._attempts import attempt_from
from ...core._engine import Outcome
from ...server._idempotency import IdempotencyMiddleware
from ...server._overload import Ticket
from ...server._refusal import Refusal, send_refusal
from ...server._types import Message, Receive, Scope, Send
from ...server._view import ScopeView
from .._clients import client_id
from .._h1client import H1Response, UpstreamConnectError, UpstreamError
from .._retries import drive, error_outcome, gave_up, marked, numbered, response_outcome
from .._runtime import CompiledRoute, client_of
from .._upstream import Target
from .._wire import DISCONNECT, request_headers, response_headers
from ._books import BODYLESS, BUFFER, limit_refusal
from ._driver import DONE, arun

__all__ = [
    "attempts",
    "idempotent",
    "leased_limits",
    "overloaded",
    "prefetched",
    "release_leases",
    "shaped",
    "unread",
]

WATCH_AFTER = 0.05  # seconds before a request's disconnect watcher starts
_NO_BODY_STATUS = (204, 304)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return bytes(v)
    return None


# -- limits: shaping and leases ----------------------------------------------------------


async def shaped(ex: Any, decision: Any) -> Any:
    """{delay: S}: wait out a refusal whose retry_after still ends within S seconds,
    then ask again (nginx burst+delay, expressed as time); past S it is refused."""
    route: CompiledRoute = ex.route
    rules = route.rules
    assert rules is not None and route.delay is not None
    view, scope = ex.view or ScopeView(ex.scope), ex.scope
    clock = ex.rt.clock
    deadline = clock.monotonic() + route.delay
    while decision is not None and not decision.allowed:
        if clock.monotonic() + decision.retry_after > deadline:
            break
        await clock.asleep(decision.retry_after)
        if ex.client_left():
            return DONE
        decision = await rules.adecide(view, scope["method"], scope["path"])
    if decision is not None and not decision.allowed:
        return limit_refusal(route, decision)
    return None


async def leased_limits(ex: Any) -> Any:
    """The limits of a route with a Concurrency limit: the whole decision is kept,
    its leases given back once the request is answered (release_leases)."""
    route: CompiledRoute = ex.route
    rules = route.rules
    assert rules is not None
    view, scope = ex.view or ScopeView(ex.scope), ex.scope
    if rules.in_memory:
        decision = rules.decide(view, scope["method"], scope["path"])
    else:
        decision = await rules.adecide(view, scope["method"], scope["path"])
    ex.decision = decision
    if decision is None or decision.allowed:
        return None
    if route.delay is not None:
        return await shaped(ex, decision)
    return limit_refusal(route, decision)


async def release_leases(ex: Any) -> None:
    """Give back the leases a Concurrency limit took for the request."""
    route: CompiledRoute = ex.route
    decision = ex.decision
    if route is None or not route.leased or not decision.allowed:
        return
    for part in decision.parts or (decision,):
        limiter = route.leased.get(part.name)
        if limiter is not None and part.lease:
            await limiter.release(_limit_key(route, part.name, ex.scope), part.lease)


def _limit_key(route: CompiledRoute, name: str, scope: Scope) -> str:
    assert route.rules is not None
    view = ScopeView(scope)
    for rule, key_of, _ in route.rules._entries:
        if rule.name == name:
            return str(key_of(view))
    return ""


# -- idempotency -------------------------------------------------------------------------

_IDEMPOTENCY_REASONS = {
    400: "idempotency_invalid",
    409: "idempotency_conflict",
    413: "too_large",
    422: "idempotency_mismatch",
    503: "store_unavailable",
}
_EXCHANGE = "stormguard.exchange"


async def idempotent(ex: Any) -> Any:
    """The server side's IdempotencyMiddleware around the rest of the chain: the
    claim per (client, key), 409 while in flight, 422 on a changed request, the
    replay, 5xx released, fail closed when the store is down. Its own answers are
    refusals."""
    route: CompiledRoute = ex.route
    middleware = route.idempotency
    if middleware is None:
        pool = route.upstream
        t = pool.settings.timeout
        lease = t.total or (t.connect + t.read) * pool.attempts
        middleware = route.idempotency = IdempotencyMiddleware(
            _rest,
            store=ex.rt.store,
            required=route.config.idempotency == "require",
            scope=client_of,
            max_body=route.max_body,
            lease=max(lease, 1.0) + 5.0,
        )
    send = ex.send

    async def observed(message: Message) -> None:
        if message["type"] == "http.response.start" and not ex.upstream:
            status = int(message["status"])
            ex.status = status
            ex.outcome = _IDEMPOTENCY_REASONS.get(status, "allowed")
        await send(message)

    after = next(i for i, stage in enumerate(ex.stages) if stage.name == "idempotency") + 1
    ex.scope[_EXCHANGE] = (ex, after)
    await middleware(ex.scope, ex.receive, observed)
    return DONE


async def _rest(scope: Scope, receive: Receive, send: Send) -> None:
    # The middleware's inner app: the chain after the idempotency stage.
    ex, i = scope[_EXCHANGE]
    ex.receive, ex.send = receive, send
    await arun(ex, i)


# -- the request body, read before any upstream slot is taken ----------------------------


class _Replay:
    """``receive`` once a small body was read whole: the body in one message, then
    the client's own ``receive`` (its disconnect)."""

    __slots__ = ("body", "receive")

    def __init__(self, body: bytes, receive: Receive) -> None:
        self.body: bytes | None = body
        self.receive = receive

    async def __call__(self) -> Message:
        body = self.body
        if body is None:
            return await self.receive()
        self.body = None
        return {"type": "http.request", "body": body, "more_body": False}


def unread(ex: Any) -> bool:
    """The request declares a small body (a length up to BUFFER) not read yet. It is
    read whole before the overload stage or the upstream guard takes a slot (nginx
    too reads it before it connects upstream), so a client that trickles its body
    holds no upstream slot while it does; larger and chunked bodies are streamed."""
    if ex.receive.__class__ is _Replay:
        return False
    length = _header(ex.scope, b"content-length")
    return length is not None and length.isdigit() and 0 < int(length) <= BUFFER


async def prefetched(ex: Any) -> bool:
    """Read the body :func:`unread` found; False when it did not come (the answer,
    413 or 408, is given; a client gone gets none)."""
    try:
        body = await _read_all(ex.receive, ex.route, ex.rt.config.body_timeout)
    except (_TooLarge, _BodyTimeout, _ClientGone) as exc:
        await _read_failed(exc, ex)
        return False
    ex.receive = _Replay(body, ex.receive)
    return True


# -- priority and overload control ------------------------------------------------------


async def overloaded(ex: Any) -> Any:
    """The priority and overload stage around the rest of the chain: the request's
    class (route, or the trusted priority header), its attempt number (Retry-Attempt
    and the peers' headers) and its client rank it in the upstream's line
    (server/_overload.py); what the upstream answered teaches the limit."""
    if unread(ex) and not await prefetched(ex):
        return DONE
    route: CompiledRoute = ex.route
    control = ex.pool.overload
    assert route.classify is not None and control is not None
    view = ex.view or ScopeView(ex.scope)
    priority = route.classify(view, ex.scope["path"])
    if not ex.client and ex.key is not None:
        ex.client = client_id(ex.key)
    ticket = await control.aenter(priority, attempt_from(view.header), ex.client or None)
    if not isinstance(ticket, Ticket):
        return ticket  # a refusal: shed:<class>, concurrency_limit, admission_control
    after = next(i for i, stage in enumerate(ex.stages) if stage.name == "overload") + 1
    try:
        await arun(ex, after)
    except BaseException:
        control.leave(ticket, failed=True, measured=False)
        raise
    if not ex.reached:
        control.release(ticket)  # refused by the guard: nothing went upstream
    elif ex.outcome == "client_gone":
        late = ex.late
        if late:  # held until the upstream answered (hold_abandoned): a real latency
            control.leave(ticket, failed=late >= 500, dropped=late in _DROPPED)
        else:
            control.abandon(ticket)  # the upstream may still be working on it
    else:
        status = ex.status
        dropped = status == 503 or ex.outcome == "upstream_timeout"
        control.leave(ticket, failed=status >= 500, dropped=dropped)
    return DONE


# -- the upstream attempts ---------------------------------------------------------------


class _ClientGone(Exception):
    pass


class _TooLarge(Exception):
    pass


class _BodyTimeout(Exception):
    pass


async def attempts(ex: Any) -> Any:
    """Read the body (small ones whole), then the attempts; the answer relayed.
    Gives back what the guard admitted with, whatever happens."""
    rt, route, pool, scope = ex.rt, ex.route, ex.pool, ex.scope
    admission = ex.held
    assert admission is not None
    receive = ex.receive
    ex.upstream = pool.name
    method: str = scope["method"]
    length_header = _header(scope, b"content-length")
    length = int(length_header) if length_header and length_header.isdigit() else None
    chunked = _header(scope, b"transfer-encoding") is not None
    body: bytes | _Stream | None
    try:
        try:
            if not chunked and (length is None or length == 0):
                body = None if method in BODYLESS or length is None else b""
            elif not chunked and length is not None and length <= BUFFER:
                body = await _read_all(receive, route, rt.config.body_timeout)
            else:
                body = _Stream(receive, route.max_body, rt.config.body_timeout, asyncio.Event())
        except (_TooLarge, _BodyTimeout, _ClientGone) as exc:
            if admission.permit is not None:
                permit, admission.permit = admission.permit, None
                await permit.arelease()  # never reached the upstream
            await _read_failed(exc, ex)
            return DONE
        ex.reached = True  # (for the overload stage: the upstream was asked)
        ex.late = 0  # (and what it answered after the client left, when held)
        await _guarded(ex, admission, body)
    finally:
        pool.done(admission)  # the gauge follows within a refresh (Gateway._refresh)
    return DONE


async def _guarded(ex: Any, admission: Any, body: bytes | _Stream | None) -> None:
    task = asyncio.current_task()
    assert task is not None
    scope, receive = ex.scope, ex.receive

    # An upstream with overload control keeps the slot of a request whose client
    # left while an attempt is out until the upstream answers (hold_abandoned; as
    # nginx's proxy_ignore_client_abort): the upstream goes on working on it anyway,
    # and a slot given back early lets the line admit more than the upstream serves.
    holds = ex.pool.holds
    out: list[bool] = []  # an attempt is out to the upstream

    def client_gone() -> None:
        if not ex.done:
            ex.gone = True
            if not (holds and out):
                task.cancel()

    # Our own listener tells us of a disconnect (once the body is read); under
    # another ASGI server, requests that last past WATCH_AFTER get a watcher task.
    cycle = scope.get(DISCONNECT)
    watcher: list[asyncio.Future[None]] = []
    timer = None
    if cycle is not None and not isinstance(body, _Stream):
        cycle.on_lost = client_gone
    else:
        done = body.done if isinstance(body, _Stream) else _DONE
        timer = asyncio.get_running_loop().call_later(
            WATCH_AFTER,
            lambda: watcher.append(asyncio.ensure_future(_watch(receive, done, client_gone))),
        )
    try:
        await _attempts(ex, admission, body, out)
    except asyncio.CancelledError:
        if not ex.gone:
            raise
        ex.outcome, ex.status = "client_gone", 499
        task.uncancel()
    except _Abandoned:
        ex.outcome, ex.status = "client_gone", 499
    finally:
        if cycle is not None:
            cycle.on_lost = None
        if timer is not None:
            timer.cancel()
        if watcher:
            watcher[0].cancel()


class _Done:
    """A body that was read whole: done already (the watcher's event, without an Event)."""

    @staticmethod
    async def wait() -> None:
        return None


_DONE = _Done()


async def _watch(receive: Receive, body_done: Any, client_gone: Any) -> None:
    await body_done.wait()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            client_gone()
            return


async def _read_all(receive: Receive, route: CompiledRoute, wait: float) -> bytes:
    chunks = []
    size = 0
    while True:
        message = await _receive(receive, wait)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > route.max_body:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _receive(receive: Receive, wait: float) -> Any:
    # `wait`: the longest pause between two pieces of the body (half-sent bodies).
    try:
        message = await asyncio.wait_for(receive(), wait)
    except TimeoutError:
        raise _BodyTimeout from None
    if message["type"] == "http.disconnect":
        raise _ClientGone
    return message


class _Stream:
    """A request body streamed to the upstream; remembers why it stopped early."""

    __slots__ = ("cap", "done", "error", "receive", "wait")

    def __init__(self, receive: Receive, cap: int, wait: float, done: asyncio.Event) -> None:
        self.receive, self.cap, self.wait, self.done = receive, cap, wait, done
        self.error: Exception | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        try:
            while True:
                message = await _receive(self.receive, self.wait)
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.cap:
                    raise _TooLarge
                if chunk:
                    yield chunk
                if not message.get("more_body", False):
                    self.done.set()
                    return
        except (_TooLarge, _BodyTimeout, _ClientGone) as exc:
            self.error = exc
            raise


async def _read_failed(exc: Exception, ex: Any) -> None:
    # A body read whole that did not come: 413, 408 (the listener then closes), 499.
    if isinstance(exc, _TooLarge):
        await ex.arefuse(Refusal.of(413, "request body too large", reason="too_large"))
    elif isinstance(exc, _BodyTimeout):
        msg = "request body not received in time"
        await ex.arefuse(Refusal.of(408, msg, reason="body_timeout"))
    else:
        ex.outcome, ex.status = "client_gone", 499


async def _body_failed(exc: Exception, ex: Any) -> None:
    if isinstance(exc, _TooLarge):
        await ex.arefuse(Refusal.of(413, "request body too large", reason="too_large"))
    elif isinstance(exc, _BodyTimeout):
        msg = "request body not received in time"
        await send_refusal(
            ex.send, Refusal.of(408, msg, reason="body_timeout", headers=[("Connection", "close")])
        )
        ex.outcome, ex.status = "body_timeout", 408
    else:
        ex.outcome, ex.status = "client_gone", 499


class _BodyFailed(Exception):
    """The client's streamed body failed during an attempt (why: ``cause``)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(cause)
        self.cause = cause


class _Abandoned(Exception):
    """The client left while the attempt was out; the upstream has now answered."""


# What the upstream answered after its client left that says "too much" (overloaded,
# timed out): the adaptive limit learns a drop from it, as from a request still there.
_DROPPED: Final = frozenset({503, 504})


async def _attempts(ex: Any, admission: Any, body: bytes | _Stream | None, out: list[bool]) -> None:
    # The upstream attempts, run by the retry conversation (_retries.py): this
    # function makes one attempt and answers with how the conversation ended.
    rt, pool, scope, send = ex.rt, ex.pool, ex.scope, ex.send
    method: str = scope["method"]
    view = ScopeView(scope)
    headers = request_headers(scope, rt.identity.trusted_peer(view))
    keyed = _header(scope, b"idempotency-key") is not None
    replayable = not isinstance(body, _Stream)  # a streamed body is never replayed
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    target_path = path + b"?" + query if query else path
    client = pool.client
    policy = pool.policy if replayable else pool.single
    picked: list[Target] = []  # the last attempt's target (the next avoids it)
    # A failed attempt's answer the conversation discarded: released when the next
    # attempt goes out, since a breaker that refuses that attempt ends the call
    # with this answer as the last outcome (then it is relayed).
    dropped: list[H1Response] = []

    def discard(outcome: Outcome) -> None:
        dropped.append(outcome.value)

    async def attempt(number: int) -> Outcome:
        while dropped:
            dropped.pop().release()
        if ex.gone:  # no retry for a client that left (while the last attempt was out)
            raise _Abandoned
        target = pool.pick(avoid=picked[0] if picked else None)
        picked[:] = (target,)
        sent = time.perf_counter()
        out.append(True)
        try:
            response = await client.request(
                target.base, method, target_path, numbered(headers, number), body
            )
        except (UpstreamError, TimeoutError) as exc:
            if isinstance(body, _Stream) and body.error is not None:
                raise _BodyFailed(body.error) from exc  # the client's fault, not the upstream's
            rt.metrics.upstream_failed(pool.name, exc)
            pool.report(target, True)
            if ex.gone:
                ex.late = 504 if isinstance(exc, TimeoutError) else 502
                raise _Abandoned from exc
            never_sent = isinstance(exc, UpstreamConnectError)
            return error_outcome(exc, never_sent, method, keyed)
        finally:
            out.clear()
        rt.metrics.observe_latency(pool.name, time.perf_counter() - sent, response.status)
        pool.report(target, response.status >= 500)
        if ex.gone:
            ex.late = response.status
            response.release()
            raise _Abandoned
        return response_outcome(policy, response, method, keyed, rt.clock)

    try:
        finish = await drive(policy, admission.permit, attempt, discard, rt.clock)
    except BaseException as exc:
        while dropped:
            dropped.pop().release()
        if not isinstance(exc, _BodyFailed):
            raise
        await _body_failed(exc.cause, ex)
        return
    outcome = finish.outcome
    assert outcome is not None  # the first attempt's permit is in hand: always sent
    while dropped:  # (the last outcome's answer, when a breaker refused the retry, is relayed)
        response = dropped.pop()
        if response is not outcome.value:
            response.release()
    stop = gave_up(finish)
    if outcome.error is None:
        await _relay(outcome.value, send, ex, method, stop)
        return
    headers_out = [("x-should-retry", "false")] if stop else []
    if isinstance(outcome.error, TimeoutError):
        await ex.arefuse(
            Refusal.of(
                504,
                f"upstream {pool.name!r} timed out",
                reason="upstream_timeout",
                headers=headers_out,
            )
        )
    else:
        await ex.arefuse(
            Refusal.of(
                502,
                f"upstream {pool.name!r} unreachable",
                reason="upstream_error",
                headers=headers_out,
            )
        )


async def _relay(
    response: H1Response, send: Send, ex: Any, method: str, gave_up: bool = False
) -> None:
    # Small answers go out in one message; others stream as they arrive. A failure
    # after the status line went out can only cut the connection (the server does).
    # `gave_up`: the gateway gave up retrying; the answer says x-should-retry: false.
    ex.status = status = response.status
    headers = response_headers(response.raw_headers)
    if gave_up:
        headers = marked(headers)
    if status in _NO_BODY_STATUS:
        # Bodiless whatever its Content-Length says (the upstream client read none):
        # the listener would hold the empty body against that length.
        headers = [pair for pair in headers if pair[0] != b"content-length"]
    start = {"type": "http.response.start", "status": status, "headers": headers}
    started = False
    try:
        length = response.content_length
        if method == "HEAD" or (length is not None and length <= BUFFER):
            data = b"" if method == "HEAD" else await response.read()
            started = True
            await send(start)
            ex.done = True
            await send({"type": "http.response.body", "body": data})
            return
        # The head goes out with the first body bytes (as on a direct exchange): an
        # answer that breaks before any of it arrived is still a 502.
        chunks = response.chunks()
        first = await anext(chunks, b"")
        started = True
        await send(start)
        if first:
            await send({"type": "http.response.body", "body": first, "more_body": True})
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        ex.done = True
        await send({"type": "http.response.body", "body": b""})
    except (UpstreamError, TimeoutError) as exc:
        timed_out = isinstance(exc, TimeoutError)
        ex.outcome = "upstream_timeout" if timed_out else "upstream_error"
        if not started:
            status = 504 if timed_out else 502
            await send_refusal(send, Refusal.of(status, "upstream answer cut", reason=ex.outcome))
            ex.status = status
    finally:
        response.release()
