# Server-side conversations as generators of effects (sans-I/O), written once the
# way the retry engine is (core/_engine.py, performed by client/_driver.py).
#
# A conversation (an idempotency claim, a gRPC call's admission) yields
# Call(target, name, args): "call target.name(*args) and send me the answer". Every
# object the server side talks to has sync and async twins named `name` and
# `a<name>` -- RuleSet.decide/adecide, Admission.enter/aenter, ClaimStore
# claim/aclaim, complete/acomplete, release/arelease -- so two drivers serve every
# conversation: drive() calls the sync form, adrive() awaits the async one. RUN asks
# the front end to run the request itself (the `run` callable given to the driver).
#
# What a call raises is thrown into the conversation at its yield: a conversation
# handles a StoreError or a failing handler in an ordinary try block, and whatever
# it does not handle leaves the driver unchanged.
from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, Final, NamedTuple, TypeAlias, TypeVar

__all__ = ["RUN", "Call", "Steps", "adrive", "drive"]

T = TypeVar("T")


class Call(NamedTuple):
    """One effect: call ``target.name(*args)`` (``a<name>`` when driven async)."""

    target: Any
    name: str
    args: tuple[Any, ...] = ()


RUN: Final = Call(None, "run")  # the front end runs the request; sends back its value

Steps: TypeAlias = Generator[Call, Any, T]


class _Done(NamedTuple):
    value: Any


def _resume(steps: Steps[Any], reply: Any, error: BaseException | None) -> Call | _Done:
    # Send the last answer (or throw the last error) in; the next call, or the end.
    try:
        return steps.throw(error) if error is not None else steps.send(reply)
    except StopIteration as stop:
        return _Done(stop.value)


def _runs_nothing() -> Any:
    raise RuntimeError("this conversation was given nothing to run")


def drive(steps: Steps[T], run: Callable[[], Any] = _runs_nothing) -> T:
    """Perform a conversation with the sync twins; return what it returns."""
    reply: Any = None
    error: BaseException | None = None
    while not isinstance(call := _resume(steps, reply, error), _Done):
        perform = run if call is RUN else getattr(call.target, call.name)
        try:
            reply, error = perform(*call.args), None
        except BaseException as exc:
            reply, error = None, exc
    return call.value  # type: ignore[no-any-return]


async def adrive(steps: Steps[T], run: Callable[[], Awaitable[Any]] = _runs_nothing) -> T:
    """Async twin of :func:`drive`: awaits ``a<name>`` and ``run()``."""
    reply: Any = None
    error: BaseException | None = None
    while not isinstance(call := _resume(steps, reply, error), _Done):
        perform = run if call is RUN else getattr(call.target, "a" + call.name)
        try:
            reply, error = await perform(*call.args), None
        except BaseException as exc:
            reply, error = None, exc
    return call.value  # type: ignore[no-any-return]
