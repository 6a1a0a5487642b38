# The async store's limiter calls of one event loop, batched into EVALSHAs.
#
# A caller hands over an encoded `Item` (stores/_lua.py: the groups of one request)
# and a callback; the pipeline appends the item's bytes to the next batch and,
# when the batch's reply arrives, gives each callback its groups' results (or the
# StoreError of a failed batch). No task, no future, no coroutine per call.
#
# Flush policy -- a lone request is never held for a batch:
#   * nothing in flight: the batch goes out at the end of the current loop pass
#     (call_soon: after the callbacks of this pass, before the loop waits for I/O
#     again), so the requests that arrived in the same pass share it;
#   * a batch in flight (the store is under load): new items wait for its reply
#     and go out together the moment it arrives -- batches grow with the load and
#     a round trip carries many requests;
#   * `max_batch` items waiting: they go out at once, whatever is in flight.
#
# Two carriers with that one policy: `OwnPipeline` writes the batch on a
# RespConnection of its own (a plain redis:// or unix:// URL, hiredis installed);
# `ClientPipeline` awaits the redis-py client's evalsha in a task per batch (Redis
# Cluster -- one EVALSHA per slot --, Sentinel, TLS, a client passed in).
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from .._errors import StoreError
from ._lua import Item, decode_item
from ._resp import RespConnection, Target, connect, pack

__all__ = ["ClientPipeline", "Delivery", "OwnPipeline"]

log = logging.getLogger("stormguard")

# (results per group, TIME stamp) on success, (None, StoreError) on failure.
Delivery = Callable[[Any, Any], None]


def _deliver(batch: Sequence[tuple[Item, Delivery]], reply: Any) -> None:
    # Each item's groups from the batch reply, in order; or the batch's error.
    if isinstance(reply, BaseException):
        error = reply if isinstance(reply, StoreError) else StoreError(f"redis: {reply}")
        for _, callback in batch:
            try:
                callback(None, error)
            except Exception:
                log.exception("error in a limiter callback")
        return
    try:
        stamp = reply[0]
        at = 1
        decoded = []
        for item, callback in batch:
            results, at = decode_item(item.groups, reply, at)
            decoded.append((callback, results))
    except Exception as exc:  # a reply of another shape: nothing was decided for sure
        _deliver(batch, StoreError(f"redis: unexpected limiter reply ({exc!r})"))
        return
    for callback, results in decoded:
        try:
            callback(results, stamp)
        except Exception:
            log.exception("error in a limiter callback")


