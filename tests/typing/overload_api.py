"""Typing checks of the overload-control API: checked by mypy --strict (make types), never run."""

from __future__ import annotations

from typing import Any

import stormguard
from stormguard.asgi import ConcurrencyMiddleware, OverloadControl, OverloadMiddleware
from stormguard.protection import ThrottledBreaker

attempt: int = stormguard.attempt_number([(b"retry-attempt", b"2")])
attempt = stormguard.attempt_number({"x-envoy-attempt-count": "3"})
critical: stormguard.Priority | None = stormguard.Priority.parse("critical")
limit = stormguard.AdaptiveLimit(min_limit=2, max_limit=200, instances=3)
current: int = limit.limit
started: float | None = limit.try_acquire()
state: dict[str, Any] = limit.status()
admission = stormguard.AdmissionControl(window=10.0, success_rate=0.9, max_reject=0.5)
admitted: bool = admission.admits()
admission.record(True)
throttle = stormguard.AdaptiveThrottle(k=2.0, window=60.0)
sent: bool = throttle.allow()
guarded: ThrottledBreaker = throttle.guarding(stormguard.CircuitBreaker())
policy = stormguard.RetryPolicy(breaker=guarded)
control = OverloadControl(limit, max_queue=50, max_wait=0.05, admission=admission)
refused: int = control.refused["shed:sheddable"]


async def app(scope: Any, receive: Any, send: Any) -> None: ...


guarded_app = OverloadMiddleware(
    app,
    control=control,
    priority={"header": "x-priority", "trust": "proxies"},
    routes={"/batch": "sheddable"},
    trusted_proxies=["10.0.0.0/8"],
)
adaptive_app = ConcurrencyMiddleware(app, limit=100, adaptive={"min_limit": 4})
text: str = control.metrics_text()
try:
    guarded.acquire()
except stormguard.Throttled as refusal:
    share: float = refusal.probability
