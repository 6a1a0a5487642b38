# The HTTP proxy leg: one request through the gateway, in order --
#
#   route match -> client key -> size cap (413) -> limits, one store call
#   (429, or shaping: hold at most `delay` s) -> idempotency -> priority and
#   overload control (503: shed:<class>, concurrency_limit, admission_control) ->
#   breaker (503) -> bulkhead (503) -> upstream attempt(s) -> stream the answer back.
#
# Retries: the upstream attempts are run by the retry conversation the clients
# use (core/_engine.Conversation, driven by _retries.py): only failures the client
# decision table (core/_outcome.py) calls safe for this method and key -- a
# connection never established always; a 502/503/504 or a lost connection only for
# idempotent or keyed requests -- and only with a replayable body (small bodies are
# read whole; a streamed body is never replayed), each retry asking the upstream's
# RetryBudget and then its breaker, as a client's retry does. A retry carries
# `Retry-Attempt: N`; an answer after the gateway gave up retrying carries
# `x-should-retry: false`.
#
# The client's disconnect cancels the upstream exchange: once the request body is
# read, a watcher waits for `http.disconnect` and cancels the handler, which frees
# the bulkhead slot and closes the upstream connection on its way out. The watcher
# starts WATCH_AFTER into the exchange, so the many short requests never pay for
# a task of their own.
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from .._errors import CircuitOpen
from ..core._attempts import attempt_from
from ..core._engine import Outcome
from ..server._idempotency import IdempotencyMiddleware
from ..server._overload import OverloadControl, Ticket
from ..server._refusal import Refusal, rate_limited, send_refusal, unavailable
from ..server._types import Message, Receive, Scope, Send
from ..server._view import ScopeView
from ._clients import client_id
from ._h1client import H1Response, UpstreamConnectError, UpstreamError
from ._retries import drive, error_outcome, gave_up, marked, numbered, response_outcome
from ._runtime import CLIENT_KEY, SHADOW_KEY, CompiledRoute, Runtime, client_of
from ._upstream import Held, Target, UpstreamPool
from ._wire import DISCONNECT, request_headers, response_headers

__all__ = ["handle_http"]

access_log = logging.getLogger("stormguard.gateway.access")
log = logging.getLogger("stormguard.gateway")
_BUFFER = 64 * 1024  # bodies up to this size are read whole (and may be retried)
WATCH_AFTER = 0.05  # seconds before a request's disconnect watcher starts
_NO_BODY_STATUS = (204, 304)
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE", "TRACE"})


class _ClientGone(Exception):
    pass


class _TooLarge(Exception):
    pass


class _BodyTimeout(Exception):
    pass


class _Exchange:
    """The bookkeeping of one request (for metrics and the access log)."""

    __slots__ = ("client", "done", "gone", "outcome", "rule", "status", "upstream")

    def __init__(self) -> None:
        self.outcome = "allowed"
        self.status = 0
        self.client = ""
        self.rule = ""
        self.upstream = ""
        self.gone = False  # the client disconnected before the answer was complete
        self.done = False  # the last body message was handed to the server


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return bytes(v)
    return None