class _Batching:
    # The flush policy (module notes), whatever carries the batch.
    __slots__ = ("_in_flight", "_pending", "_scheduled", "loop", "max_batch")

    def __init__(self, loop: asyncio.AbstractEventLoop, max_batch: int) -> None:
        self.loop = loop
        self.max_batch = max_batch
        self._pending: list[tuple[Item, Delivery]] = []
        self._in_flight = 0
        self._scheduled = False

    def submit(self, item: Item, callback: Delivery) -> None:
        """Decide ``item`` in a coming batch; ``callback(results, stamp)`` or
        ``callback(None, StoreError)`` runs when its reply is in."""
        pending = self._pending
        pending.append((item, callback))
        if len(pending) >= self.max_batch:
            self._flush()
        elif not self._scheduled and not self._in_flight:
            self._scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        pending = self._pending
        if not pending:
            return
        self._pending = []
        size = self.max_batch
        for start in range(0, len(pending), size):  # more than max_batch: pipelined
            self._in_flight += 1
            self._send(pending[start : start + size] if len(pending) > size else pending)

    def _replied(self, batch: list[tuple[Item, Delivery]], reply: Any) -> None:
        self._in_flight -= 1
        _deliver(batch, reply)
        if self._pending and not self._in_flight and not self._scheduled:
            self._flush()  # what waited for this reply goes out now

    def _send(self, batch: list[tuple[Item, Delivery]]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Fail what is waiting and close the connection."""
        batch, self._pending = self._pending, []
        if batch:
            _deliver(batch, StoreError("redis: the store was closed"))


class OwnPipeline(_Batching):
    """Batches on a :class:`RespConnection` of the pipeline's own."""

    __slots__ = ("_conn", "_connecting", "_script", "connect_timeout", "target", "timeout")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        target: Target,
        script: tuple[str, str],
        *,
        max_batch: int,
        timeout: float,
        connect_timeout: float,
    ) -> None:
        super().__init__(loop, max_batch)
        self.target = target
        self._script = script  # (source, sha1)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._conn: RespConnection | None = None
        self._connecting: asyncio.Task[None] | None = None

    def _send(self, batch: list[tuple[Item, Delivery]]) -> None:
        conn = self._conn
        if conn is None or conn.closed:
            self._in_flight -= 1
            self._pending += batch  # sent once connected
            if self._connecting is None:
                self._connecting = self.loop.create_task(self._connect())
            return
        nkeys = sum(len(item.keys) for item, _ in batch)
        nargs = 1 + sum(len(item.args) for item, _ in batch)
        sha = self._script[1].encode()
        count = b"%d" % nkeys
        head = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$%d\r\n%s\r\n" % (
            3 + nkeys + nargs,
            sha,
            len(count),
            count,
        )
        payload = b"".join(
            [head, *[item.resp_keys for item, _ in batch], b"$1\r\nb\r\n"]
            + [item.resp_args for item, _ in batch]
        )
        conn.send(payload, [partial(self._answer, batch, payload, False)])

    def _answer(
        self, batch: list[tuple[Item, Delivery]], payload: bytes, again: bool, reply: Any
    ) -> None:
        if isinstance(reply, Exception) and str(reply).startswith("NOSCRIPT") and not again:
            # The server forgot the script (SCRIPT FLUSH, a restart behind a proxy):
            # load it and send the same batch once more.
            conn = self._conn
            if conn is not None and not conn.closed:
                load = pack([b"SCRIPT", b"LOAD", self._script[0].encode()])
                conn.send(load + payload, [_ignore, partial(self._answer, batch, payload, True)])
                return
        self._replied(batch, reply)

    async def _connect(self) -> None:
        try:
            source = self._script[0].encode()
            self._conn = await connect(
                self.loop,
                self.target,
                [[b"SCRIPT", b"LOAD", source]],
                connect_timeout=self.connect_timeout,
                reply_timeout=self.timeout,
                on_lost=self._lost,
            )
        except StoreError as exc:
            batch, self._pending = self._pending, []
            _deliver(batch, exc)
        finally:
            self._connecting = None
        if self._pending and not self._scheduled and not self._in_flight:
            self._flush()

    def _lost(self) -> None:
        self._conn = None

    def close(self) -> None:
        super().close()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        if self._connecting is not None:
            self._connecting.cancel()


def _ignore(reply: Any) -> None:
    pass


class ClientPipeline(_Batching):
    """Batches through a redis-py asyncio client (``run``: its script call), in a
    task per batch; on a cluster, one batch per slot (``slot_of``)."""

    __slots__ = ("_run", "_slot_of", "_tasks")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        run: Callable[[list[bytes], list[bytes]], Any],
        slot_of: Callable[[str], int] | None,
        *,
        max_batch: int,
    ) -> None:
        super().__init__(loop, max_batch)
        self._run = run
        self._slot_of = slot_of
        self._tasks: set[asyncio.Task[None]] = set()

    def _send(self, batch: list[tuple[Item, Delivery]]) -> None:
        buckets = [batch]
        slot_of = self._slot_of
        if slot_of is not None:  # one script call per slot (each item is in one slot)
            by_slot: dict[int, list[tuple[Item, Delivery]]] = {}
            for entry in batch:
                by_slot.setdefault(slot_of(entry[0].slot_key), []).append(entry)
            buckets = list(by_slot.values())
        self._in_flight += len(buckets) - 1
        for bucket in buckets:
            task = self.loop.create_task(self._call(bucket))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, batch: list[tuple[Item, Delivery]]) -> None:
        keys = [key for item, _ in batch for key in item.keys]
        args = [b"b", *(arg for item, _ in batch for arg in item.args)]
        try:
            reply = await self._run(keys, args)
        except BaseException as exc:
            self._replied(batch, exc if isinstance(exc, Exception) else StoreError(str(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        self._replied(batch, reply)
