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

from collections.abc import AsyncIterator, Iterator
from typing import Unpack

from .._scope import ExcInfo
from ..core._engine import Outcome
from ._attempt import numbered, unnumbered
from ._decorator import Config, RetryOptions, conclude, configure
from ._driver import Run

__all__ = ["Attempt", "Retrying", "retrying"]

_SUCCESS = Outcome(None)


class Attempt:
    """One attempt of a :func:`retrying` loop; use it as ``with attempt:``.

    In a ``for`` loop the block's end drives the call on at once (recording it,
    deciding, waiting); in an ``async for`` loop ``with attempt:`` leaves that to
    the loop, which awaits it, and ``async with attempt:`` does it at the block's end.
    """

    __slots__ = (
        "_config",
        "_run",
        "_sync",
        "_token",
        "driven",
        "finished",
        "number",
        "outcome",
        "wait",
    )

    def __init__(self, run: Run, config: Config, *, sync: bool) -> None:
        self._run = run
        self._config = config
        self._sync = sync
        self.number = run.conversation.attempts
        self.finished = True  # until the block fails and the policy says "again"
        self.driven = False  # the block's exit already drove the call on
        self.outcome: Outcome | None = None
        self.wait = 0.0
        self._token: object | None = None

    def __repr__(self) -> str:
        target = self._run.target
        return f"<Attempt {self.number} of {target if isinstance(target, str) else target()}>"

    def _judge(self, exc: BaseException | None) -> Outcome | None:
        if exc is None:
            return _SUCCESS
        if not isinstance(exc, Exception):
            return None  # KeyboardInterrupt, CancelledError, SystemExit pass through
        return self._config.judge(exc)

    def _report(self, exc: BaseException | None) -> Outcome | None:
        # The block's outcome, kept for the loop; None: not an attempt's outcome
        # (the block was interrupted) -- the call ends and its permit goes back.
        self.outcome = self._judge(exc)
        return self.outcome

    def _after(self, more: bool, outcome: Outcome, exc: BaseException | None) -> bool:
        # The call was driven on: another attempt (swallow the exception), or the end
        # (an exception not ours leaves as it is; else the answer or RetryError).
        self.driven = True
        if outcome.failure is None and exc is not None:
            return False
        if more:
            self.finished = False
            state = self._run.conversation.state
            self.wait = (state.previous_wait if state is not None else None) or 0.0
            return True
        assert self._run.finish is not None
        conclude(self._run.finish, self._config.policy)  # raises RetryError, or returns
        return False

    def __enter__(self) -> Attempt:
        # Inside the block, stormguard.current_attempt() is this attempt's number.
        self._token = numbered(self.number)
        return self

    def __exit__(self, *exc_info: *ExcInfo) -> bool:
        unnumbered(self._token)
        self._token = None
        outcome = self._report(exc_info[1])
        if outcome is None:
            if self._sync:  # in `async for`, the loop gives the permit back (awaited)
                self._run.release()
            return False
        if not self._sync:  # `async for`: the loop awaits the rest
            return outcome.failure is not None
        return self._after(self._run.advance(self._run.sent(outcome)), outcome, exc_info[1])

    async def __aenter__(self) -> Attempt:
        return self.__enter__()

    async def __aexit__(self, *exc_info: *ExcInfo) -> bool:
        unnumbered(self._token)
        self._token = None
        outcome = self._report(exc_info[1])
        if outcome is None:
            await self._run.arelease()
            return False
        more = await self._run.aadvance(self._run.sent(outcome))
        return self._after(more, outcome, exc_info[1])


class Retrying:
    """An iterable (sync and async) of :class:`Attempt` objects. See :func:`retrying`."""

    __slots__ = ("_config", "_target")

    def __init__(self, config: Config, target: str) -> None:
        self._config = config
        self._target = target

    def _run(self) -> Run:
        run = self._config.engine.start(self._config.policy, target=self._target)
        run.begin()
        return run

    def __iter__(self) -> Iterator[Attempt]:
        run = self._run()
        more = run.advance()
        while more:
            attempt = Attempt(run, self._config, sync=True)
            yield attempt
            if attempt.outcome is None:  # never entered, or interrupted
                run.release()
                return
            more = not attempt.finished
        assert run.finish is not None
        if run.finish.outcome is None:  # the breaker refused the first attempt
            conclude(run.finish, self._config.policy)

    async def __aiter__(self) -> AsyncIterator[Attempt]:
        run = self._run()
        try:
            more = await run.aadvance()
            while more:
                attempt = Attempt(run, self._config, sync=False)
                yield attempt
                if attempt.outcome is None:
                    return
                if attempt.driven:
                    more = not attempt.finished
                else:
                    more = await run.aadvance(run.sent(attempt.outcome))
                    if not more:
                        assert run.finish is not None
                        conclude(run.finish, self._config.policy)
            assert run.finish is not None
            if run.finish.outcome is None:
                conclude(run.finish, self._config.policy)
        finally:
            await run.arelease()  # a permit whose block never reported back


def retrying(*, name: str = "retrying block", **options: Unpack[RetryOptions]) -> Retrying:
    """Retry a block of code: the loop form of :func:`stormguard.retry`.

    >>> for attempt in retrying(on=OSError, attempts=3):
    ...     with attempt:
    ...         pass  # one attempt of the work

    Same keywords and rules as :func:`stormguard.retry`; ``name`` labels the retry
    records and log lines. Works with ``for`` and ``async for``. A block that
    succeeds ends the loop; one that raises an exception matched by ``on`` is
    retried after the wait, or raises :class:`RetryError` when the policy gives up.
    """
    return Retrying(configure("retrying", options), name)
