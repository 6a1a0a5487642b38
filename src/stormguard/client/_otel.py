# OpenTelemetry, when `opentelemetry-api` is installed (extra `otel`): each retry
# adds an event on the caller's current span, each give-up marks the span failed.
# Nothing is imported until the engine first reports a retry or a give-up, and the
# import is tried once: without the package both functions cost one global read.
# The attribute names follow the OTel HTTP semantic conventions
# (`http.request.resend_count`, `http.response.status_code`); ours are under
# `stormguard.`.
from __future__ import annotations

from typing import Any

__all__ = ["gave_up", "retried"]

_trace: Any = None  # the opentelemetry.trace module, once imported
_missing = False  # the import was tried and failed


def _api() -> Any:
    global _trace, _missing
    if _trace is None and not _missing:
        try:
            from opentelemetry import trace
        except ImportError:
            _missing = True
        else:
            _trace = trace
    return _trace


def _recording_span() -> Any:
    trace = _api()
    if trace is None:
        return None
    span = trace.get_current_span()
    return span if span.is_recording() else None


def status_of(subject: Any) -> int | None:
    """The HTTP status of a failed attempt's subject (a response, or an error carrying one)."""
    status = getattr(subject, "status_code", None)
    if status is None:
        status = getattr(getattr(subject, "response", None), "status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def retried(attempt: int, wait: float, reason: str, subject: Any, target: str) -> None:
    """One event on the current span: attempt ``attempt`` failed, resent after ``wait``."""
    if _missing:
        return
    span = _recording_span()
    if span is None:
        return
    attributes: dict[str, Any] = {
        "http.request.resend_count": attempt,
        "stormguard.retry.wait_s": wait,
        "stormguard.retry.reason": reason,
        "stormguard.target": target,
    }
    status = status_of(subject)
    if status is not None:
        attributes["http.response.status_code"] = status
    span.add_event("stormguard.retry", attributes)


def gave_up(attempts: int, reason: str, subject: Any) -> None:
    """The current span's status set to ERROR with the give-up reason."""
    if _missing:
        return
    span = _recording_span()
    if span is None:
        return
    attributes: dict[str, Any] = {"stormguard.attempts": attempts, "stormguard.reason": reason}
    status = status_of(subject)
    if status is not None:
        attributes["http.response.status_code"] = status
    span.add_event("stormguard.give_up", attributes)
    span.set_status(_trace.Status(_trace.StatusCode.ERROR, f"stormguard gave up: {reason}"))
