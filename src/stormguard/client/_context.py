# `stormguard.retrying(...)`: retry a block of code instead of a function.
#
#     for attempt in stormguard.retrying(on=OSError, attempts=3):
#         with attempt:
#             do_something()
#
# The same rules as the decorator: each `with attempt:` block is one attempt; an
# exception matched by `on` is judged by the policy and swallowed while another
# attempt is allowed; the loop sleeps between attempts; when the policy gives up,
# RetryError is raised from the block. `async for` works the same way.
from __future__ import annotations

import random
from collections.abc import AsyncIterator, Collection, Iterator, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any

from .._clock import Clock
from ..core._backoff import Backoff
from ..core._policy import RetryPolicy
from ._decorator import UNSET, Config, ExceptionFilter, admit, after_exception, configure
from ._driver import RetryCall, RetryHook, record_permit

__all__ = ["Attempt", "Retrying", "retrying"]


class Attempt:
    """One attempt of a :func:`retrying` loop; use it as ``with attempt:``."""

    __slots__ = ("_call", "_config", "_permit", "finished", "number", "wait")

    def __init__(self, call: RetryCall, config: Config) -> None:
        self._call = call
        self._config = config
        self._permit: Any = None
        self.number = call.attempts
        self.finished = True  # until the block fails and the policy says "again"
        self.wait = 0.0

    def __repr__(self) -> str:
        return f"<Attempt {self.number} of {self._call.target}>"

    def __enter__(self) -> Attempt:
        self._permit = admit(self._call)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None:
            record_permit(self._permit, failure=False)
            return False
        if not isinstance(exc, Exception):
            return False  # KeyboardInterrupt, CancelledError, SystemExit pass through
        # Raises RetryError (the policy gave up) or exc itself (not matched by `on`).
        self.wait = after_exception(self._call, self._config.judge, self._permit, exc)
        self.finished = False
        return True


class Retrying:
    """An iterable (sync and async) of :class:`Attempt` objects. See :func:`retrying`."""

    __slots__ = ("_config", "_rng", "_target")

    def __init__(self, config: Config, rng: random.Random | None, target: str) -> None:
        self._config = config
        self._rng = rng
        self._target = target

    def _call(self) -> RetryCall:
        config = self._config
        return RetryCall(
            config.policy,
            target=self._target,
            clock=config.clock,
            rng=self._rng,
            hooks=config.hooks,
        )

    def __iter__(self) -> Iterator[Attempt]:
        call = self._call()
        while True:
            attempt = Attempt(call, self._config)
            yield attempt
            if attempt.finished:
                return
            self._config.clock.sleep(attempt.wait)

    async def __aiter__(self) -> AsyncIterator[Attempt]:
        call = self._call()
        while True:
            attempt = Attempt(call, self._config)
            yield attempt
            if attempt.finished:
                return
            await self._config.clock.asleep(attempt.wait)


def retrying(
    *,
    on: ExceptionFilter = Exception,
    attempts: int = UNSET,
    backoff: Backoff = UNSET,
    deadline: float | timedelta = UNSET,
    max_wait: float | timedelta = UNSET,
    retry_statuses: Collection[int] = UNSET,
    budget: Any = UNSET,
    breaker: Any = UNSET,
    policy: RetryPolicy | None = None,
    on_retry: RetryHook | Sequence[RetryHook] = (),
    clock: Clock | None = None,
    rng: random.Random | None = None,
    name: str = "retrying block",
) -> Retrying:
    """Retry a block of code: the loop form of :func:`stormguard.retry`.

    >>> for attempt in retrying(on=OSError, attempts=3):
    ...     with attempt:
    ...         pass  # one attempt of the work

    Same keywords and rules as :func:`stormguard.retry`; ``name`` labels the retry
    records and log lines. Works with ``for`` and ``async for``. A block that
    succeeds ends the loop; one that raises an exception matched by ``on`` is
    retried after the wait, or raises :class:`RetryError` when the policy gives up.
    """
    config = configure(
        on=on,
        fields={
            "attempts": attempts,
            "backoff": backoff,
            "deadline": deadline,
            "max_wait": max_wait,
            "retry_statuses": retry_statuses,
            "budget": budget,
            "breaker": breaker,
        },
        policy=policy,
        on_retry=on_retry,
        clock=clock,
    )
    return Retrying(config, rng, name)
