# The chain's stages, in order: route -> client key -> body cap -> limits
# (+ shaping) -> idempotency -> [priority and overload control] -> upstream guard
# (breaker + bulkhead) -> upstream attempts -> answer. Each is one stateless object
# for every request; a compiled route's tuple (stages_of) holds the ones that
# apply to it, built once (priority and overload control: when the route's
# upstream has it). The answer is the exchange's (refuse, the upstream sink, or
# the ASGI relay of _asgi.py): the chain ends where it starts.
#
# A stage decides with what is in this process when it can (a MemoryStore's
# limits, the pool's lock-free gate, an idle upstream connection) and says *wait*
# otherwise: a store's Pending (resumed from its callback), or a coroutine (the
# bulkhead's queue, a shared breaker, a connect, shaping's sleep). A stage that
# must read the request through ASGI (idempotency's claim, overload control's
# line, retries, a Concurrency limit's lease) says NEEDS_CYCLE on a direct
# exchange, before it takes anything.
from __future__ import annotations

from typing import Any

from ..._errors import CircuitOpen
from ...server._plan import NOTHING
from ...server._refusal import Refusal, unavailable
from ...server._view import ScopeView
from .._clients import client_id
from .._h1client import UpstreamError
from .._runtime import CLIENT_KEY, CompiledRoute
from . import _asgi
from ._books import limit_refusal
from ._driver import DONE, NEEDS_CYCLE, Stage

__all__ = [
    "ATTEMPTS",
    "BODY_CAP",
    "CLIENT",
    "ENTRY",
    "GUARD",
    "IDEMPOTENCY",
    "LEASED_LIMITS",
    "LIMITS",
    "OVERLOAD",
    "RETRIES",
    "ROUTE",
    "STORE_LIMITS",
    "stages_of",
]

_NOT_FOUND = Refusal.of(404, "no route matches", reason="not_found")
# Host header -> the host name routes match (lower-cased, port cut): a few hosts
# arrive again and again. Bounded: cleared when full.
_HOSTNAMES: dict[bytes, str] = {}
_MAX_HOSTNAMES = 1024


class RouteStage(Stage):
    """The route of the request (prefix, method, host); 404 when none matches."""

    __slots__ = ()
    name = "route"

    def run(self, ex: Any) -> Any:
        host = ex.host
        hostname = None
        if host:
            hostname = _HOSTNAMES.get(host)
            if hostname is None:
                hostname = host.decode("latin-1").rsplit(":", 1)[0].lower()
                if len(_HOSTNAMES) >= _MAX_HOSTNAMES:
                    _HOSTNAMES.clear()
                _HOSTNAMES[host] = hostname
        route = ex.rt.match(ex.scope["path"], ex.method, hostname)
        if route is None:
            return _NOT_FOUND
        ex.route, ex.pool = route, route.upstream
        if not route.stages:
            stages_of(route)
        # a direct exchange runs the route's stages that can act on it (stages_of)
        ex.stages = route.direct if ex.send is None else route.stages
        return None


class ClientStage(Stage):
    """The client's key (the identity rules); a connection's client, kept."""

    __slots__ = ()
    name = "client key"

    def run(self, ex: Any) -> Any:
        scope, proto = ex.scope, ex.proto
        identity = ex.rt.identity
        # (identity, rule, key, client id, token, headers) of the connection's last
        # request, when its client is kept
        known: Any = proto.client_known if proto is not None else None
        raw = scope["headers"]
        token = None
        if known is not None and known[0] is identity:
            # issue 24: clients named by headers are named again only when those
            # headers change (the same headers as last time: the same token)
            names = identity.header_names
            if names is not None and known[5] != raw:
                token = identity.token(raw)
                steady = known[4] == token
            else:
                steady = True
        else:
            steady = False
            if identity.header_names is not None:
                token = identity.token(raw)
        if steady:
            ex.steady = True
            _, ex.rule, key, ex.client, _, _ = known
        else:
            # a header names the client: read off the token (issue 24: 100k clients)
            found = identity.from_token(token) if token is not None else None
            if found is None:
                view = ex.view = identity.view(scope, token)
                found = identity.identify(view)
            ex.rule, key = found
            # The key's loggable name (a SHA-256) only where it is needed (the
            # guard, the books): not per request for 100k clients (issue 24).
            if proto is not None:
                # The same client on every request of the connection, when only its
                # address can name it: named once; by headers, until they change.
                cached = identity.per_connection or token is not None
                proto.client_known = (identity, ex.rule, key, "", token, raw) if cached else None
                proto.limits_known = None
        ex.key = scope[CLIENT_KEY] = key
        return None


