# Idempotency keys (Stripe's semantics and the IETF Idempotency-Key draft) as one
# conversation that every front end drives: ASGI (IdempotencyMiddleware below),
# gRPC unary calls and the gateway.
#
#   admit(method, key)       no key on a keyed method: pass (or 400 when required);
#                            empty or > 255 characters: 400;
#   begin(scope, key, fp)    one atomic claim in the store:
#                              claimed   -> run the request, then finish/abandon;
#                              in flight -> 409 + a short Retry-After;
#                              mismatch  -> 422 (same key, other request);
#                              done      -> replay status, headers and body with
#                                           Idempotent-Replayed: true;
#                              store down-> 503 + Retry-After, nothing executed;
#   finish(ticket, response) a 5xx releases the claim (AWS Powertools semantics: the
#                            retry runs again); anything else is stored for `ttl`;
#                            refused when the lease ended meanwhile (a late owner);
#   abandon(ticket)          an error we saw (an exception): released; an unknown
#                            outcome (an ASGI request cancelled mid-way) is not
#                            abandoned: its claim is kept until the lease ends.
#
# Each step is written once, as a generator of store calls (claiming, finishing,
# abandoning; server/_steps.py), and driven sync or async: begin/abegin and the
# other twins are one-line drivers. `once` is a whole call (claim, RUN, record) for
# front ends whose request is one call returning one answer (gRPC unary, both
# flavours); ASGI records from inside its `send`, so it uses the steps one by one.
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._errors import ConfigError, StoreError
from ..core._idempotency import ClaimOutcome, fingerprint
from ._claims import ClaimStore, claim_key, claims_for
from ._decide import close_on_shutdown, open_store
from ._refusal import Refusal, send_refusal, send_response
from ._rules import ClientAddress, KeySpec, compile_key
from ._steps import RUN, Call, Steps, adrive, drive
from ._types import ASGIApp, Message, Receive, Scope, Send
from ._view import ScopeView

__all__ = [
    "IdempotencyGuard",
    "IdempotencyMiddleware",
    "Replay",
    "Ticket",
    "decode_response",
    "encode_response",
]

_log = logging.getLogger("stormguard")
MAX_KEY = 255
_SKIP_HEADERS = frozenset({"date", "server", "content-length", "transfer-encoding", "connection"})


