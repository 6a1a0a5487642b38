# The access log, written in batches off the request path (issue 24).
#
# Per request the gateway only appends a tuple of the line's fields (`add`): no dict,
# no json.dumps, no LogRecord, no write(2). The first line of an event-loop pass
# schedules one flush at the end of the pass (`loop.call_soon`); a pass that gathers
# `flush_at` lines flushes at once. A flush renders the lines -- the same JSON, the
# same keys in the same order, byte for byte what `json.dumps(line,
# separators=(",", ":"))` gave -- and then:
#
# * default logging (the gateway's own `run()` installed the only handler that
#   would see the record: a StreamHandler printing "%(message)s"): the batch is one
#   string, handed to a writer thread that writes it to that handler's stream with
#   one write and one flush, under the handler's lock (so other records never tear a
#   line). The thread, not the event loop, waits on a slow pipe or disk.
# * any other logging set-up (a user's handler, a filter, caplog): one record per line
#   through `logging`, in order, still once per pass.
#
# Bounded memory: at most `max_backlog` lines wait for the writer thread; lines over
# that bound are dropped and counted (`dropped`, the `on_drop` hook feeds
# /metrics). `close()` flushes what is pending and waits for the writer to finish:
# the gateway calls it on shutdown.
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from json import dumps
from json.encoder import encode_basestring_ascii as _quote
from typing import Any
from weakref import WeakSet

__all__ = ["AccessLog", "Line", "mark_default_handlers", "render"]

# (method, path, route, status, policy, client, client_rule, upstream, ms, shadow)
Line = tuple[str, str, str, int, str, str, str, str, float, "tuple[str, ...] | None"]

# Handlers the gateway's own `run()` installed (logging.basicConfig): writing to their
# stream directly is what logging would have done for an access line.
_DEFAULT: WeakSet[logging.Handler] = WeakSet()


def mark_default_handlers(handlers: Iterable[logging.Handler]) -> None:
    """Record ``handlers`` as the gateway's default ones ("%(message)s" to a stream)."""
    _DEFAULT.update(handlers)


def render(line: Line) -> str:
    """The JSON text of one access line (what ``json.dumps(dict, separators=(",",
    ":"))`` of its fields in order gives)."""
    method, path, route, status, policy, client, rule, upstream, ms, shadow = line
    text = (
        f'{{"method":{_quote(method)},"path":{_quote(path)},"route":{_quote(route)},'
        f'"status":{status},"policy":{_quote(policy)},"client":{_quote(client)},'
        f'"client_rule":{_quote(rule)},"upstream":{_quote(upstream)},"ms":{ms!r}'
    )
    if shadow is None:
        return text + "}"
    return f'{text},"shadow":{dumps(list(shadow), separators=(",", ":"))}}}'


def _stream_handler(logger: logging.Logger) -> logging.StreamHandler[Any] | None:
    # The one handler a record of `logger` would reach, when it is a default one and
    # nothing (a filter, a level) could change what it prints; else None.
    if logger.filters or not logger.isEnabledFor(logging.INFO):
        return None
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        if current is not logger and current.filters:
            return None  # a parent's filter does not apply to propagated records; be safe
        found.extend(h for h in current.handlers if not isinstance(h, logging.NullHandler))
        current = current.parent if current.propagate else None
    if len(found) != 1:
        return None
    handler = found[0]
    if handler not in _DEFAULT or handler.filters or handler.level > logging.INFO:
        return None
    if not isinstance(handler, logging.StreamHandler):
        return None
    return handler


class AccessLog:
    """Access lines gathered per event-loop pass and written in one go (see above)."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        flush_at: int = 1024,
        max_backlog: int = 100_000,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        self.logger = logger
        self.flush_at = flush_at
        self.max_backlog = max_backlog
        self.on_drop = on_drop
        self.dropped = 0
        self._pending: list[Line] = []
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # the writer thread's queue: (handler, text, line count); None stops it
        self._queue: deque[tuple[logging.StreamHandler[Any], str, int] | None] = deque()
        self._wake = threading.Condition(threading.Lock())
        self._backlog = 0  # lines handed to the writer, not yet written
        self._writer: threading.Thread | None = None

    def add(self, line: Line) -> None:
        """One request's line (written at the end of this event-loop pass)."""
        pending = self._pending
        pending.append(line)
        if len(pending) >= self.flush_at:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            loop = self._loop
            if loop is None or loop.is_closed():
                try:
                    loop = self._loop = asyncio.get_running_loop()
                except RuntimeError:  # no loop (a direct call): write now
                    self.flush()
                    return
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Render and write (or hand to the writer thread) every pending line."""
        self._scheduled = False
        lines, self._pending = self._pending, []
        if not lines:
            return
        handler = _stream_handler(self.logger)
        if handler is None:
            log = self.logger.info
            for line in lines:
                log(render(line))
            return
        with self._wake:
            room = self.max_backlog - self._backlog
            if room < len(lines):
                lost = len(lines) - max(room, 0)
                lines = lines[: max(room, 0)]
                self.dropped += lost
                if self.on_drop is not None:
                    self.on_drop(lost)
            if not lines:
                return
            text = "\n".join(map(render, lines)) + handler.terminator
            self._queue.append((handler, text, len(lines)))
            self._backlog += len(lines)
            self._wake.notify()
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write, name="stormguard-access-log", daemon=True
            )
            self._writer.start()

    def _write(self) -> None:
        while True:
            with self._wake:
                while not self._queue:
                    self._wake.wait()
                item = self._queue.popleft()
            if item is None:
                return
            handler, text, count = item
            handler.acquire()
            try:
                stream = handler.stream
                stream.write(text)
                stream.flush()
            except Exception:  # a closed or broken stream: the lines are lost, counted
                with self._wake:
                    self.dropped += count
                if self.on_drop is not None:
                    self.on_drop(count)
            finally:
                handler.release()
            with self._wake:
                self._backlog -= count
                self._wake.notify_all()

    def close(self) -> None:
        """Write what is pending and wait for the writer thread (on shutdown)."""
        self.flush()
        writer, self._writer = self._writer, None
        if writer is None:
            return
        with self._wake:
            self._queue.append(None)
            self._wake.notify()
        writer.join()