class BodyCapStage(Stage):
    """413 when the declared body is over the route's ``max_body`` (a body read
    later is held to the same cap as it arrives)."""

    __slots__ = ()
    name = "body cap"

    def run(self, ex: Any) -> Any:
        if ex.send is None:  # a direct exchange's request has no body
            return None
        length = None
        for name, value in ex.scope["headers"]:
            if name == b"content-length":
                length = int(value) if value.isdigit() else None
                break
        cap = ex.route.max_body
        if length is not None and length > cap:
            msg = f"request body of {length} bytes is over the {cap}-byte limit"
            return Refusal.of(413, msg, reason="too_large")
        return None


class LimitsStage(Stage):
    """The route's limits in one store call (429), shaping (hold at most ``delay``
    s); a MemoryStore's decided here and now. (A route whose limits are in another
    store, or hold a Concurrency lease, has the stage of its kind: stages_of.)"""

    __slots__ = ()
    name = "limits"

    def run(self, ex: Any) -> Any:
        rules = ex.route.rules
        # A connection's one client meets the same limit keys on every request
        # (a route's limits are per client or global): found once per route, and
        # decided by the store's group hitter for them (RuleSet.refusal_hitter).
        proto = ex.proto
        cached = proto.limits_known if proto is not None else None
        if ex.steady and cached is not None and cached[0] is rules:
            decision = cached[1]()
        elif ex.route.client_limits is not None and not (
            proto is not None and (ex.steady or ex.rt.identity.per_connection)
        ):
            # a client that is not kept (by headers, another on each request, as
            # 100k clients are): its limits by its key, no view, no key functions
            decision = ex.route.client_limits(ex.key)
        else:
            scope = ex.scope
            view = ex.view = ex.view or ScopeView(scope)
            limits = rules.plain_limits(view)
            if limits is None:
                decision = rules.refusal(view, ex.method, scope["path"])
            elif proto is not None and (ex.steady or ex.rt.identity.per_connection):
                # this client, from now on (by headers: once it came twice, not for
                # a connection whose every request is another)
                refusal = rules.refusal_hitter(limits)
                proto.limits_known = (rules, refusal)
                decision = refusal()
            else:
                decision = rules.refusal_of(limits)
        return None if decision is None else self.refused(ex, decision)

    def resume(self, ex: Any, result: Any) -> Any:
        if ex.client_left():
            return DONE
        if result is None or result.allowed:
            return None
        return self.refused(ex, result)

    @staticmethod
    def refused(ex: Any, decision: Any) -> Any:
        if ex.route.delay is not None:
            return _asgi.shaped(ex, decision)
        return limit_refusal(ex.route, decision)


class StoreLimitsStage(LimitsStage):
    """The limits stage of a route whose store is not a MemoryStore: its limits join
    the store's next batch (resumed from the Pending's callback, :meth:`resume`)."""

    __slots__ = ()

    def run(self, ex: Any) -> Any:
        # fleet (issue 25): the limits join the store's next batch now; the
        # chain goes on from the Pending's callback when the reply is in.
        rules = ex.route.rules
        # A connection's one client submits the same keys on every request: its
        # submitter is kept, as LimitsStage keeps its hitter (RuleSet.submitter).
        proto = ex.proto
        cached = proto.limits_known if proto is not None else None
        if ex.steady and cached is not None and cached[0] is rules:
            pending = cached[1]()
        else:
            scope = ex.scope
            view = ex.view = ex.view or ScopeView(scope)
            kept = None
            if proto is not None and (ex.steady or ex.rt.identity.per_connection):
                kept = rules.submitter(view)
            if kept is not None:
                proto.limits_known = (rules, kept)
                pending = kept()
            else:
                pending = rules.submit(view, ex.method, scope["path"], quiet=True)
        # admitted at once with nothing to say (approximate limits): go on
        return None if pending is NOTHING else pending


class LeasedLimitsStage(LimitsStage):
    """The limits stage of a route with a Concurrency limit: its lease is given back
    once answered, so the limits are decided on the ASGI leg."""

    __slots__ = ()

    def run(self, ex: Any) -> Any:
        if ex.send is None:
            return NEEDS_CYCLE
        return _asgi.leased_limits(ex)


class IdempotencyStage(Stage):
    """The server side's IdempotencyMiddleware around the rest of the chain."""

    __slots__ = ()
    name = "idempotency"

    def run(self, ex: Any) -> Any:
        if ex.send is None:
            return NEEDS_CYCLE
        return _asgi.idempotent(ex)


class OverloadStage(Stage):
    """Priority and overload control (shedding, the adaptive limit, admission
    control) of the upstream, around the rest of the chain: its wait and what the
    answer teaches the limit are on the ASGI leg."""

    __slots__ = ()
    name = "overload"

    def run(self, ex: Any) -> Any:
        if ex.send is None:
            return NEEDS_CYCLE
        return _asgi.overloaded(ex)


