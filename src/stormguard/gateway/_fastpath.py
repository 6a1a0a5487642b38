# The proxy leg's callback path: the common request served without a task.
#
# Most gateway traffic is a bodyless request (GET, HEAD, DELETE, OPTIONS) on a
# route with plain limits, to an upstream that has an idle keep-alive connection.
# For those, everything but the two network hops is synchronous -- limits on the
# MemoryStore, the breaker and the bulkhead of this process -- so the request is
# decided in the server's parser callback, written to the upstream connection
# there, and answered from the upstream parser's callbacks (_h1client.Sink). No
# task, no coroutine, no ASGI message per request: on a loaded two-core box this
# is most of the gateway's per-request cost (bench/bench_gateway.py).
#
# The rules are the proxy leg's (_proxy.py), called, not copied: route_of,
# identify, limit_refusal, the pool's enter (its lock-free gate) or admit_now,
# request/response_headers, account. A request
# that is anything else -- a body, a WebSocket, an idempotent or shaped route,
# Concurrency limits, retries, overload control, a store that must be awaited, no idle connection,
# a breaker or bulkhead that refuses or would make it wait -- is handed to the
# ASGI path (handle_http) *before* anything was taken, so it is decided there once.
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .._errors import CircuitOpen
from ..protection._permit import Permit
from ..server._refusal import Refusal, unavailable
from ..server._view import ScopeView
from ._clients import client_id
from ._h1client import H1Response, UpstreamConnectError, UpstreamError
from ._proxy import _BODYLESS, _BUFFER, _Exchange, account, limit_refusal
from ._retries import stale_resend
from ._runtime import CLIENT_KEY, CompiledRoute, Runtime
from ._upstream import Held, Holder, Target, UpstreamPool
from ._wire import patched_block, request_headers, response_head

__all__ = ["begin"]

log = logging.getLogger("stormguard.gateway")
# Reports to a shared breaker on their way to the store (kept until done).
_REPORTS: set[asyncio.Task[None]] = set()

_NO_BODY_STATUS = (204, 304)
# Host header -> the host name routes match (lower-cased, port cut): a few hosts
# arrive again and again. Bounded: cleared when full.
_HOSTNAMES: dict[bytes, str] = {}
_MAX_HOSTNAMES = 1024


# How a route's bodyless requests are served (CompiledRoute.callback, decided once):
# in the parser's callbacks (NOW: everything it decides is in this process), after
# one task awaits its limits and admission (AWAIT: a store or a shared breaker to
# ask, then the same callbacks), or by the ASGI path (ASGI: idempotency, shaping,
# Concurrency limits, retries).
NOW, AWAIT, ASGI = 1, 2, 0


def _mode(route: CompiledRoute) -> int:
    pool = route.upstream
    rules = route.rules
    if (
        route.config.idempotency != "off"
        or route.delay is not None
        or route.leased
        or pool.attempts != 1
        or pool.overload is not None  # the priority and overload stage may make it wait
    ):
        return ASGI
    return NOW if (rules is None or rules.in_memory) and not pool._shared else AWAIT


