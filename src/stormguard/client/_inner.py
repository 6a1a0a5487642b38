# What the httpx transports that wrap another (RetryTransport, HedgingTransport)
# share: the inner transport for each protocol -- the one given, or httpx's own
# made on first use -- and close()/aclose() forwarded to it.
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import httpx

__all__ = ["Wrapping", "numbered"]

T = TypeVar("T")


def numbered(
    request: httpx.Request, header: str, number: int, *, keep: bool = False
) -> httpx.Request:
    """A copy of ``request`` whose ``header`` says ``number`` (``keep``: unless the
    request carries one already); the body stream is shared (a replayable one)."""
    headers = request.headers.copy()
    if keep:
        headers.setdefault(header, str(number))
    else:
        headers[header] = str(number)
    return httpx.Request(
        request.method,
        request.url,
        headers=headers,
        stream=request.stream,
        extensions=dict(request.extensions),
    )


class Wrapping(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """An httpx transport (sync and async) that delegates to an inner one."""

    _inner: httpx.BaseTransport | httpx.AsyncBaseTransport | None
    _sync_inner: httpx.BaseTransport | None
    _async_inner: httpx.AsyncBaseTransport | None

    def _wrap(self, transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None) -> None:
        self._inner = transport
        self._sync_inner = None
        self._async_inner = None

    def _sync(self) -> httpx.BaseTransport:
        if self._sync_inner is None:
            self._sync_inner = self._wrapped(
                httpx.BaseTransport, httpx.HTTPTransport, "async-only; use httpx.AsyncClient"
            )
        return self._sync_inner

    def _async(self) -> httpx.AsyncBaseTransport:
        if self._async_inner is None:
            self._async_inner = self._wrapped(
                httpx.AsyncBaseTransport, httpx.AsyncHTTPTransport, "sync-only; use httpx.Client"
            )
        return self._async_inner

    def _wrapped(self, kind: type[T], default: Callable[[], T], otherwise: str) -> T:
        # The inner transport for one protocol: the one given, or a default one.
        if self._inner is None:
            return default()
        if isinstance(self._inner, kind):
            return self._inner
        raise TypeError(f"the inner transport is {otherwise}")

    def close(self) -> None:
        if self._sync_inner is not None:
            self._sync_inner.close()
        elif isinstance(self._inner, httpx.BaseTransport):
            self._inner.close()

    async def aclose(self) -> None:
        if self._async_inner is not None:
            await self._async_inner.aclose()
        elif isinstance(self._inner, httpx.AsyncBaseTransport):
            await self._inner.aclose()
