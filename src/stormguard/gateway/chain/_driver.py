# The chain's two drivers over one tuple of stage objects (see the package's
# docstring for the outcomes and the setting).
#
# Rules:
# * a stage's ``run(ex)`` returns None (continue), a Refusal (answer it), DONE
#   (the stage answered or gave up the request itself), a future (anything with
#   ``add_done_callback`` and ``result``: an asyncio.Future or a store's Pending),
#   a coroutine, or NEEDS_CYCLE (the stage must read the request through the
#   listener's ASGI cycle);
# * a future is resumed by ``stage.resume(ex, result)`` from the future's own
#   done-callback: no task (a store's Pending that is already resolved when the
#   stage returns it is resumed in place: its callback would run at once). A
#   coroutine runs in a task, and its return value is the stage's outcome.
#   After either, the chain goes on from the next stage in the same callback or
#   task;
# * ``run`` (driver 1 or 2: the callback and resume drivers are the same loop,
#   entered from the parser's callback or from a loop callback) never awaits;
#   ``arun`` is the loop inside a task (the ASGI leg), which awaits a future or
#   a coroutine in place;
# * the route stage replaces the entry tuple (ENTRY: the route stage alone) with
#   its route's (built once per compiled route), index for index: ``run`` reads
#   ``ex.stages`` afresh when it reaches the end of the tuple it ran.
from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Mapping
from typing import Any, Final

from ...server._refusal import Refusal
from ...stores._pending import Pending

__all__ = [
    "AUTO",
    "CALLBACK",
    "DONE",
    "DRIVERS",
    "DRIVER_ENV",
    "NEEDS_CYCLE",
    "RESUME",
    "Stage",
    "after",
    "arun",
    "driver_of",
    "resumed",
    "run",
]

DRIVER_ENV: Final = "STORMGUARD_GATEWAY_DRIVER"
CALLBACK: Final = "callback"
RESUME: Final = "resume"
AUTO: Final = "auto"
DRIVERS: Final = (CALLBACK, RESUME, AUTO)


def driver_of(environ: Mapping[str, str] = os.environ) -> str:
    """The driver named by ``STORMGUARD_GATEWAY_DRIVER`` (default ``auto``).

    Raises ValueError naming the variable for any other value."""
    raw = environ.get(DRIVER_ENV, "")
    value = raw.strip().lower() or AUTO
    if value not in DRIVERS:
        raise ValueError(f"{DRIVER_ENV}={raw!r}: expected one of callback, resume, auto")
    return value


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


DONE: Final = _Marker("DONE")  # the stage answered (or abandoned) the request itself
NEEDS_CYCLE: Final = _Marker("NEEDS_CYCLE")  # the stage must read through the ASGI cycle


class Stage:
    """One step of the chain: stateless, one object for every request."""

    __slots__ = ()
    name = "stage"

    def run(self, ex: Any) -> Any:
        """The stage's outcome for ``ex`` (see the module's rules)."""
        return None

    def resume(self, ex: Any, result: Any) -> Any:
        """The outcome once the future this stage returned has ``result``."""
        return None

    def __repr__(self) -> str:
        return f"<stage {self.name}>"


def run(ex: Any, i: int) -> None:
    """Run ``ex``'s stages from index ``i`` until one answers or waits."""
    try:
        stages = ex.stages
        n = len(stages)
        while True:
            if i >= n:
                if ex.stages is stages:
                    return
                stages = ex.stages  # the route's, after the route stage
                n = len(stages)
                continue
            stage = stages[i]
            out = stage.run(ex)
            if out is not None:
                if out.__class__ is Pending and out.done():
                    # Decided already (in this process: approximate limits, a store
                    # that fell back): resumed here, as its done-callback would be
                    # at once, without the callback's frames.
                    out = stage.resume(ex, out.result())
                    if out is None:
                        i += 1
                        continue
                if out is not DONE:
                    after(ex, i, out)
                return
            i += 1
    except Exception:  # a bug must not leave the client without an answer
        ex.fail()


def after(ex: Any, i: int, out: Any) -> None:
    """Act on stage ``i``'s outcome ``out`` (not None) outside a task."""
    if out.__class__ is Refusal:
        ex.refuse(out)
    elif out is DONE:
        return
    elif out is NEEDS_CYCLE:
        ex.to_cycle(i)
    elif out.__class__ is not Pending and isinstance(out, Coroutine):  # (an ABC: slow)
        ex.waiting = ex.proto.loop.create_task(_awaited(ex, i, out))
    else:
        ex.at = i
        out.add_done_callback(ex.on_result)


def resumed(ex: Any, result: Any) -> None:
    """The future stage ``ex.at`` waited on has ``result``: go on (driver 2)."""
    i = ex.at
    try:
        out = ex.stages[i].resume(ex, result)
    except Exception:
        ex.fail()
        return
    if out is None:
        run(ex, i + 1)
    else:
        after(ex, i, out)


async def _awaited(ex: Any, i: int, coroutine: Coroutine[Any, Any, Any]) -> None:
    try:
        out = await coroutine
    except Exception:
        ex.fail()
        return
    finally:
        ex.waiting = None
    if out is None:
        run(ex, i + 1)
    else:
        after(ex, i, out)


async def arun(ex: Any, i: int) -> None:
    """The chain from index ``i`` inside a task (the ASGI leg): waits in place."""
    while True:
        stages = ex.stages
        if i >= len(stages):
            return
        stage = stages[i]
        out = stage.run(ex)
        while out is not None:
            if out.__class__ is Refusal:
                await ex.arefuse(out)
                return
            if out is DONE:
                return
            if out is NEEDS_CYCLE:  # pragma: no cover - only a direct exchange asks
                raise RuntimeError(f"{stage!r} asked for a cycle on the ASGI leg")
            if isinstance(out, Coroutine):
                out = await out
            else:
                out = stage.resume(ex, await _result(out))
        i += 1


async def _result(future: Any) -> Any:
    if isinstance(future, asyncio.Future) or hasattr(future, "__await__"):
        return await future
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.add_done_callback(lambda f: done.set_result(f.result()))
    return await done
