# What every request ends with, whichever leg answered it: its outcome counted,
# its access log line queued; and the limits' refusal answer.
from __future__ import annotations

import logging
import time
from typing import Any

from ...server._refusal import Refusal, rate_limited, unavailable
from .._clients import client_id
from .._runtime import CLIENT_KEY, SHADOW_KEY, CompiledRoute, Runtime

__all__ = ["BODYLESS", "BUFFER", "account", "limit_refusal"]

access_log = logging.getLogger("stormguard.gateway.access")
BUFFER = 64 * 1024  # bodies (request and answer) up to this size are read whole
BODYLESS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE", "TRACE"})


def account(rt: Runtime, route: CompiledRoute | None, scope: Any, ex: Any, started: float) -> None:
    """Count the request's outcome; write its access log line (when enabled)."""
    name = route.name if route is not None else "-"
    rt.metrics.count(name, ex.outcome)
    key = scope.get(CLIENT_KEY)  # the client is named here when nothing named it before
    if ex.outcome not in ("allowed", "not_found", "upstream_error") and (ex.client or key):
        rt.metrics.refused_clients.labels(ex.client or client_id(key), ex.outcome).inc()
    if rt.config.access_log and access_log.isEnabledFor(logging.INFO):
        # a tuple now; rendered and written once per event-loop pass (_accesslog)
        rt.access.add(
            (
                scope["method"],
                name,
                ex.status,
                ex.outcome,
                ex.rule,
                ex.upstream,
                scope.get(SHADOW_KEY),  # fleet (issue 25): what shadow limits would refuse
                scope["path"],
                key,  # hashed when the line is rendered (client_id)
                int((time.perf_counter() - started) * 1e6 + 0.5),  # microseconds
            )
        )


def limit_refusal(route: CompiledRoute, decision: Any) -> Refusal:
    """429 over a limit; 503 when the store is down and the limits fail closed."""
    assert route.rules is not None
    if route.rules.store_down and route.rules.fails_closed:
        return unavailable(
            decision.retry_after, "store_unavailable", "limits cannot be checked now"
        )
    return rate_limited(decision, "ietf")
