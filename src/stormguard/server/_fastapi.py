# The FastAPI form: a dependency and a route decorator over the same RuleSet and
# refusal rendering as RateLimitMiddleware. FastAPI is imported here only.
#
# A refusal is raised as RateLimitRefused (an HTTPException: FastAPI answers it
# with its status and headers -- 429 + Retry-After + rate-limit headers, or 503 --
# and `{"detail": <RFC 9457 problem>}`); `install(app)` registers a handler that
# sends the bare problem document instead. Admitted requests get the quota headers
# on their response.
from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, Unpack

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import Response as PlainResponse

from ..core._limiters import Algorithm
from ._ratelimit import RequestLimits, StoreOptions
from ._refusal import Refusal
from ._rules import KeySpec, Rule
from ._view import ScopeView

__all__ = ["RateLimitRefused", "RouteLimit", "install", "limit", "stormguard_limit"]

F = TypeVar("F", bound=Callable[..., Any])


class RateLimitRefused(HTTPException):
    """A refusal (429 or 503) raised by a :class:`RouteLimit` dependency."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(
            refusal.status,
            detail=json.loads(refusal.body),
            headers={k: v for k, v in refusal.headers if k != "Content-Type"},
        )
        self.refusal = refusal


class RouteLimit:
    """A FastAPI dependency deciding its limits for each request of a route."""

    def __init__(
        self,
        limits: Sequence[str | Algorithm | Rule],
        *,
        key: KeySpec = "ip",
        name: str | None = None,
        headers: str = "ietf",
        headers_on_allowed: bool = True,
        **options: Unpack[StoreOptions],
    ) -> None:
        rules = []
        for i, item in enumerate(limits):
            if isinstance(item, Rule):
                rules.append(item)
            else:
                label = name if name is None or len(limits) == 1 else f"{name}-{i}"
                rules.append(Rule(item, key=key, name=label))
        self.limits = RequestLimits(
            rules, headers=headers, headers_on_allowed=headers_on_allowed, **options
        )

    async def __call__(self, request: Request, response: Response) -> None:
        answer = await self.limits.adecide(ScopeView(request.scope))
        if isinstance(answer, Refusal):
            raise RateLimitRefused(answer)
        for k, v in answer or ():
            response.headers[k] = v


def stormguard_limit(*limits: str | Algorithm | Rule, **options: Any) -> RouteLimit:
    """A dependency: ``Depends(stormguard_limit("10/minute", key="header:X-API-Key"))``.

    ``limits`` are limit strings, algorithm objects or :class:`Rule` objects; the
    options are those of ``RateLimitMiddleware`` (``key``, ``store``,
    ``on_store_error``, ``headers``, ``headers_on_allowed`` (default True),
    ``trusted_proxies``) plus ``name``. Create it once per route (module level), not
    per request: it holds the limiter state.
    """
    return RouteLimit(limits, **options)


def limit(*limits: str | Algorithm | Rule, **options: Any) -> Callable[[F], F]:
    """Route decorator form of :func:`stormguard_limit` (put it under ``@app.get``)."""
    dependency = RouteLimit(limits, **options)

    def decorate(endpoint: F) -> F:
        signature = inspect.signature(endpoint)
        extra = inspect.Parameter(
            "_stormguard_limit",
            inspect.Parameter.KEYWORD_ONLY,
            default=Depends(dependency),
            annotation=None,
        )
        if inspect.iscoroutinefunction(endpoint):

            @functools.wraps(endpoint)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                kwargs.pop("_stormguard_limit", None)
                return await endpoint(*args, **kwargs)

        else:

            @functools.wraps(endpoint)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                kwargs.pop("_stormguard_limit", None)
                return endpoint(*args, **kwargs)

        wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*signature.parameters.values(), extra]
        )
        return wrapper  # type: ignore[return-value]

    return decorate


def install(app: FastAPI) -> None:
    """Answer :class:`RateLimitRefused` with the bare RFC 9457 problem document."""

    async def handler(request: Request, exc: Exception) -> PlainResponse:
        assert isinstance(exc, RateLimitRefused)
        refusal = exc.refusal
        return PlainResponse(
            refusal.body,
            status_code=refusal.status,
            headers={k: v for k, v in refusal.headers if k != "Content-Type"},
            media_type="application/problem+json",
        )

    app.add_exception_handler(RateLimitRefused, handler)
