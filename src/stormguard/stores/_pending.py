# A result that arrives later, lighter than an asyncio.Future.
#
# A batched Redis decision is resolved from the store connection's data_received.
# An asyncio.Future would hand every done-callback to loop.call_soon (one Handle and
# one more loop pass per request); `Pending` runs its callbacks inline, in the
# callback that resolves it, so the request chain continues in the same pass. It
# is also awaitable (through a Future made only when somebody awaits it), so a
# coroutine can use the same object.
#
# Rules: resolved once (a second resolution is ignored); a callback added after the
# resolution runs at once; a callback's exception is logged, never raised into the
# resolver (the store connection must keep reading).
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

__all__ = ["Pending", "done"]

T = TypeVar("T")
log = logging.getLogger("stormguard")
_UNSET: Any = object()


class Pending(Generic[T]):
    """A value (or an exception) that will be there: ``add_done_callback``,
    ``done``, ``result``, and ``await``."""

    __slots__ = ("_callbacks", "_error", "_value")

    def __init__(self) -> None:
        self._value: Any = _UNSET
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Pending[T]], object]] | None = None

    def done(self) -> bool:
        """Whether the value (or an error) is in."""
        return self._value is not _UNSET or self._error is not None

    def result(self) -> T:
        """The value; raises the error it was resolved with, or RuntimeError when
        it is not in yet."""
        if self._error is not None:
            raise self._error
        if self._value is _UNSET:
            raise RuntimeError("the result is not in yet")
        value: T = self._value
        return value

    def add_done_callback(self, callback: Callable[[Pending[T]], object]) -> None:
        """Call ``callback(self)`` once the result is in (at once if it is)."""
        if self.done():
            _run(callback, self)
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    def set_result(self, value: T) -> None:
        """Resolve with ``value``; the callbacks run now."""
        if not self.done():
            self._value = value
            self._fire()

    def set_exception(self, error: BaseException) -> None:
        """Resolve with ``error``; the callbacks run now."""
        if not self.done():
            self._error = error
            self._fire()

    def _fire(self) -> None:
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            _run(callback, self)

    def __await__(self) -> Generator[Any, None, T]:
        if not self.done():
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def wake(_: Pending[T]) -> None:
                if not future.done():
                    future.set_result(None)

            self.add_done_callback(wake)
            yield from future.__await__()
        return self.result()

    def __repr__(self) -> str:
        if self._error is not None:
            return f"<Pending error={self._error!r}>"
        return "<Pending>" if self._value is _UNSET else f"<Pending {self._value!r}>"


def _run(callback: Callable[[Pending[Any]], object], pending: Pending[Any]) -> None:
    try:
        callback(pending)
    except Exception:
        log.exception("error in a done-callback of %r", pending)


def done(value: T) -> Pending[T]:
    """A :class:`Pending` resolved with ``value`` already."""
    pending: Pending[T] = Pending()
    pending._value = value
    return pending
