"""The ``with`` / ``async with`` protocol, spelled out once.

Breakers, bulkheads, stores and the mock server are all context managers. Each says only what
entering and leaving mean (``_enter``/``_exit``, ``_aenter``/``_aexit``); these mixins carry the
protocol's signatures, so the typed ``__exit__(exc_type, exc, tb)`` boilerplate lives here alone.
A context manager that may swallow what escaped its block (``retrying()``'s attempts) spells
its own ``__exit__(self, *exc_info: *ExcInfo) -> bool``: the triple is named once, here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec, Self, TypeAlias, TypeVar, overload

P = ParamSpec("P")
T = TypeVar("T")

ExcInfo: TypeAlias = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]
"""What ``__exit__`` / ``__aexit__`` receive: the exception's type, the exception, its traceback."""


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

    def __exit__(self, *exc_info: *ExcInfo) -> None:
        self._exit(exc_info[1])


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

    async def __aexit__(self, *exc_info: *ExcInfo) -> None:
        await self._aexit(exc_info[1])


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


class Decorator:
    """``@obj`` on a function: each call goes through ``obj.call``, or ``await obj.acall``."""

    __slots__ = ()

    def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` under the guard."""
        raise NotImplementedError

    async def acall(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Await ``fn(*args, **kwargs)`` under the guard."""
        raise NotImplementedError

    def _is_async(self, fn: Callable[..., Any]) -> bool:
        # Whether to decorate `fn` with `acall`; may raise for what cannot be guarded.
        return inspect.iscoroutinefunction(fn)

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, T]]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]: ...

    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        """Decorate a sync or async function: every call goes through the guard."""
        return wrapped(fn, self.call, self.acall if self._is_async(fn) else None)