def encode_response(status: int, headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
    """One stored response: a JSON head line, then the body bytes."""
    head = json.dumps([status, [list(pair) for pair in headers]], separators=(",", ":"))
    return head.encode() + b"\n" + body


def decode_response(raw: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """Inverse of :func:`encode_response`."""
    head, _, body = raw.partition(b"\n")
    status, headers = json.loads(head)
    return int(status), [(str(k), str(v)) for k, v in headers], body


class Replay(NamedTuple):
    """A stored answer to send again (its headers say ``Idempotent-Replayed: true``)."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True, slots=True)
class Ticket:
    """A claim held by one request: finish or abandon it."""

    key: str
    owner: str


class IdempotencyGuard:
    """The idempotency conversation, independent of the protocol (see module notes)."""

    def __init__(
        self,
        *,
        store: object = None,
        methods: Sequence[str] = ("POST", "PATCH"),
        ttl: float = 86400.0,
        lease: float = 60.0,
        required: bool = False,
        in_flight_retry_after: float = 1.0,
        retry_store_after: float = 1.0,
        asyncio: bool = True,
    ) -> None:
        for name, value in (("ttl", ttl), ("lease", lease)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(name, f"must be > 0 seconds, got {value!r}")
        self.store = open_store(store, asyncio=asyncio)
        self.owns_store = isinstance(store, str)
        self.claims: ClaimStore = claims_for(self.store)
        self.methods = frozenset(m.upper() for m in methods)
        self.ttl = float(ttl)
        self.lease = float(lease)
        self.required = required
        self.in_flight_retry_after = in_flight_retry_after
        self.retry_store_after = retry_store_after

    def admit(self, method: str, key: str | None) -> Refusal | bool:
        """True: take part (a valid key); False: not ours; a Refusal: answer it (400)."""
        if method.upper() not in self.methods:
            return False
        if key is None:
            if self.required:
                return Refusal.of(400, "an Idempotency-Key is required", reason="missing_key")
            return False
        if not key.strip() or len(key) > MAX_KEY:
            detail = f"the Idempotency-Key must have 1 to {MAX_KEY} characters"
            return Refusal.of(400, detail, reason="bad_key")
        return True

    def _answer(
        self, outcome: ClaimOutcome, retry_after: float, response: bytes | None
    ) -> Refusal | Replay:
        if outcome is ClaimOutcome.MISMATCH:
            return Refusal.of(
                422, "this Idempotency-Key was used with another request", reason="key_reused"
            )
        if outcome is ClaimOutcome.IN_FLIGHT:
            wait = min(self.in_flight_retry_after, max(retry_after, 0.001))
            return Refusal.of(
                409,
                "a request with this Idempotency-Key is in progress",
                reason="idempotency_conflict",
                retry_after=wait,
            )
        assert response is not None
        status, headers, body = decode_response(response)
        return Replay(status, [*headers, ("Idempotent-Replayed", "true")], body)

    def _store_down(self, exc: StoreError) -> Refusal:
        _log.warning("idempotency store failed (%s): refusing keyed requests", exc)
        return Refusal.of(
            503,
            "idempotency store unavailable; nothing was executed",
            reason="store_unavailable",
            retry_after=self.retry_store_after,
        )

    # The conversation, written once as steps (server/_steps.py); the twins below
    # and the gRPC interceptors drive it sync or async.

    def claiming(self, scope: str, key: str, fp: str) -> Steps[Ticket | Refusal | Replay]:
        """Claim: a Ticket (run it), a Refusal (409/422/503) or a Replay."""
        ticket = Ticket(claim_key(scope, key), os.urandom(12).hex())
        try:
            result = yield Call(self.claims, "claim", (ticket.key, fp, ticket.owner, self.lease))
        except StoreError as exc:
            return self._store_down(exc)
        if result.outcome is ClaimOutcome.CLAIMED:
            return ticket
        return self._answer(result.outcome, result.retry_after, result.response)

    def finishing(self, ticket: Ticket, status: int, stored: bytes) -> Steps[None]:
        """Store the response (``encode_response``), or release on a 5xx."""
        claims = self.claims
        try:
            if status >= 500:
                yield Call(claims, "release", (ticket.key, ticket.owner))
            elif not (yield Call(claims, "complete", (ticket.key, ticket.owner, stored, self.ttl))):
                _log.warning("idempotency: a late completion was refused (lease over)")
        except StoreError as exc:
            _log.warning("idempotency: could not record an outcome (%s)", exc)

    def abandoning(self, ticket: Ticket) -> Steps[None]:
        """Release after an error we saw (the request may run again)."""
        try:
            yield Call(self.claims, "release", (ticket.key, ticket.owner))
        except StoreError as exc:
            _log.warning("idempotency: could not release a claim (%s)", exc)

    def once(
        self, scope: str, key: str, fp: str, stored: Callable[[Any], bytes | None]
    ) -> Steps[Any]:
        """A whole keyed call: claim, then RUN once and keep ``stored(value)`` (None:
        release) -- or answer without running: a Refusal or a Replay. A failing run
        (any exception, cancellation too) releases the claim and raises."""
        started = yield from self.claiming(scope, key, fp)
        if not isinstance(started, Ticket):
            return started
        try:
            value = yield RUN
        except GeneratorExit:
            raise  # dropped by its driver mid-run: the outcome is unknown, the lease ends it
        except BaseException:
            yield from self.abandoning(started)
            raise
        response = stored(value)
        if response is None:
            yield from self.abandoning(started)
        else:
            yield from self.finishing(started, 200, response)
        return value

    async def abegin(self, scope: str, key: str, fp: str) -> Ticket | Refusal | Replay:
        """Claim: a Ticket (run it), a Refusal (409/422/503) or a Replay."""
        return await adrive(self.claiming(scope, key, fp))

    def begin(self, scope: str, key: str, fp: str) -> Ticket | Refusal | Replay:
        """Sync twin of :meth:`abegin`."""
        return drive(self.claiming(scope, key, fp))

    async def afinish(self, ticket: Ticket, status: int, stored: bytes) -> None:
        """Store the response (``encode_response``), or release on a 5xx."""
        await adrive(self.finishing(ticket, status, stored))

    def finish(self, ticket: Ticket, status: int, stored: bytes) -> None:
        """Sync twin of :meth:`afinish`."""
        drive(self.finishing(ticket, status, stored))

    async def aabandon(self, ticket: Ticket) -> None:
        """Release after an error we saw (the request may run again)."""
        await adrive(self.abandoning(ticket))

    def abandon(self, ticket: Ticket) -> None:
        """Sync twin of :meth:`aabandon`."""
        drive(self.abandoning(ticket))


def default_fingerprint(scope: Scope, body: bytes) -> str:
    """Method, path and body."""
    return fingerprint(scope["method"].encode(), scope["path"].encode(), body)


class _TooLarge(Exception):
    pass


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ConnectionAbortedError("client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


class IdempotencyMiddleware:
    """Execute a keyed request once; replay its answer to every retry.

    ``header`` names the key (``Idempotency-Key``); ``methods`` are the keyed ones.
    ``scope`` is a key spec (``"header:X-API-Key"``, ``"ip"`` or a callable of the
    ASGI scope) naming the tenant, so two tenants' equal keys never meet.
    ``required`` answers 400 to a keyed method without a key. ``fingerprint`` is a
    function ``(scope, body) -> str`` (default: method, path and body). Bodies
    larger than ``max_body`` get 413; an answer larger than ``max_response`` is not
    stored (retries get 409 until the lease ends). Stored answers expire after ``ttl`` seconds
    (24 h); a claim whose owner crashed expires after ``lease`` seconds (make it
    longer than the request timeout). ``store`` is a store object or URL; when it is
    down, keyed requests get 503 + ``Retry-After`` and nothing runs
    (``on_store_error="closed"``, the only mode: executing twice is the failure
    this middleware exists to prevent).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: object = None,
        header: str = "Idempotency-Key",
        methods: Sequence[str] = ("POST", "PATCH"),
        ttl: float = 86400.0,
        lease: float = 60.0,
        required: bool = False,
        scope: KeySpec | None = None,
        fingerprint: Callable[[Scope, bytes], str] | None = None,
        max_body: int = 1 << 20,
        max_response: int = 1 << 20,
        trusted_proxies: Sequence[str] = (),
        on_store_error: str = "closed",
    ) -> None:
        if on_store_error != "closed":
            raise ConfigError("on_store_error", "idempotency fails closed: only 'closed'")
        if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 0:
            raise ConfigError("max_body", f"must be an integer >= 0, got {max_body!r}")
        self.app = app
        self.header = header.lower()
        self.guard = IdempotencyGuard(
            store=store, methods=methods, ttl=ttl, lease=lease, required=required
        )
        self.scope_of = (
            None if scope is None else compile_key(scope, ClientAddress.of(trusted_proxies))
        )
        self.fingerprint = fingerprint or default_fingerprint
        self.max_body = max_body
        self.max_response = max_response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan" and self.guard.owns_store:
                send = close_on_shutdown(send, self.guard.store)
            await self.app(scope, receive, send)
            return
        view = ScopeView(scope)
        key = view.header(self.header)
        admitted = self.guard.admit(scope["method"], key)
        if admitted is False:
            await self.app(scope, receive, send)
            return
        if isinstance(admitted, Refusal):
            await send_refusal(send, admitted)
            return
        assert key is not None
        try:
            body = await _read_body(receive, self.max_body)
        except _TooLarge:
            detail = f"bodies of keyed requests are limited to {self.max_body} bytes"
            await send_refusal(send, Refusal.of(413, detail, reason="too_large"))
            return
        except ConnectionAbortedError:
            return
        tenant = (self.scope_of(view) or "") if self.scope_of is not None else ""
        started = await self.guard.abegin(tenant, key, self.fingerprint(scope, body))
        if isinstance(started, Refusal):
            await send_refusal(send, started)
            return
        if isinstance(started, Replay):
            await send_response(send, *started)
            return
        await self._run(scope, receive, send, body, started)

    async def _run(
        self, scope: Scope, receive: Receive, send: Send, body: bytes, ticket: Ticket
    ) -> None:
        replayed = False

        async def replay_body() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        status = 0
        headers: list[tuple[str, str]] = []
        chunks: list[bytes] = []
        size = 0
        recorded = False

        async def record() -> None:
            # The outcome is recorded BEFORE the last byte goes out: a client that has
            # its answer and retries at once finds the replay (or, after a 5xx, a
            # released key), never a claim still in flight.
            nonlocal recorded
            recorded = True
            if size > self.max_response and status < 500:
                # It ran, but its answer is too large to keep: no replay and no
                # second run -- the claim stays in flight (409) until its lease ends.
                _log.warning("idempotency: response over max_response; claim kept")
                return
            stored = encode_response(status, headers, b"".join(chunks))
            await self.guard.afinish(ticket, status, stored)

        async def capture(message: Message) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for k, v in message.get("headers", ()):
                    name = k.decode("latin-1")
                    if name.lower() not in _SKIP_HEADERS:
                        headers.append((name, v.decode("latin-1")))
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                size += len(chunk)
                if size <= self.max_response:
                    chunks.append(chunk)
                if not message.get("more_body") and not recorded:
                    await record()
            await send(message)

        try:
            await self.app(scope, replay_body, capture)
        except Exception:
            if not recorded:
                await self.guard.aabandon(ticket)
            raise
        # A cancelled request (BaseException) keeps its claim: its outcome is unknown.
        if not recorded:
            await self.guard.aabandon(ticket)  # the app never finished an answer
