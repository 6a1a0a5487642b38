"""The exception tree of stormguard.

Every error that stormguard raises on purpose derives from :class:`StormguardError`::

    StormguardError
     ├── ConfigError (also ValueError)      invalid configuration, raised at construction
     ├── MissingExtra (also ImportError)    an optional dependency is not installed
     ├── RetryError                         a retrying call gave up; carries why
     ├── CircuitOpen                        a circuit breaker refused the call
     │    └── Throttled                     the client's adaptive throttle refused it locally
     ├── BulkheadFull                       no concurrency slot within max_wait
     ├── RateLimited                        a limiter or a shared cooldown refused the call
     ├── StoreError                         a shared store (Redis) failed; mapped at the boundary
     └── ScenarioError (also ValueError)    a mock-server scenario file is invalid

Errors of third-party libraries (redis-py, httpx, requests) are mapped to these at
the boundary where stormguard calls them; the exception the caller's own function
raises is never wrapped except by :class:`RetryError`, which keeps it as
``last_exception`` and ``__cause__``.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core._ratelimit_headers import Quota

__all__ = [
    "BulkheadFull",
    "CircuitOpen",
    "ConfigError",
    "MissingExtra",
    "RateLimited",
    "RetryError",
    "ScenarioError",
    "StoreError",
    "StormguardError",
    "Throttled",
]


class StormguardError(Exception):
    """Base class of every error stormguard raises on purpose."""


class ConfigError(StormguardError, ValueError):
    """Invalid configuration. The message names the field and the allowed range."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class MissingExtra(StormguardError, ImportError):
    """An optional dependency is missing; the message names the extra that fixes it."""

    def __init__(self, module: str, extra: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(
            f"{module!r} is not installed; install it with: pip install 'stormguard[{extra}]'"
        )


# An exception with fields: the dataclass writes the keyword-only constructor;
# identity equality, hashing and the message-only repr stay Exception's.
@dataclass(eq=False, repr=False)
class RetryError(StormguardError):
    """A retrying call stopped without success.

    ``reason`` is one of the :class:`stormguard.GiveUpReason` values (``"attempts
    exhausted"``, ``"deadline"``, ``"hint too long"``, ``"not retryable"``, ``"retry
    budget exhausted"``, ``"circuit open"``). ``last_exception`` is the exception of
    the last attempt (``None`` when the last attempt returned a value judged a
    failure, kept in ``last_result``). ``hint`` is the server-advised wait in seconds
    when one was seen.

    When the last attempt failed with an HTTP response (a 429 or 503 whose small
    body was read, e.g. an ``httpx.HTTPStatusError`` raised by
    ``raise_for_status()``), ``response_body`` is an excerpt of that body, where
    APIs say which limit was hit (decoded leniently, at most 4096 characters plus
    a cut marker), and ``quota`` the :class:`stormguard.Quota` its rate-limit
    headers said was used up; both are ``None`` otherwise.
    """

    reason: str
    _: KW_ONLY
    attempts: int
    last_exception: BaseException | None = None
    last_result: Any = None
    hint: float | None = None
    response_body: str | None = None
    quota: Quota | None = None

    def __post_init__(self) -> None:
        attempts, hint, last = self.attempts, self.hint, self.last_exception
        detail = f"gave up after {attempts} attempt{'s' if attempts != 1 else ''}: {self.reason}"
        if hint is not None:
            detail += f" (server asked to wait {hint:.3f}s)"
        if last is not None:
            detail += f"; last error: {type(last).__name__}: {last}"
        super().__init__(detail)


class CircuitOpen(StormguardError):
    """A circuit breaker refused the call; ``remaining`` seconds until it half-opens."""

    def __init__(self, name: str | None, remaining: float) -> None:
        self.name = name
        self.remaining = remaining
        label = f"circuit {name!r}" if name else "circuit"
        super().__init__(f"{label} is open; retry in {remaining:.3f}s")


class Throttled(CircuitOpen):
    """The client's adaptive throttle refused this attempt locally (SRE throttling).

    The origin accepted too few of the recent attempts, so a fraction
    ``probability`` of new ones is refused without being sent. A
    :class:`CircuitOpen` (``remaining`` is 0: the next attempt may pass), so code
    that handles a breaker's refusal handles this one too.
    """

    def __init__(self, name: str | None, probability: float) -> None:
        self.probability = probability
        super().__init__(name, 0.0)
        label = f"{name!r}" if name else "the origin"
        self.args = (
            f"{label} is throttled locally: it accepted too few recent attempts "
            f"(refusing {probability:.0%} of new ones)",
        )


class BulkheadFull(StormguardError):
    """No concurrency slot became free within the bulkhead's ``max_wait``."""

    def __init__(self, limit: int, waited: float) -> None:
        self.limit = limit
        self.waited = waited
        super().__init__(f"bulkhead full ({limit} in flight); waited {waited:.3f}s")


class RateLimited(StormguardError):
    """A limiter or a shared cooldown refused the call; retry after ``retry_after`` s."""

    def __init__(self, retry_after: float, message: str | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message or f"rate limited; retry after {retry_after:.3f}s")


class StoreError(StormguardError):
    """A shared store failed (connection refused, timeout, script error)."""


class ScenarioError(StormguardError, ValueError):
    """A mock scenario is invalid; the message names file, line and field path."""
