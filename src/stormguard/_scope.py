"""The ``with`` / ``async with`` protocol, spelled out once.

Breakers, bulkheads, stores and the mock server are all context managers. Each says only what
entering and leaving mean (``_enter``/``_exit``, ``_aenter``/``_aexit``); these mixins carry the
protocol's signatures, so the typed ``__exit__(exc_type, exc, tb)`` boilerplate lives here alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec, Self

P = ParamSpec("P")


class Scope:
    """``with obj:`` runs ``obj._enter()``, binds ``obj``, and runs ``obj._exit(exc)``."""

    __slots__ = ()

    def _enter(self) -> None:
        """What entering the block does (nothing by default)."""

    def _exit(self, exc: BaseException | None) -> None:
        """What leaving the block does; ``exc`` is what escaped it, if anything."""

    def __enter__(self) -> Self:
        self._enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc)


class AsyncScope:
    """``async with obj:`` awaits ``obj._aenter()`` and ``obj._aexit(exc)``; ``obj`` is bound."""

    __slots__ = ()

    async def _aenter(self) -> None:
        """What entering the block does (nothing by default)."""

    async def _aexit(self, exc: BaseException | None) -> None:
        """What leaving the block does; ``exc`` is what escaped it, if anything."""

    async def __aenter__(self) -> Self:
        await self._aenter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._aexit(exc)


def wrapped(
    fn: Callable[P, Any],
    run: Callable[..., Any],
    arun: Callable[..., Any] | None,
) -> Callable[P, Any]:
    """``fn`` decorated so each call goes through ``run(fn, ...)``, or ``await arun(fn, ...)``.

    The caller decides whether ``fn`` is async: it passes ``arun`` then, None otherwise.
    """
    if arun is not None:

        @functools.wraps(fn)
        async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            return await arun(fn, *args, **kwargs)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
        return run(fn, *args, **kwargs)

    return wrapper
