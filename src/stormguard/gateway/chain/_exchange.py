# One request through the chain: its state (what the stages found), its
# bookkeeping (metrics and the access log) and its answer. A request the listener
# hands over with its head (bodyless, not pipelined) is a *direct* exchange: it is
# the connection's cycle for the listener (``response_complete``, ``disconnected``,
# ``on_lost``, ``message_event``, ``keep_alive``, ``resumed``), its answer is
# written to the client's transport from the upstream parser's callbacks (the
# exchange is the upstream's _h1client.Sink), its head rendered in one pass from
# the upstream's raw headers (_wire.response_head). A request with a body, or one
# a stage needs to read through ASGI (idempotency, retries, Concurrency limits),
# runs on the *ASGI leg*: ``send``/``receive`` are set and the answer goes out
# as ASGI messages (chain/_asgi.py) through the listener's Cycle.
from __future__ import annotations

import asyncio
import logging
from functools import partial
from time import perf_counter
from typing import Any

from ...protection._permit import Permit
from ...server._refusal import Refusal, send_refusal
from ...server._view import ScopeView
from .._h1client import H1Response, UpstreamConnectError, UpstreamError
from .._retries import stale_resend
from .._runtime import CompiledRoute, Runtime
from .._upstream import Held, Holder, UpstreamPool
from .._wire import (
    DISCONNECT,
    block_patch,
    changed_only_at,
    patched,
    request_headers,
    response_head,
)
from ..http._cycle import Cycle
from ._books import BUFFER, account
from ._driver import arun, resumed, run

__all__ = ["Exchange", "serve"]

log = logging.getLogger("stormguard.gateway")
# Reports to a shared breaker on their way to the store (kept until done).
_REPORTS: set[asyncio.Task[None]] = set()
_NO_BODY_STATUS = (204, 304)


class _NoEvent:
    """A direct exchange's stand-in for the cycle's asyncio.Event (nobody waits on it)."""

    __slots__ = ()
    # A no-op in C (the listener calls it when the client goes away): set() -> None.
    set = object.__init__


_NO_EVENT = _NoEvent()

# Exchange.__init__'s starting values, in its order.
_FRESH: tuple[Any, ...] = (
    *("allowed", 0, "", "", ""),  # outcome, status, client, rule, upstream
    *(False, False, 0),  # gone, done, at
    *(None, None, None, None),  # route, pool, key, view
    *(False, None, False),  # steady, decision, reached
    *(None, None, False, None, None),  # held, ticket, admitted, permit, target
    *(0.0, False, False, False, b"", None),  # sent ... body, response
    *(("GET", b"/", b""), None, b"", False, False),  # request, resend, head, whole, chunked
    *(None, False),  # waiting, finished
    *(None, None, None),  # receive, send, cycle
)


