"""The listener's outbox: a loop pass's writes, sent together at the loop's next turn."""

from __future__ import annotations

import asyncio

from stormguard.gateway._outbox import Outbox


class Transport:
    """Records what is written to it, and can be closing."""

    def __init__(self, log: list[tuple[str, bytes]], name: str) -> None:
        self.log, self.name, self.closing = log, name, False

    def write(self, data: bytes) -> None:
        self.log.append((self.name, data))

    def is_closing(self) -> bool:
        return self.closing


async def _one_pass(outbox: Outbox, log: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    a, b, gone = Transport(log, "a"), Transport(log, "b"), Transport(log, "gone")
    outbox.write(a, b"1")
    outbox.write(b, b"2")
    outbox.write(gone, b"lost")
    outbox.write(a, b"3")
    gone.closing = True
    held = list(log)  # nothing written within the pass
    await asyncio.sleep(0)  # the loop's next turn
    return held


def test_writes_wait_for_the_next_turn_and_keep_their_order() -> None:
    log: list[tuple[str, bytes]] = []
    held = asyncio.run(_one_pass(Outbox(), log))
    assert held == []
    assert log == [("a", b"1"), ("b", b"2"), ("a", b"3")]  # a closing transport gets nothing


def test_a_flush_sends_at_once_and_leaves_nothing_for_the_turn() -> None:
    log: list[tuple[str, bytes]] = []

    async def main() -> None:
        outbox = Outbox()
        outbox.write(Transport(log, "a"), b"x")
        outbox.flush()
        assert log == [("a", b"x")]
        await asyncio.sleep(0)

    asyncio.run(main())
    assert log == [("a", b"x")]


def test_an_outbox_outlives_its_first_loop() -> None:
    """A listener's outbox found its loop once; on a new loop (the old one closed)
    its writes still go out."""
    outbox = Outbox()
    first: list[tuple[str, bytes]] = []
    asyncio.run(_one_pass(outbox, first))
    second: list[tuple[str, bytes]] = []
    asyncio.run(_one_pass(outbox, second))
    assert second == [("a", b"1"), ("b", b"2"), ("a", b"3")]
