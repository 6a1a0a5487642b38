"""Pending: resolved once, callbacks inline and in order, awaitable, errors contained."""

from __future__ import annotations

import asyncio
import logging

import pytest

from stormguard.stores._pending import Pending, done


def test_callbacks_run_inline_in_order_once() -> None:
    """Callbacks run when the value is set, in the order added; a second set is ignored."""
    pending: Pending[int] = Pending()
    seen: list[tuple[str, int]] = []
    pending.add_done_callback(lambda p: seen.append(("a", p.result())))
    pending.add_done_callback(lambda p: seen.append(("b", p.result())))
    assert not pending.done() and seen == []
    pending.set_result(7)
    assert seen == [("a", 7), ("b", 7)]
    pending.set_result(8)
    pending.set_exception(RuntimeError("late"))
    assert pending.result() == 7 and len(seen) == 2


def test_callback_added_after_the_result_runs_at_once() -> None:
    """A callback added to a resolved Pending runs immediately."""
    pending = done("x")
    seen: list[str] = []
    pending.add_done_callback(lambda p: seen.append(p.result()))
    assert seen == ["x"]


def test_result_raises_the_error_or_says_not_yet() -> None:
    """result() raises the resolving error, and RuntimeError before any result."""
    pending: Pending[int] = Pending()
    with pytest.raises(RuntimeError, match="not in yet"):
        pending.result()
    pending.set_exception(KeyError("k"))
    with pytest.raises(KeyError):
        pending.result()


def test_a_failing_callback_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One callback raising does not stop the next one nor reach the resolver."""
    pending: Pending[int] = Pending()
    seen: list[int] = []

    def broken(_: Pending[int]) -> None:
        raise ValueError("bug")

    pending.add_done_callback(broken)
    pending.add_done_callback(lambda p: seen.append(p.result()))
    with caplog.at_level(logging.ERROR, logger="stormguard"):
        pending.set_result(3)
    assert seen == [3]
    assert "done-callback" in caplog.text


async def test_awaiting_gives_the_value_or_raises() -> None:
    """await returns the value set later from a loop callback, or raises its error."""
    loop = asyncio.get_running_loop()
    good: Pending[str] = Pending()
    loop.call_soon(good.set_result, "ok")
    assert await good == "ok"
    bad: Pending[str] = Pending()
    loop.call_soon(bad.set_exception, ConnectionError("gone"))
    with pytest.raises(ConnectionError):
        await bad
    assert await done(5) == 5