class Exchange:
    """One request: the stages' findings, the books, and the answer (module comment)."""

    message_event = _NO_EVENT  # the listener calls its set(); nobody waits on it
    __slots__ = (
        "admitted",
        "at",
        "body",
        "chunked",
        "client",
        "cycle",
        "decision",
        "disconnected",
        "done",
        "finished",
        "gone",
        "head",
        "held",
        "host",
        "keep_alive",
        "key",
        "late",
        "method",
        "more_body",
        "on_lost",
        "outcome",
        "pending",
        "permit",
        "pool",
        "proto",
        "reached",
        "receive",
        "request",
        "resend",
        "response",
        "response_complete",
        "route",
        "rt",
        "rule",
        "scope",
        "send",
        "sent",
        "stages",
        "started",
        "status",
        "steady",
        "target",
        "ticket",
        "upstream",
        "view",
        "waiting",
        "whole",
    )
    # (the types of the fields __init__ sets from _FRESH)
    outcome: str
    client: str
    rule: str
    upstream: str
    status: int
    at: int
    sent: float
    head: bytes
    body: bytes
    gone: bool
    done: bool
    steady: bool
    reached: bool
    admitted: bool
    response_complete: bool
    disconnected: bool
    more_body: bool
    whole: bool
    chunked: bool
    finished: bool
    route: CompiledRoute
    pool: UpstreamPool
    held: Held | None
    permit: Permit | None
    response: H1Response | None
    request: tuple[str, bytes, bytes]
    resend: asyncio.Task[None] | None
    waiting: asyncio.Task[None] | None

    def __init__(
        self,
        proto: Any,
        scope: dict[str, Any],
        keep_alive: bool,
        rt: Runtime,
        host: bytes | None,
        stages: tuple[Any, ...],
    ) -> None:
        self.proto, self.scope, self.keep_alive = proto, scope, keep_alive
        self.method = scope["method"]
        self.rt, self.host, self.stages = rt, host, stages
        self.started = perf_counter()
        self.pending: list[bytes] = []
        self.on_lost: Any = self.lost
        # The rest start alike on every request: one tuple, unpacked.
        (
            self.outcome,
            self.status,
            self.client,
            self.rule,
            self.upstream,
            self.gone,
            self.done,
            self.at,  # the stage waiting on a future
            self.route,  # (the route stage's)
            self.pool,
            self.key,
            self.view,  # the request as the rules read it, made when asked
            self.steady,  # the connection's client, known from its last request
            self.decision,  # a Concurrency limit's decision (its lease)
            self.reached,  # the ASGI leg's attempts went to the upstream
            # What the request holds of the upstream: the Held the pool's methods
            # gave, else (None) the exchange holds it itself (a Holder): the ticket
            # of the pool's lock-free gate (UpstreamPool.enter), and the bulkhead slot.
            self.held,
            self.ticket,
            self.admitted,
            self.permit,
            self.target,
            self.sent,
            self.response_complete,
            self.disconnected,
            self.more_body,
            self.body,
            self.response,
            self.request,  # method, target, lines
            self.resend,  # the one resend, if it came to that
            self.head,  # the answer's head, until it goes out with the first body bytes
            self.whole,  # the answer is small: its body goes out in one write
            self.chunked,  # the answer's body is framed here (its length is unknown)
            self.waiting,  # a stage's coroutine, running
            self.finished,
            # The ASGI leg (None on a direct exchange).
            self.receive,
            self.send,
            self.cycle,
        ) = _FRESH

    # -- the drivers' hooks -----------------------------------------------------------

    def on_result(self, future: Any) -> None:
        """The future stage ``at`` waited on is done (its done-callback)."""
        try:
            result = future.result()
        except Exception:
            self.fail()
            return
        resumed(self, result)

    def run_from(self, i: int) -> None:
        """Driver 2's start: the chain from stage ``i`` (a loop callback), unless the
        client went away meanwhile (then nothing was taken)."""
        if not self.disconnected:
            run(self, i)

    def to_cycle(self, i: int) -> None:
        """Stage ``i`` must read through ASGI: the listener's Cycle takes the request
        over (in a task) and the chain goes on there from that stage (at its place
        in the route's whole tuple: a direct exchange runs ``route.direct``)."""
        stages = self.route.stages
        i = stages.index(self.stages[i])
        self.stages = stages
        proto = self.proto
        cycle = Cycle(proto, self.scope, self.keep_alive, False)
        cycle.more_body = False  # a direct exchange's request has no body
        self.scope[DISCONNECT] = cycle
        self.cycle, self.on_lost = cycle, None
        if proto.cycle is self:
            proto.cycle = cycle
        cycle.start(partial(_on_cycle, self, i))

    def fail(self) -> None:
        """A stage raised: log it and answer 502 if nothing went out yet."""
        log.exception("gateway error on %s %s", self.method, self.scope["path"])
        if self.send is None and self.status == 0 and not self.disconnected:
            self.refuse(Refusal.of(502, "gateway error", reason="gateway_error"))

    def client_left(self) -> bool:
        """Whether the client of a direct exchange went away (read after each wait)."""
        return self.disconnected

    async def arefuse(self, refusal: Refusal) -> None:
        """Answer ``refusal`` on the ASGI leg."""
        self.status, self.outcome = refusal.status, refusal.reason
        await send_refusal(self.send, refusal)

    # -- the request, to the upstream connection -----------------------------------------

    def send_to(self, conn: Any) -> None:
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
        kept = proto.header_block  # (raw, identity, method, block, patch)
        if kept is not None and kept[1] is identity and kept[2] == method and kept[0] == raw:
            block = kept[3]
        else:
            block = patch = None
            if kept is not None and kept[1] is identity and kept[2] == method:
                # Values changed (issue 24: a client key; a request id, a trace
                # context): the lines patched; where the same ones changed as last
                # time, at the places found then (_wire.block_patch).
                patch = kept[4]
                if patch is None or not changed_only_at(kept[0], raw, patch[0]):
                    patch = block_patch(kept[0], kept[3], raw)
                if patch is not None:
                    _, pieces, slots = patch
                    if len(slots) == 1:  # (one value: _wire.patched, inline)
                        block = pieces[0] + raw[slots[0]][1] + pieces[1]
                    else:
                        block = patched(patch, raw)
            if block is None:
                headers = request_headers(scope, identity.trusted_peer(ScopeView(scope)))
                block = pool.client.header_block(method, headers)
            proto.header_block = (raw, identity, method, block, patch)
        path = scope["raw_path"]
        query = scope["query_string"]
        self.sent = perf_counter()
        target = path + b"?" + query if query else path
        self.request = (method, target, block)
        self.response = pool.client.send_now(conn, method, target, block, self, proto.outbox)

    # -- the answer, from the upstream connection ---------------------------------------

    def answer_head(self, response: H1Response) -> None:
        self.rt.metrics.observe_latency(self.pool.name, perf_counter() - self.sent, response.status)
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
        self.whole = length is not None and length <= BUFFER
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
        # the pass's other writes; then the books.
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
        """Answer ``refusal`` (the request did not reach the upstream)."""
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
            if held.admitted and self.pool is not None:
                self.pool.done(held)
            account(self.rt, self.route, self.scope, self, self.started)


async def _on_cycle(ex: Exchange, i: int, scope: Any, receive: Any, send: Any) -> None:
    # The ASGI app a handed-over exchange's Cycle runs: the chain from stage i.
    ex.receive, ex.send = receive, send
    await serve(ex, i)


async def serve(ex: Exchange, i: int) -> None:
    """The chain from stage ``i`` on the ASGI leg, with its books at the end."""
    from ._asgi import release_leases

    try:
        await arun(ex, i)
    except Exception:  # a bug must not take the connection down without an answer
        log.exception("gateway error on %s %s", ex.method, ex.scope["path"])
        if ex.status == 0:
            ex.outcome = "gateway_error"
            await ex.arefuse(Refusal.of(502, "gateway error", reason="gateway_error"))
    finally:
        if ex.decision is not None:
            await release_leases(ex)
        ex.finished = True
        account(ex.rt, ex.route, ex.scope, ex, ex.started)