class GuardStage(Stage):
    """The upstream's breaker (503 while open) and bulkhead (503 when full)."""

    __slots__ = ()
    name = "upstream guard"

    def run(self, ex: Any) -> Any:
        pool = ex.pool
        if ex.send is None and pool.attempts == 1:
            ticket = pool.enter()  # the pool's lock-free gate
            if ticket is not None:
                ex.ticket, ex.admitted = ticket, True
                return None
        if ex.send is not None and _asgi.unread(ex):
            return self._read_first(ex)
        if not ex.client:
            ex.client = client_id(ex.key)
        try:
            held = pool.admit_now(ex.client)
        except CircuitOpen as exc:
            return _open(pool, exc)
        if held is None:
            return self._admit(ex)
        if held.__class__ is Refusal:
            return held
        ex.held = held
        return None

    async def _read_first(self, ex: Any) -> Any:
        # the small body whole before a slot is taken (_asgi.unread)
        if not await _asgi.prefetched(ex):
            return DONE
        return self.run(ex)

    @staticmethod
    async def _admit(ex: Any) -> Any:
        pool = ex.pool
        try:
            held = await pool.admit(ex.client)
        except CircuitOpen as exc:
            return DONE if ex.client_left() else _open(pool, exc)
        if held.__class__ is Refusal:
            return DONE if ex.client_left() else held
        ex.held = held
        if ex.client_left():  # gone while admitted: give it all back
            ex._report(None)
            pool.done(held)
            return DONE
        return None


def _open(pool: Any, exc: CircuitOpen) -> Refusal:
    detail = f"upstream {pool.name!r} is failing; its circuit is open"
    return unavailable(exc.remaining, "breaker_open", detail)


class AttemptsStage(Stage):
    """The upstream attempt(s): on a direct exchange one attempt on an idle
    connection, answered from the upstream's callbacks; retries and bodies run
    by the retry conversation on the ASGI leg (_asgi.attempts)."""

    __slots__ = ()
    name = "upstream attempts"

    def run(self, ex: Any) -> Any:
        if ex.send is not None:
            return _asgi.attempts(ex)
        pool = ex.pool
        if pool.attempts != 1:  # pragma: no cover - the guard handed it over
            return NEEDS_CYCLE
        ready = pool.pick_ready()
        if ready is None:
            return self._connect(ex)
        ex.target, conn, _ = ready
        ex.send_to(conn)
        return DONE

    @staticmethod
    async def _connect(ex: Any) -> Any:
        pool = ex.pool
        target = ex.target = pool.pick()
        client = pool.client
        conn = client.take_idle(target.base)
        if conn is None:
            try:
                conn = await client.acquire(target.base)
            except (UpstreamError, TimeoutError) as exc:
                ex.answer_error(exc)
                return DONE
            if ex.client_left():
                client.idle(conn)
                return DONE
        ex.send_to(conn)
        return DONE


class RetriesStage(Stage):
    """Before the guard, on a direct exchange of an upstream with retries: the
    retry conversation awaits, so the ASGI leg runs the request (nothing taken)."""

    __slots__ = ()
    name = "retries"

    def run(self, ex: Any) -> Any:
        return NEEDS_CYCLE if ex.send is None else None


ROUTE = RouteStage()
CLIENT = ClientStage()
BODY_CAP = BodyCapStage()
LIMITS = LimitsStage()
STORE_LIMITS = StoreLimitsStage()
LEASED_LIMITS = LeasedLimitsStage()
IDEMPOTENCY = IdempotencyStage()
OVERLOAD = OverloadStage()
RETRIES = RetriesStage()
GUARD = GuardStage()
ATTEMPTS = AttemptsStage()
ENTRY: tuple[Stage, ...] = (ROUTE,)


def stages_of(route: CompiledRoute) -> tuple[Stage, ...]:
    """The route's stages (index 0 is the route stage, as in ENTRY), built once; and
    (``route.direct``) those of them that can act on a direct exchange."""
    stages: list[Stage] = [ROUTE, CLIENT, BODY_CAP]
    rules = route.rules
    if rules is not None:
        if route.leased:
            stages.append(LEASED_LIMITS)
        else:
            stages.append(LIMITS if rules.in_memory else STORE_LIMITS)
    if route.config.idempotency != "off":
        stages.append(IDEMPOTENCY)
    if route.upstream.overload is not None:
        stages.append(OVERLOAD)
    if route.upstream.attempts != 1:
        stages.append(RETRIES)
    stages += (GUARD, ATTEMPTS)
    # A direct exchange's request has no body: the body cap never acts on it. (A
    # stage that hands it to the ASGI leg goes on there at its place in the whole
    # tuple: Exchange.to_cycle.)
    route.direct = tuple(stage for stage in stages if stage is not BODY_CAP)
    route.stages = tuple(stages)
    return route.stages
