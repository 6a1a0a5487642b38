# A small Redis connection of our own: RESP bytes out, replies parsed by hiredis.
#
# The async store's limiter calls are one EVALSHA per batch on one connection per
# event loop. redis-py's per-command machinery (a pool lock, command packing in
# Python, observability hooks, a task and a timeout per read) costs more than the
# decision itself, so that one path owns its connection, as h11 owns HTTP/1.1:
# `RespConnection` is an asyncio.Protocol that writes RESP bytes the caller built
# and hands each reply, in order, to the callback sent with its command, from
# `data_received` -- no task, no future, no read loop. Parsing is hiredis's public
# `hiredis.Reader`. Everything else (breakers, budgets, other scripts) keeps using
# the redis-py client.
#
# Timeouts measure Redis, not this process: a connection is dead when commands are
# outstanding and no reply has arrived for `timeout` seconds since the last reply
# (or since the first command into an idle connection). A busy Redis that keeps
# answering, however long the queue of batches behind it, is alive; a batch waiting
# in this process's own queue is not "on the wire" and never times out. A timer
# that finds the deadline passed gives the loop one more pass (a grace period) to
# read what may already be in the socket -- on a saturated host the loop can run
# late -- before it gives up. A dead connection fails every outstanding callback
# with StoreError and is closed; the owner makes a new one on its next call.
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from .._errors import StoreError
from .._extras import require

__all__ = ["RespConnection", "Target", "connect"]

log = logging.getLogger("stormguard")

Callback = Callable[[Any], None]  # gets the reply, a hiredis.ReplyError, or a StoreError
_GRACE = 0.2  # of the timeout: the extra wait before a deadline is believed


class Target:
    """Where and how to connect: host and port or a unix socket path, the
    credentials and the database of a ``redis://`` / ``unix://`` URL."""

    __slots__ = ("db", "host", "password", "path", "port", "username")

    def __init__(self, url: str) -> None:
        options = require("redis.connection", "redis").parse_url(url)
        self.host: str = options.get("host", "localhost")
        self.port: int = int(options.get("port", 6379))
        self.path: str | None = options.get("path")
        self.db = int(options.get("db", 0) or 0)
        self.username: str | None = options.get("username")
        self.password: str | None = options.get("password")

    def handshake(self) -> list[list[bytes]]:
        """The commands a new connection sends first (AUTH, SELECT)."""
        commands = []
        if self.password is not None:
            auth = [self.username, self.password] if self.username else [self.password]
            commands.append([b"AUTH", *(part.encode() for part in auth)])
        if self.db:
            commands.append([b"SELECT", b"%d" % self.db])
        return commands


def pack(command: list[bytes]) -> bytes:
    """One command as RESP."""
    parts = [b"*%d\r\n" % len(command)]
    parts += [b"$%d\r\n%s\r\n" % (len(arg), arg) for arg in command]
    return b"".join(parts)


class RespConnection(asyncio.Protocol):
    """One connection: :meth:`send` RESP bytes with a callback per reply they ask for."""

    __slots__ = (
        "_grace",
        "_progress",
        "_reader",
        "_timer",
        "closed",
        "loop",
        "on_lost",
        "timeout",
        "transport",
        "waiting",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, timeout: float, on_lost: Callable[[], None]
    ) -> None:
        self.loop = loop
        self.timeout = timeout
        self.on_lost = on_lost
        hiredis = require("hiredis", "redis")
        self._reader = hiredis.Reader()
        self.waiting: deque[Callback] = deque()
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._progress = 0.0
        self._grace = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, data: bytes, callbacks: list[Callback]) -> None:
        """Write ``data`` (whole commands); each callback gets one reply, in order."""
        if self.closed or self.transport is None:
            error = StoreError("redis: the connection is closed")
            for callback in callbacks:
                callback(error)
            return
        waiting = self.waiting
        if not waiting:
            self._progress = self.loop.time()
            if self._timer is None:
                self._timer = self.loop.call_later(self.timeout, self._check)
        waiting.extend(callbacks)
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiting = self.waiting
        try:
            reply = reader.gets()
            while reply is not False:
                callback = waiting.popleft()
                try:
                    callback(reply)
                except Exception:  # a caller's bug must not desynchronise the stream
                    log.exception("error in a Redis reply callback")
                reply = reader.gets()
        except Exception as exc:  # a protocol error, or a reply nobody asked for
            self._fail(StoreError(f"redis: unreadable reply ({exc})"))
            return
        self._progress = self.loop.time()
        self._grace = False

    def _check(self) -> None:
        self._timer = None
        if self.closed or not self.waiting:
            return
        late = self.loop.time() - self._progress
        if late < self.timeout:
            self._timer = self.loop.call_later(self.timeout - late, self._check)
        elif not self._grace:
            self._grace = True
            self._timer = self.loop.call_later(self.timeout * _GRACE, self._check)
        else:
            self._fail(StoreError(f"redis: no reply within {self.timeout:g}s"))

    def _fail(self, error: StoreError) -> None:
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self.waiting = self.waiting, deque()
        if self.transport is not None:
            self.transport.abort()
        self.on_lost()
        for callback in waiting:
            try:
                callback(error)
            except Exception:
                log.exception("error in a Redis reply callback")

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(StoreError(f"redis: connection lost ({exc or 'closed by the server'})"))

    def close(self) -> None:
        """Close the connection; outstanding callbacks get StoreError."""
        self._fail(StoreError("redis: the connection was closed"))


async def connect(
    loop: asyncio.AbstractEventLoop,
    target: Target,
    first: list[list[bytes]],
    *,
    connect_timeout: float,
    reply_timeout: float,
    on_lost: Callable[[], None],
) -> RespConnection:
    """A connection to ``target`` that has sent its handshake and ``first``
    commands and had an answer that is not an error to each. Raises StoreError."""

    made: list[RespConnection] = []

    def protocol() -> RespConnection:
        conn = RespConnection(loop, reply_timeout, on_lost)
        made.append(conn)
        return conn

    try:
        async with asyncio.timeout(connect_timeout):
            if target.path is not None:
                await loop.create_unix_connection(protocol, target.path)
            else:
                await loop.create_connection(protocol, target.host, target.port)
            conn = made[0]
            commands = target.handshake() + first
            replies: asyncio.Future[list[Any]] = loop.create_future()
            got: list[Any] = []

            def one(reply: Any) -> None:
                got.append(reply)
                if len(got) == len(commands) and not replies.done():
                    replies.set_result(got)

            if commands:
                conn.send(b"".join(pack(c) for c in commands), [one] * len(commands))
                for reply in await replies:
                    if isinstance(reply, Exception):
                        raise StoreError(f"redis: {reply}")
    except BaseException as exc:
        for conn in made:
            conn.close()
        if isinstance(exc, TimeoutError):
            raise StoreError(f"redis: no connection within {connect_timeout:g}s") from None
        if isinstance(exc, OSError):
            raise StoreError(f"redis: cannot connect ({exc})") from exc
        raise
    return conn
