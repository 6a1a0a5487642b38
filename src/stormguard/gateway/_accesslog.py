# The access log, written in batches off the request path (issue 24).
#
# Per request the gateway only appends a tuple of the line's fields (`add`): no dict,
# no json.dumps, no LogRecord, no hash of the client key, no write(2). A batch is
# handed over `interval` seconds after its first line, or at once when it holds
# `batch` lines: its lines are rendered -- the same JSON as before, the same keys in
# the same order, byte for byte what `json.dumps(line, separators=(",", ":"))` gave --
# and then:
#
# * default logging (the gateway's own `run()` installed the only handler that
#   would see the record: a StreamHandler printing "%(message)s"): the batch is one
#   string, written by a writer thread to that handler's stream with one write and
#   one flush, under the handler's lock (so other records never tear a line). The
#   thread, not the event loop, waits on a slow pipe or disk.
# * any other logging set-up (a user's handler, a filter, caplog): one record per line
#   through `logging`, in order.
#
# Why not once per event-loop pass: measured, a pass serves only a few requests, and
# the per-pass work (a callback, the logging check, a thread wake-up with the GIL
# passing back and forth) cost more per request than the lines themselves. A few
# batches a second cost nothing per request; a line is at most `interval` late.
#
# Bounded memory: a batch holds at most `batch` lines, and at most `max_backlog` lines
# wait for the writer thread; lines over that bound are dropped and counted
# (`dropped`; the `on_drop` hook feeds /metrics). `close()` writes what is pending
# and waits for the writer: the gateway calls it on shutdown.
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from functools import lru_cache
from json import dumps
from json.encoder import encode_basestring_ascii as _quote
from typing import Any
from weakref import WeakSet

from ._clients import client_id

__all__ = ["AccessLog", "Line", "mark_default_handlers", "render"]

# (method, route, status, policy, client_rule, upstream, shadow, path, client KEY,
# microseconds): the fields that take few values first, so that their rendered
# text is found by one slice (`render`); the key is named (`client_id`, its SHA-256
# prefix; "" for None) and the time written in milliseconds when rendered.
Line = tuple[str, str, int, str, str, str, "tuple[str, ...] | None", str, str | None, int]

# Handlers the gateway's own `run()` installed (logging.basicConfig): writing to their
# stream directly is what logging would have done for an access line.
_DEFAULT: WeakSet[logging.Handler] = WeakSet()


def mark_default_handlers(handlers: Iterable[logging.Handler]) -> None:
    """Record ``handlers`` as the gateway's default ones ("%(message)s" to a stream)."""
    _DEFAULT.update(handlers)


# line[:7] -> the line's text around its path, client and time (see render); the
# fields in it take few values (a route, a status, a policy...). Bounded: cleared
# when full.
_PARTS: dict[tuple[Any, ...], tuple[str, str, str, str]] = {}
_MAX_PARTS = 4096
# Microseconds 0-999 as the fraction of a millisecond that repr() of us / 1000 ends
# with: ".0", ".001", ..., ".5", ..., ".999" (no trailing zero; no float formatted).
_FRACTIONS = tuple("." + (f"{us:03d}".rstrip("0") or "0") for us in range(1000))


def _parts(fields: tuple[Any, ...]) -> tuple[str, str, str, str]:
    method, route, status, policy, rule, upstream, shadow = fields
    parts = (
        f'{{"method":{_quote(method)},"path":',
        f',"route":{_quote(route)},"status":{status},"policy":{_quote(policy)},"client":',
        f',"client_rule":{_quote(rule)},"upstream":{_quote(upstream)},"ms":',
        "}" if shadow is None else f',"shadow":{dumps(list(shadow), separators=(",", ":"))}}}',
    )
    if len(_PARTS) >= _MAX_PARTS:
        _PARTS.clear()
    _PARTS[fields] = parts
    return parts


@lru_cache(maxsize=4096)
def _client(key: str | None) -> str:
    # The client's name as a JSON string: its key's client_id ("" for none).
    return _quote(client_id(key) if key else "")


def render(line: Line) -> str:
    """The JSON text of one access line: what ``json.dumps(dict, separators=(",",
    ":"))`` gives of its fields in the order method, path, route, status, policy,
    client (the key's :func:`client_id`), client_rule, upstream, ms (the microseconds
    / 1000), then shadow when there is one."""
    fields = line[:7]
    parts = _PARTS.get(fields) or _parts(fields)
    us = line[9]
    return (
        f"{parts[0]}{_quote(line[7])}{parts[1]}{_client(line[8])}{parts[2]}"
        f"{us // 1000}{_FRACTIONS[us % 1000]}{parts[3]}"
    )


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
    """Access lines gathered and written in batches (see above)."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = 0.05,
        batch: int = 256,
        max_backlog: int = 100_000,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.batch = batch
        self.max_backlog = max_backlog
        self.on_drop = on_drop
        self.dropped = 0
        self._pending: list[Line] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        # the writer thread's queue: (handler, text, line count); None stops it
        self._queue: deque[tuple[logging.StreamHandler[Any], str, int] | None] = deque()
        self._wake = threading.Condition(threading.Lock())
        self._backlog = 0  # lines handed to the writer, not yet written
        self._writer: threading.Thread | None = None

    def add(self, line: Line) -> None:
        """One request's line (written with its batch)."""
        pending = self._pending
        pending.append(line)
        if len(pending) >= self.batch:
            self.flush()
        elif self._timer is None:
            loop = self._loop
            if loop is None or loop.is_closed():
                try:
                    loop = self._loop = asyncio.get_running_loop()
                except RuntimeError:  # no loop (a direct call): write now
                    self.flush()
                    return
            self._timer = loop.call_later(self.interval, self.flush)

    def flush(self) -> None:
        """Hand the pending lines over: through logging, or to the writer thread."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
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
                self.dropped += lost
                lines = lines[: max(room, 0)]
            else:
                lost = 0
            if lines:
                end = handler.terminator
                self._queue.append((handler, end.join(map(render, lines)) + end, len(lines)))
                self._backlog += len(lines)
                self._wake.notify()
        if lost and self.on_drop is not None:
            self.on_drop(lost)
        if lines and self._writer is None:
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