def begin(rt: Runtime, proto: Any, scope: dict[str, Any], keep_alive: bool) -> FastExchange | None:
    """Serve the request of ``scope`` on the callback path; None: take the ASGI path."""
    method = scope["method"]
    if method not in _BODYLESS:
        return None
    host = None
    for name, value in scope["headers"]:
        if name == b"host":
            host = value
        elif (name == b"content-length" and value != b"0") or name == b"transfer-encoding":
            return None
    hostname = None
    if host:
        hostname = _HOSTNAMES.get(host)
        if hostname is None:
            hostname = host.decode("latin-1").rsplit(":", 1)[0].lower()
            if len(_HOSTNAMES) >= _MAX_HOSTNAMES:
                _HOSTNAMES.clear()
            _HOSTNAMES[host] = hostname
    route = rt.match(scope["path"], method, hostname)
    if route is None:
        return None
    mode = route.callback
    if mode is None:  # the route's settings decide it once
        mode = route.callback = _mode(route)
    if mode == ASGI:
        return None
    pool = route.upstream
    view: ScopeView | None = None  # the request as the rules read it, made when asked
    identity = rt.identity
    known = proto.client_known  # (identity, rule, key, client id, token) of this connection
    # issue 24: clients named by headers are named again only when those headers change
    token = identity.token(scope["headers"]) if identity.header_names is not None else None
    steady = known is not None and known[0] is identity and known[4] == token
    if steady:
        _, rule, key, client, _ = known
    else:
        view = identity.view(scope, token)
        rule, key = identity.identify(view)
        # The key's loggable name (a SHA-256) only where it is needed now; else "" and
        # named when counted or logged (issue 24: not per request for 100k clients).
        client = client_id(key) if mode == AWAIT else ""
        # The same client on every request of the connection, when only its address
        # can name it: named once; by headers, until they change.
        cached = identity.per_connection or token is not None
        proto.client_known = (identity, rule, key, client, token) if cached else None
        proto.limits_known = None
    if mode == AWAIT:
        scope[CLIENT_KEY] = key
        exchange = FastExchange(  # admitted by the task, later
            proto, scope, keep_alive, rt, route, pool, None, None, time.perf_counter(), None
        )
        exchange.client, exchange.rule = client, rule
        # fleet (issue 25): the limits join the store's next batch now, from the parser
        # callback (RuleSet.submit); the task below only awaits the answer.
        view = view or ScopeView(scope)
        rules = route.rules
        decided = rules.submit(view, method, scope["path"], quiet=True) if rules else None
        # (the protocol's loop: on Python 3.11 get_running_loop() is a getpid() syscall)
        exchange.waiting = proto.loop.create_task(exchange.admit_then_send(decided))
        return exchange
    ready = pool.pick_ready()
    if ready is None:
        return None
    target, conn, turn = ready
    held: Held | None = None
    ticket = pool.enter()
    if ticket is None:  # the lock-free gate cannot say: the pool's own methods
        try:
            admitted = pool.admit_now(client or client_id(key))
        except CircuitOpen:
            admitted = None
        if not isinstance(admitted, Held):  # refused or would wait: the ASGI path decides
            pool.client.idle(conn)
            pool.turn = turn
            return None
        held = admitted
    started = time.perf_counter()
    scope[CLIENT_KEY] = key
    exchange = FastExchange(
        proto, scope, keep_alive, rt, route, pool, held, target, started, ticket
    )
    exchange.client, exchange.rule = client, rule
    rules = route.rules
    if rules is not None:
        # A connection's one client meets the same limit keys on every request
        # (a route's limits are per client or global): found once per route, and
        # decided by the store's group hitter for them (RuleSet.refusal_hitter).
        cached = proto.limits_known
        if steady and cached is not None and cached[0] is rules:
            decision = cached[1]()
        else:
            view = view or ScopeView(scope)
            limits = rules.plain_limits(view)
            if limits is None:
                decision = rules.refusal(view, method, scope["path"])
            elif steady or identity.per_connection:  # this client, from now on (by headers:
                # once it came twice, not for a connection whose every request is another)
                refusal = rules.refusal_hitter(limits)
                proto.limits_known = (rules, refusal)
                decision = refusal()
            else:
                decision = rules.refusal_of(limits)
        if decision is not None:
            pool.client.idle(conn)
            pool.turn = turn
            exchange.refuse(limit_refusal(route, decision))
            return exchange
    exchange.send(conn)
    return exchange


class _NoEvent:
    """The callback path's stand-in for the cycle's asyncio.Event (nobody waits on it)."""

    __slots__ = ()
    # A no-op in C (the listener calls it when the client goes away): set() -> None.
    set = object.__init__


_NO_EVENT = _NoEvent()


