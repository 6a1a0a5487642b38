"""The gateway's request chain: its stages written once, run by two drivers.

Stages, in order (``_stages.py``; one object each, for every request; a compiled
route's tuple holds the ones that apply to it, built once, and a direct exchange
runs ``route.direct``, the same without the body cap):
route -> client key -> body cap -> limits (+ shaping) -> idempotency -> priority and
overload control (shedding, the adaptive limit, admission control) ->
upstream guard (breaker + bulkhead) -> upstream attempts -> answer. Request head
caps are not a stage: the listener's parser enforces them before any stage runs.

A stage returns *continue* (None), *answer* (a Refusal) or *wait*: a future (a
store's Pending or an asyncio.Future, resumed from its done-callback, no task), or
a coroutine (run in a task; its return value is the stage's outcome). A stage that
must read the request through ASGI (the idempotency claim, retries with their
body replay, overload control's line, a Concurrency limit's lease) waits for the
listener's ASGI cycle (NEEDS_CYCLE): the cycle takes the request over in a task
and the chain goes on from that stage. A request with a body, or one that arrives pipelined behind
another or with ``Expect: 100-continue``, is read through that cycle from the
start (:func:`handle_http`).

Drivers, chosen by ``STORMGUARD_GATEWAY_DRIVER`` when the gateway starts (any
other value stops the start with an error naming the variable):

* ``callback``: driver 1. A bodyless request's stages run inside the listener's
  parser callback (``on_headers_complete``) until one must wait; from there
  driver 2 resumes the chain (from the future's callback, or in the task of the
  coroutine that must run).
* ``resume``: driver 2 only. No stage runs in the parser callback: the callback
  makes the request's exchange and schedules its first stage with
  ``loop.call_soon``; every stage then runs in loop callbacks (futures'
  done-callbacks), and in a task only where a coroutine must run.
* ``auto`` (the default): ``callback`` (driver 1 until a stage waits, then driver
  2); ``resume`` alone only adds a scheduled call per request.

Both drivers run the same stage objects in the same order, so every answer,
header, metric and access log line is the same whichever runs; the tests and the
wire conformance suite run every case under ``callback`` and ``resume``.
"""

from __future__ import annotations

from typing import Any

from .._wire import DISCONNECT
from ._books import BODYLESS, account, limit_refusal
from ._driver import (
    AUTO,
    CALLBACK,
    DONE,
    DRIVER_ENV,
    DRIVERS,
    NEEDS_CYCLE,
    RESUME,
    Stage,
    arun,
    driver_of,
    run,
)
from ._exchange import Exchange, serve
from ._stages import ENTRY, stages_of

__all__ = [
    "AUTO",
    "CALLBACK",
    "DONE",
    "DRIVERS",
    "DRIVER_ENV",
    "NEEDS_CYCLE",
    "RESUME",
    "Exchange",
    "Stage",
    "account",
    "arun",
    "begin",
    "begin_resume",
    "driver_of",
    "entry_for",
    "handle_http",
    "limit_refusal",
    "run",
    "stages_of",
]


def _bodyless_host(scope: dict[str, Any]) -> tuple[bool, bytes | None]:
    host = None
    for name, value in scope["headers"]:
        if name == b"host":
            host = value
        elif (name == b"content-length" and value != b"0") or name == b"transfer-encoding":
            return False, None
    return True, host


# begin's `host` when its caller has not read the head (the listener has)
_UNREAD: Any = object()


def begin(rt: Any, proto: Any, scope: dict[str, Any], keep_alive: bool, host: Any = _UNREAD) -> Any:
    """Driver 1, from the listener's parser callback: the connection's cycle for
    the request (an :class:`Exchange`, or the ASGI cycle a stage handed it to);
    None for a request with a body (the listener reads it through its cycle).

    The listener hands over only heads that announce no body, with the ``host``
    they route by; any other caller leaves ``host`` out and the headers are read."""
    if scope["method"] not in BODYLESS:
        return None
    if host is _UNREAD:
        bodyless, host = _bodyless_host(scope)
        if not bodyless:
            return None
    ex = Exchange(proto, scope, keep_alive, rt, host, ENTRY)
    run(ex, 0)
    return ex.cycle or ex


def begin_resume(
    rt: Any, proto: Any, scope: dict[str, Any], keep_alive: bool, host: Any = _UNREAD
) -> Any:
    """Driver 2 only: as :func:`begin`, but no stage runs in the parser callback
    (the first is scheduled with ``loop.call_soon``)."""
    if scope["method"] not in BODYLESS:
        return None
    if host is _UNREAD:
        bodyless, host = _bodyless_host(scope)
        if not bodyless:
            return None
    ex = Exchange(proto, scope, keep_alive, rt, host, ENTRY)
    proto.loop.call_soon(ex.run_from, 0)
    return ex


def entry_for(driver: str) -> Any:
    """The listener's hook (``fast(rt, proto, scope, keep_alive)``) of ``driver``."""
    return begin_resume if driver == RESUME else begin


async def handle_http(rt: Any, scope: Any, receive: Any, send: Any) -> None:
    """Serve one HTTP request through ``rt`` on the ASGI leg (in the cycle's task)."""
    cycle = scope.get(DISCONNECT)
    proto = getattr(cycle, "proto", None)
    host = None
    for name, value in scope["headers"]:
        if name == b"host":
            host = bytes(value)
            break
    ex = Exchange(proto, scope, True, rt, host, ENTRY)
    ex.receive, ex.send, ex.cycle, ex.on_lost = receive, send, cycle, None
    await serve(ex, 0)
