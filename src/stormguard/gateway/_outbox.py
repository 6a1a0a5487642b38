# The callback path's writes, held until the event loop has run the rest of the
# callbacks of its pass, then sent together in the order they were made.
#
# Why: the syscalls are already the minimum, four per request (read the client,
# write the upstream, read the upstream, write the client: counted with perf
# tracepoints under wrk, nginx makes five). What made each of them dearer than
# nginx's is that a write wakes its reader. The gateway spends tens of
# microseconds of Python per request, long enough for the upstream's worker and
# wrk's threads to fall asleep between two of its writes, so nearly every write
# paid a wake-up, and on a two-core box the woken peer often preempted the gateway
# (1.6 wake-ups and 1.5 context switches per request, against nginx's 0.8). The
# requests of one pass (one epoll wait) written together wake each peer once.
#
# Rules:
# * a write is held until the loop's next turn (call_soon), no longer: a pass's
#   other callbacks run first, nothing waits on a timer;
# * writes go out in the order they were made; a transport closed meanwhile gets
#   nothing (what was written to it was lost with it anyway);
# * whoever writes or closes a transport directly flushes first, so that the order
#   of its bytes holds: an answer that closes its connection, a streamed body
#   (written at once, so that the client's back-pressure is seen at once and the
#   upstream is paused, as before), the listener's own 400, a WebSocket upgrade (its
#   protocol writes the transport itself), the server's shutdown.
from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Outbox"]


class Outbox:
    """Writes of one loop pass, sent at the loop's next turn (one per listener)."""

    __slots__ = ("_call_soon", "_flush", "_held")

    def __init__(self) -> None:
        self._held: list[tuple[Any, bytes]] = []
        # The loop's call_soon, found once: a listener serves on one loop, and on
        # Python 3.11 asyncio.get_running_loop() costs a getpid() syscall.
        self._call_soon: Any = None
        self._flush = self.flush  # bound once, not on every pass

    def write(self, transport: Any, data: bytes) -> None:
        """Send ``data`` on ``transport`` once this pass's callbacks have run."""
        held = self._held
        if not held:
            call_soon = self._call_soon
            if call_soon is None:
                call_soon = self._call_soon = asyncio.get_running_loop().call_soon
            try:
                call_soon(self._flush)
            except RuntimeError:  # the loop it was found on has closed: this one's
                call_soon = self._call_soon = asyncio.get_running_loop().call_soon
                call_soon(self._flush)
        held.append((transport, data))

    def flush(self) -> None:
        """Send what is held now."""
        held = self._held
        if held:
            self._held = []
            for transport, data in held:
                if not transport.is_closing():
                    transport.write(data)