class FastExchange(_Exchange):
    """One request on the callback path: the connection's cycle, the upstream's sink
    and the request's bookkeeping (:class:`_Exchange`) in one object.

    The listener (http/_listener.py) sees it as the connection's cycle (``response_complete``,
    ``disconnected``, ``keep_alive``, ``more_body``, ``body``, ``message_event``);
    the answer goes straight to the client's transport: its head is rendered in one
    pass from the upstream's raw headers (:func:`_wire.response_head`) and written
    with the body -- one write for a small answer. The request to the upstream and
    a small answer go out with the rest of the loop pass's (the listener's outbox,
    _outbox.py); a streamed body goes out at once.
    """

    message_event = _NO_EVENT  # the listener calls its set(); nobody waits on it
    __slots__ = (
        "admitted",
        "body",
        "chunked",
        "disconnected",
        "finished",
        "head",
        "held",
        "keep_alive",
        "method",
        "more_body",
        "on_lost",
        "pending",
        "permit",
        "pool",
        "proto",
        "request",
        "resend",
        "response",
        "response_complete",
        "route",
        "rt",
        "scope",
        "sent",
        "started",
        "target",
        "ticket",
        "waiting",
        "whole",
    )

    def __init__(
        self,
        proto: Any,
        scope: dict[str, Any],
        keep_alive: bool,
        rt: Runtime,
        route: CompiledRoute,
        pool: UpstreamPool,
        held: Held | None,
        target: Target | None,
        started: float,
        ticket: Any,
    ) -> None:
        # _Exchange's fields, set here (one frame less per request)
        self.outcome, self.status, self.client, self.rule, self.upstream = "allowed", 0, "", "", ""
        self.gone = self.done = False
        self.proto, self.scope, self.keep_alive = proto, scope, keep_alive
        self.method = scope["method"]
        self.rt, self.route, self.pool = rt, route, pool
        # What the request holds of the upstream: the Held the pool's methods gave,
        # else (None) the exchange holds it itself (a Holder): the ticket of the
        # pool's lock-free gate (UpstreamPool.enter), and the bulkhead slot.
        self.held = held
        self.ticket = ticket
        self.admitted = ticket is not None
        self.permit: Permit | None = None
        self.target: Any = target  # a Target once one is picked (the awaited path: later)
        self.started = started
        self.sent = 0.0
        self.response_complete = self.disconnected = False
        self.more_body = False
        self.body = b""
        self.response: H1Response | None = None
        self.request: tuple[str, bytes, bytes] = ("GET", b"/", b"")  # method, target, lines
        self.resend: asyncio.Task[None] | None = None  # the one resend, if it came to that
        self.head = b""  # the answer's head, until it goes out with the first body bytes
        self.whole = False  # the answer is small: its body goes out in one write
        self.chunked = False  # the answer's body is framed here (its length is unknown)
        self.pending: list[bytes] = []
        self.on_lost: Any = self.lost
        self.waiting: asyncio.Task[None] | None = None  # the awaited path's task
        self.finished = False

    # -- the request, to the upstream connection -----------------------------------------

    def send(self, conn: Any) -> None:
        """Send the request on ``conn`` (idle, to ``self.target``); its answer comes
        back through the sink methods below."""
        pool, scope, proto, method = self.pool, self.scope, self.proto, self.method
        self.upstream = pool.name
        # The header lines depend on the request's headers, the connection's peer
        # and scheme, and the identity rules (a trusted proxy's X-Forwarded-For):
        # a connection sending the same headers again sends the lines kept from
        # its last request (one kept per connection; a reload brings new rules).
        raw = scope["headers"]
        identity = self.rt.identity
        kept = proto.header_block
        if kept is not None and kept[1] is identity and kept[2] == method and kept[0] == raw:
            block = kept[3]
        else:
            block = None
            if kept is not None and kept[1] is identity and kept[2] == method:
                block = patched_block(kept[0], kept[3], raw)  # one value changed (issue 24)
            if block is None:
                headers = request_headers(scope, identity.trusted_peer(ScopeView(scope)))
                block = pool.client.header_block(method, headers)
            proto.header_block = (raw, identity, method, block)
        path = scope["raw_path"]
        query = scope["query_string"]
        self.sent = time.perf_counter()
        self.request = (method, path + b"?" + query if query else path, block)
        self.response = pool.client.send_now(conn, *self.request, self, proto.outbox)

    async def admit_then_send(self, decided: Any) -> None:
        """The awaited path (AWAIT): the route's limits, then the upstream's breaker
        and bulkhead, as the ASGI path decides them; then :meth:`send`. A client that
        went away meanwhile is seen after each await (what was taken is given back);
        the task is never cancelled, so nothing taken is lost to a cancellation."""
        route, pool = self.route, self.pool
        try:
            if decided is not None:  # fleet (issue 25): the answer of RuleSet.submit
                decision = await decided
                if self.client_left():
                    return
                if decision is not None and not decision.allowed:
                    self.refuse(limit_refusal(route, decision))
                    return
            try:
                held = pool.admit_now(self.client)
                if held is None:
                    held = await pool.admit(self.client)
            except CircuitOpen as exc:
                if not self.client_left():
                    detail = f"upstream {pool.name!r} is failing; its circuit is open"
                    self.refuse(unavailable(exc.remaining, "breaker_open", detail))
                return
            if isinstance(held, Refusal):
                if not self.client_left():
                    self.refuse(held)
                return
            self.held = held
            if self.client_left():  # gone while admitted: give it all back
                self._report(None)
                pool.done(held)
                return
            target = self.target = pool.pick()
            client = pool.client
            conn = client.take_idle(target.base)
            if conn is None:
                try:
                    conn = await client.acquire(target.base)
                except (UpstreamError, TimeoutError) as exc:
                    self.answer_error(exc)
                    return
                if self.client_left():
                    client.idle(conn)
                    return
            self.send(conn)
        except Exception:  # a bug must not leave the client without an answer
            log.exception("gateway error on %s %s", self.method, self.scope["path"])
            if self.status == 0 and not self.client_left():
                self.refuse(Refusal.of(502, "gateway error", reason="gateway_error"))
        finally:
            self.waiting = None

    def client_left(self) -> bool:
        """Whether the client went away (read afresh after each await)."""
        return self.disconnected

    # -- the answer, from the upstream connection ---------------------------------------

    def answer_head(self, response: H1Response) -> None:
        self.rt.metrics.observe_latency(
            self.pool.name, time.perf_counter() - self.sent, response.status
        )
        status = response.status
        failed = status >= 500
        pool, target = self.pool, self.target
        if failed or target.failures:  # (a success after successes changes nothing)
            pool.report(target, failed)
        if self.ticket is not None and self.held is None:  # the pool's lock-free gate
            pool.settle(self, failed)
        else:
            self._report(failed)
        self.status = status
        length = response.content_length
        bodiless = self.method == "HEAD" or status in _NO_BODY_STATUS
        chunked = self.chunked = length is None and not bodiless
        self.whole = length is not None and length <= _BUFFER
        # The head is a function of these alone: a connection whose upstream
        # answers alike again (its Date changes once a second) sends the head kept
        # from its last answer (one kept per connection).
        proto = self.proto
        raw = response.raw_headers
        default = proto.server_state.default_headers
        kept = proto.answer_head
        if (
            kept is not None
            and kept[0] == status
            and kept[2] is default
            and kept[3] == (self.keep_alive, chunked)
            and kept[1] == raw
        ):
            self.head = kept[4]
        else:
            self.head = head = response_head(status, raw, default, self.keep_alive, chunked)
            proto.answer_head = (status, raw, default, (self.keep_alive, chunked), head)

    def answer_body(self, chunk: bytes) -> None:
        if self.whole:
            self.pending.append(chunk)
            return
        if self.method == "HEAD" or not chunk:
            return
        self._write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if self.chunked else chunk)
        if self.proto.flow.write_paused and self.response is not None:
            conn = self.response._conn
            if conn is not None:
                conn.pause()  # the client reads slower than the upstream writes

    def answer_end(self) -> None:
        self.done = True
        pending = self.pending
        body = (pending[0] if len(pending) == 1 else b"".join(pending)) if pending else b""
        if self.method == "HEAD":
            body = b""
        if self.chunked:
            body += b"0\r\n\r\n"
        self._end(body)

    def _write(self, data: bytes) -> None:
        # A streamed body's bytes, at once, so that the client's back-pressure is
        # seen as they go (answer_body); the head goes out with the first of them
        # (one write, one segment).
        if self.disconnected:
            return
        head = self.head
        if head:
            self.head = b""
            data = head + data
        if data:
            proto = self.proto
            proto.outbox.flush()  # what the pass wrote before goes first
            proto.transport.write(data)

    def _end(self, body: bytes) -> None:
        # The answer's last bytes (with its head, if it is still held) go out with
        # the pass's other writes; what the ASGI cycle does at its last body
        # message, then the books.
        if not self.disconnected:
            head = self.head
            if head:
                self.head = b""
                body = head + body
            self.response_complete = True
            proto = self.proto
            outbox = proto.outbox
            if self.keep_alive:
                if body:
                    outbox.write(proto.transport, body)
            else:  # written and closed now, in order
                outbox.flush()
                if body:
                    proto.transport.write(body)
                proto.transport.close()
            proto.on_response_complete()
        self.finish()

    def answer_error(self, exc: BaseException) -> None:
        response = self.response
        conn = response._conn if response is not None else None
        stale = conn is not None and not conn.received and not isinstance(exc, TimeoutError)
        if stale and self.resend is None and stale_resend(self.method, self.keyed()):
            # The idle connection was closed by the upstream as we wrote (its
            # keep-alive ran out): nothing came back. The decision table's row for
            # a request that may have been processed decides (_retries.stale_resend;
            # every method here is idempotent): send it once more, on a new
            # connection (as H1Pool.request).
            self.response = None
            self.resend = self.proto.loop.create_task(self._resend())
            return
        if self.status == 0 or self.head:  # nothing went out yet: a refusal can
            if self.status == 0:  # (else the head was counted by answer_head)
                self.rt.metrics.upstream_failed(self.pool.name, exc)
                self.pool.report(self.target, True)
                self._report(True)
            self.head, self.pending, self.chunked, self.whole = b"", [], False, False
            name = self.pool.name
            if isinstance(exc, TimeoutError) and not isinstance(exc, UpstreamConnectError):
                refusal = Refusal.of(504, f"upstream {name!r} timed out", reason="upstream_timeout")
            else:
                refusal = Refusal.of(502, f"upstream {name!r} unreachable", reason="upstream_error")
            self.refuse(refusal)
            return
        # The status line was decided: the answer can only be cut.
        self.outcome = "upstream_timeout" if isinstance(exc, TimeoutError) else "upstream_error"
        self.proto.outbox.flush()
        self.proto.transport.close()
        self.finish()

    def keyed(self) -> bool:
        """Whether the request carries an Idempotency-Key."""
        return any(pair[0] == b"idempotency-key" for pair in self.scope["headers"])

    async def _resend(self) -> None:
        client = self.pool.client
        try:
            conn = await client.connect_to(self.target.base)
        except (UpstreamError, TimeoutError) as exc:
            self.answer_error(exc)
            return
        if not (self.held or self).admitted:  # the client went away meanwhile
            client.idle(conn)
            return
        self.response = client.send_now(conn, *self.request, self, self.proto.outbox)

    def resumed(self) -> None:
        """The client's socket drained: read the upstream again."""
        if self.response is not None and self.response._conn is not None:
            self.response._conn.resume()

    # -- the client ---------------------------------------------------------------------

    def lost(self) -> None:
        """The client went away before the answer was complete."""
        response, self.response = self.response, None
        if response is not None:
            response.sink = None
            response.release()  # an unfinished answer closes its connection
        self._report(None)
        self.outcome, self.status = "client_gone", 499
        self.finish()

    def refuse(self, refusal: Refusal) -> None:
        """Answer with ``refusal`` (the request did not reach the upstream)."""
        self.status, self.outcome = refusal.status, refusal.reason
        self.done = True
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in refusal.headers]
        headers.append((b"content-length", b"%d" % len(refusal.body)))
        self._report(None)
        self.head = response_head(
            refusal.status,
            headers,
            self.proto.server_state.default_headers,
            self.keep_alive,
            False,
            via=False,
        )
        self._end(b"" if self.method == "HEAD" else refusal.body)

    def _report(self, failure: bool | None) -> None:
        """Tell the breaker how the call went (None: it never reached the upstream),
        once. A permit of a shared breaker reports to the store: in a task, which the
        answer does not wait for."""
        held: Holder = self.held or self
        if held.ticket is not None:  # admitted by the pool's lock-free gate
            self.pool.settle(held, failure)
            return
        permit = held.permit
        if permit is None:
            return
        held.permit = None
        if permit.remote:
            report = permit.arelease() if failure is None else permit.arecord(failure=failure)
            task = self.proto.loop.create_task(report)
            _REPORTS.add(task)
            task.add_done_callback(_REPORTS.discard)
        elif failure is None:
            permit.release()
        else:
            permit.record(failure=failure)

    def finish(self) -> None:
        # Also breaks the exchange's reference cycles (answer <-> sink, on_lost ->
        # self), so that it is freed at once rather than by the cyclic collector.
        self.on_lost = None
        self.response = None
        if not self.finished:
            self.finished = True
            held: Holder = self.held or self
            if held.admitted:
                self.pool.done(held)
            account(self.rt, self.route, self.scope, self, self.started)
