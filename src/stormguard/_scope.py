"""The ``with`` / ``async with`` protocol, spelled out once.

Breakers, bulkheads, stores and the mock server are all context managers. Each says only what
entering and leaving mean (``_enter``/``_exit``, ``_aenter``/``_aexit``); these mixins carry the
protocol's signatures, so the typed ``__exit__(exc_type, exc, tb)`` boilerplate lives here alone.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self


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