async def handle_http(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve one HTTP request through ``rt`` (the runtime current when it arrived)."""
    started = time.perf_counter()
    ex = _Exchange()
    route: CompiledRoute | None = None
    try:
        route = route_of(rt, scope)
        if route is None:
            ex.outcome = "not_found"
            await _refuse(send, ex, Refusal.of(404, "no route matches", reason="not_found"))
            return
        await _serve(rt, route, scope, receive, send, ex)
    except Exception:  # a bug must not take the connection down without an answer
        log.exception("gateway error on %s %s", scope["method"], scope["path"])
        if ex.status == 0:
            ex.outcome = "gateway_error"
            await _refuse(send, ex, Refusal.of(502, "gateway error", reason="gateway_error"))
    finally:
        account(rt, route, scope, ex, started)


def route_of(rt: Runtime, scope: Scope) -> CompiledRoute | None:
    """The route serving the request of ``scope`` (prefix, method, host), or None."""
    host = _header(scope, b"host")
    hostname = host.decode("latin-1").rsplit(":", 1)[0].lower() if host else None
    return rt.match(scope["path"], scope["method"], hostname)


def account(
    rt: Runtime, route: CompiledRoute | None, scope: Scope, ex: _Exchange, started: float
) -> None:
    """Count the request's outcome; write its access log line (when enabled)."""
    name = route.name if route is not None else "-"
    rt.metrics.count(name, ex.outcome)
    key = scope.get(CLIENT_KEY)  # the callback path names its client here (ex.client "")
    if ex.outcome not in ("allowed", "not_found", "upstream_error") and (ex.client or key):
        rt.metrics.refused_clients.labels(ex.client or client_id(key), ex.outcome).inc()
    if rt.config.access_log and access_log.isEnabledFor(logging.INFO):
        # a tuple now; rendered and written once per event-loop pass (_accesslog)
        rt.access.add(
            (
                scope["method"],
                scope["path"],
                name,
                ex.status,
                ex.outcome,
                key,  # hashed when the line is rendered (client_id)
                ex.rule,
                ex.upstream,
                round((time.perf_counter() - started) * 1000, 3),
                scope.get(SHADOW_KEY),  # fleet (issue 25): what shadow limits would refuse
            )
        )


async def _refuse(send: Send, ex: _Exchange, refusal: Refusal) -> None:
    ex.status = refusal.status
    ex.outcome = refusal.reason
    await send_refusal(send, refusal)


async def _serve(
    rt: Runtime, route: CompiledRoute, scope: Scope, receive: Receive, send: Send, ex: _Exchange
) -> None:
    view = ScopeView(scope)
    rule, key = rt.identity.identify(view)
    scope[CLIENT_KEY] = key
    ex.client, ex.rule = client_id(key), rule
    length_header = _header(scope, b"content-length")
    length = int(length_header) if length_header and length_header.isdigit() else None
    if length is not None and length > route.max_body:
        msg = f"request body of {length} bytes is over the {route.max_body}-byte limit"
        await _refuse(send, ex, Refusal.of(413, msg, reason="too_large"))
        return
    decision = None
    if route.rules is not None:
        decision = await _decide(rt, route, view, scope)
        if decision is not None and not decision.allowed:
            await _refuse(send, ex, limit_refusal(route, decision))
            return
    try:
        if route.config.idempotency != "off":
            scope[_EXCHANGE] = (rt, route, ex, length)
            await _idempotent(scope, receive, send)
            return
        await _to_upstream(rt, route, route.upstream, scope, receive, send, ex, length)
    finally:
        if decision is not None and route.leased:
            for part in decision.parts or (decision,):
                limiter = route.leased.get(part.name)
                if limiter is not None and part.lease:
                    await limiter.release(_limit_key(route, part.name, scope), part.lease)


def limit_refusal(route: CompiledRoute, decision: Any) -> Refusal:
    """429 over a limit; 503 when the store is down and the limits fail closed."""
    assert route.rules is not None
    if route.rules.store_down and route.rules.fails_closed:
        return unavailable(
            decision.retry_after, "store_unavailable", "limits cannot be checked now"
        )
    return rate_limited(decision, "ietf")


_IDEMPOTENCY_REASONS = {
    400: "idempotency_invalid",
    409: "idempotency_conflict",
    413: "too_large",
    422: "idempotency_mismatch",
    503: "store_unavailable",
}
_EXCHANGE = "stormguard.exchange"


async def _idempotent(scope: Scope, receive: Receive, send: Send) -> None:
    # The server side's IdempotencyMiddleware around the upstream leg: the claim per
    # (client, key), 409 while in flight, 422 on a changed request, the replay, 5xx
    # released, fail closed when the store is down. Its own answers are refusals.
    rt, route, ex, _ = scope[_EXCHANGE]
    middleware = route.idempotency
    if middleware is None:
        pool = route.upstream
        t = pool.settings.timeout
        lease = t.total or (t.connect + t.read) * pool.attempts
        middleware = route.idempotency = IdempotencyMiddleware(
            _upstream_app,
            store=rt.store,
            required=route.config.idempotency == "require",
            scope=client_of,
            max_body=route.max_body,
            lease=max(lease, 1.0) + 5.0,
        )

    async def observed(message: Message) -> None:
        if message["type"] == "http.response.start" and not ex.upstream:
            status = int(message["status"])
            ex.status = status
            ex.outcome = _IDEMPOTENCY_REASONS.get(status, "allowed")
        await send(message)

    await middleware(scope, receive, observed)


async def _upstream_app(scope: Scope, receive: Receive, send: Send) -> None:
    rt, route, ex, length = scope[_EXCHANGE]
    await _to_upstream(rt, route, route.upstream, scope, receive, send, ex, length)


def _limit_key(route: CompiledRoute, name: str, scope: Scope) -> str:
    assert route.rules is not None
    view = ScopeView(scope)
    for rule, key_of, _ in route.rules._entries:
        if rule.name == name:
            return str(key_of(view))
    return ""


async def _decide(rt: Runtime, route: CompiledRoute, view: ScopeView, scope: Scope) -> Any:
    # reject: one store call. {delay: S}: wait out a refusal whose retry_after
    # still ends within S seconds of arrival, then ask again (nginx burst+delay,
    # expressed as time); past S the request is refused.
    rules = route.rules
    assert rules is not None
    if rules.in_memory:  # nothing to await: decided in place
        decision = rules.decide(view, scope["method"], scope["path"])
    else:
        decision = await rules.adecide(view, scope["method"], scope["path"])
    if route.delay is None or decision is None or decision.allowed:
        return decision
    clock = rt.clock
    deadline = clock.monotonic() + route.delay
    while decision is not None and not decision.allowed:
        if clock.monotonic() + decision.retry_after > deadline:
            break
        await clock.asleep(decision.retry_after)
        decision = await rules.adecide(view, scope["method"], scope["path"])
    return decision


async def _admit(pool: UpstreamPool, send: Send, ex: _Exchange) -> Held | None:
    try:
        held = pool.admit_now(ex.client)
        if held is None:
            held = await pool.admit(ex.client)
    except CircuitOpen as exc:
        detail = f"upstream {pool.name!r} is failing; its circuit is open"
        await _refuse(send, ex, unavailable(exc.remaining, "breaker_open", detail))
        return None
    if isinstance(held, Refusal):
        await _refuse(send, ex, held)
        return None
    return held


async def _to_upstream(
    rt: Runtime,
    route: CompiledRoute,
    pool: UpstreamPool,
    scope: Scope,
    receive: Receive,
    send: Send,
    ex: _Exchange,
    length: int | None,
) -> None:
    ex.upstream = pool.name
    method: str = scope["method"]
    chunked = _header(scope, b"transfer-encoding") is not None
    body: bytes | _Stream | None
    try:
        if not chunked and (length is None or length == 0):
            body = None if method in _BODYLESS or length is None else b""
        elif not chunked and length is not None and length <= _BUFFER:
            body = await _read_all(receive, route, rt.config.body_timeout)
        else:
            body = _Stream(receive, route.max_body, rt.config.body_timeout, asyncio.Event())
    except _TooLarge:
        await _refuse(send, ex, Refusal.of(413, "request body too large", reason="too_large"))
        return
    except _BodyTimeout:
        await _refuse(
            send, ex, Refusal.of(408, "request body not received in time", reason="body_timeout")
        )
        return
    except _ClientGone:
        ex.outcome, ex.status = "client_gone", 499
        return
    control = pool.overload
    if control is None:
        await _guarded(rt, pool, scope, receive, send, ex, body)
        return
    ticket = await _overload(control, route, scope, ex)
    if not isinstance(ticket, Ticket):
        await _refuse(send, ex, ticket)
        return
    try:
        reached = await _guarded(rt, pool, scope, receive, send, ex, body)
    except BaseException:
        control.leave(ticket, failed=True, measured=False)
        raise
    if not reached:
        control.release(ticket)  # refused by the guard: nothing went upstream
    elif ex.outcome == "client_gone":
        control.abandon(ticket)  # the upstream may still be working on it
    else:
        status = ex.status
        dropped = status == 503 or ex.outcome == "upstream_timeout"
        control.leave(ticket, failed=status >= 500, dropped=dropped)


async def _overload(
    control: OverloadControl, route: CompiledRoute, scope: Scope, ex: _Exchange
) -> Ticket | Refusal:
    # The priority and overload stage: the request's class (route, or the trusted
    # priority header), its attempt number (Retry-Attempt and the peers' headers)
    # and its client rank it in the upstream's line (server/_overload.py).
    assert route.classify is not None
    view = ScopeView(scope)
    priority = route.classify(view, scope["path"])
    return await control.aenter(priority, attempt_from(view.header), ex.client or None)


async def _guarded(
    rt: Runtime,
    pool: UpstreamPool,
    scope: Scope,
    receive: Receive,
    send: Send,
    ex: _Exchange,
    body: bytes | _Stream | None,
) -> bool:
    # The upstream guard (breaker, bulkhead), then the attempts; False: the guard
    # refused (answered), nothing went upstream.
    admission = await _admit(pool, send, ex)
    if admission is None:
        return False
    task = asyncio.current_task()
    assert task is not None

    def client_gone() -> None:
        if not ex.done:
            ex.gone = True
            task.cancel()

    # Our own server tells us of a disconnect (once the body is read); under another
    # ASGI server, requests that last past WATCH_AFTER get a watcher task.
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
        await _attempts(rt, pool, admission, scope, send, ex, body)
    except asyncio.CancelledError:
        if not ex.gone:
            raise
        ex.outcome, ex.status = "client_gone", 499
        task.uncancel()
    finally:
        if cycle is not None:
            cycle.on_lost = None
        if timer is not None:
            timer.cancel()
        if watcher:
            watcher[0].cancel()
        pool.done(admission)  # the gauge follows within a refresh (Gateway._refresh)
    return True


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


async def _body_failed(exc: Exception, send: Send, ex: _Exchange) -> None:
    if isinstance(exc, _TooLarge):
        await _refuse(send, ex, Refusal.of(413, "request body too large", reason="too_large"))
    elif isinstance(exc, _BodyTimeout):
        msg = "request body not received in time"
        await send_refusal(
            send, Refusal.of(408, msg, reason="body_timeout", headers=[("Connection", "close")])
        )
        ex.outcome, ex.status = "body_timeout", 408
    else:
        ex.outcome, ex.status = "client_gone", 499


async def _attempts(
    rt: Runtime,
    pool: UpstreamPool,
    admission: Held,
    scope: Scope,
    send: Send,
    ex: _Exchange,
    body: bytes | _Stream | None,
) -> None:
    # The upstream attempts, run by the retry conversation (_retries.py): this
    # function makes one attempt and answers with how the conversation ended.
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
        target = pool.pick(avoid=picked[0] if picked else None)
        picked[:] = (target,)
        sent = time.perf_counter()
        try:
            response = await client.request(
                target.base, method, target_path, numbered(headers, number), body
            )
        except (UpstreamError, TimeoutError) as exc:
            if isinstance(body, _Stream) and body.error is not None:
                raise _BodyFailed(body.error) from exc  # the client's fault, not the upstream's
            rt.metrics.upstream_failed(pool.name, exc)
            pool.report(target, True)
            never_sent = isinstance(exc, UpstreamConnectError)
            return error_outcome(exc, never_sent, method, keyed)
        rt.metrics.observe_latency(pool.name, time.perf_counter() - sent, response.status)
        pool.report(target, response.status >= 500)
        return response_outcome(policy, response, method, keyed, rt.clock)

    try:
        finish = await drive(policy, admission.permit, attempt, discard, rt.clock)
    except BaseException as exc:
        while dropped:
            dropped.pop().release()
        if not isinstance(exc, _BodyFailed):
            raise
        await _body_failed(exc.cause, send, ex)
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
        await _refuse(
            send,
            ex,
            Refusal.of(
                504,
                f"upstream {pool.name!r} timed out",
                reason="upstream_timeout",
                headers=headers_out,
            ),
        )
    else:
        ex.status, ex.outcome = 502, "upstream_error"
        await send_refusal(
            send,
            Refusal.of(
                502,
                f"upstream {pool.name!r} unreachable",
                reason="upstream_error",
                headers=headers_out,
            ),
        )


class _BodyFailed(Exception):
    """The client's streamed body failed during an attempt (why: ``cause``)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(cause)
        self.cause = cause


async def _relay(
    response: H1Response, send: Send, ex: _Exchange, method: str, gave_up: bool = False
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
        if method == "HEAD" or (length is not None and length <= _BUFFER):
            data = b"" if method == "HEAD" else await response.read()
            started = True
            await send(start)
            ex.done = True
            await send({"type": "http.response.body", "body": data})
            return
        # The head goes out with the first body bytes (as on the callback path): an
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
