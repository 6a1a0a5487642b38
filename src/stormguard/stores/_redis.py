# Redis stores. Every decision is one Lua script run on the server (EVALSHA, with
# EVAL as the fallback when the server answers NOSCRIPT, e.g. after a restart), so
# a decision is one round trip and reads Redis' own clock (TIME) instead of the
# gateway's: gateways with skewed clocks still agree.
#
# Scripts live in stores/lua/*.lua and ship as package data; they are read once
# with importlib.resources and their SHA1 computed locally, so the first call of a
# script on a fresh server costs one EVAL and every later call one EVALSHA.
#
# Keys: `key(*parts)` gives `<prefix>{part1:part2:...}`. The braces are a Redis
# Cluster hash tag; a script that needs companion keys in the same slot appends
# `:suffix` after the closing brace.
#
# Connections. The sync store runs scripts on one redis-py Connection per thread
# (created from the client's pool settings, re-created after fork): taking and
# returning a pooled connection costs as much as the round trip on a busy host.
# The async store coalesces: the hits that arrive in one event-loop tick go out
# as one EVALSHA carrying every group (each group still all or nothing), so each
# hit costs at most one round trip and 64 concurrent callers share a few.
#
# Every redis-py exception is mapped to StoreError here, at the boundary. Timeouts
# are bounded (0.25 s by default) and redis-py's own retries are switched off, so a
# dead Redis costs a caller at most one connect or read timeout.
from __future__ import annotations

import asyncio
import hashlib
import math
import os
import threading
import weakref
from collections.abc import Sequence
from importlib import resources
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .._errors import ConfigError, StoreError
from .._extras import require
from ..core._limiters import Algorithm, Decision, LimitRequest
from . import _lua, _scripts

if TYPE_CHECKING:
    import redis
    import redis.asyncio

__all__ = ["AsyncRedisStore", "RedisStore"]

_new = tuple.__new__

_SCRIPTS: dict[str, tuple[str, str]] = {}


def load_script(name: str) -> tuple[str, str]:
    """Return ``(source, sha1)`` of ``lua/<name>.lua``, read once per process."""
    cached = _SCRIPTS.get(name)
    if cached is None:
        if name == _lua.LIMIT_SCRIPT:
            source = _lua.limit_script_source()
        else:
            source = _scripts.script_source(resources.files(__package__).joinpath("lua"), name)
        cached = (source, hashlib.sha1(source.encode("utf-8")).hexdigest())
        _SCRIPTS[name] = cached
    return cached


def _client_kwargs(
    socket_timeout: float, connect_timeout: float, redis_kwargs: dict[str, Any]
) -> dict[str, Any]:
    retry_mod = require("redis.retry", "redis")
    backoff_mod = require("redis.backoff", "redis")
    kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        # No hidden retries: the limiter's on_store_error decides what an outage
        # means, and a caller never waits more than one timeout.
        "retry": retry_mod.Retry(backoff_mod.NoBackoff(), 0),
    }
    kwargs.update(redis_kwargs)
    return kwargs


def _store_error(exc: Exception) -> StoreError:
    err = StoreError(f"redis: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


def _is_reply_error(exc: Exception) -> bool:
    # An error *reply* (script error, NOSCRIPT): the connection is still in sync.
    return any(cls.__name__ == "ResponseError" for cls in type(exc).__mro__)


def _is_noscript(exc: Exception) -> bool:
    return type(exc).__name__ == "NoScriptError" or str(exc).startswith("NOSCRIPT")


class _RedisBase:
    __slots__ = ("__weakref__", "instances", "prefix", "url")

    def __init__(self, url: str, prefix: str, instances: int) -> None:
        self.url = url
        self.prefix = prefix
        self.instances = instances

    def key(self, *parts: str) -> str:
        """Build a prefixed key ``<prefix>{part1:part2:...}`` (braces: cluster hash tag)."""
        return f"{self.prefix}{{{':'.join(parts)}}}"

    def __repr__(self) -> str:
        # Shown in outage log lines: never print a password from the URL.
        parts = urlsplit(self.url)
        url = self.url
        if parts.password:
            url = parts._replace(netloc=f"***@{parts.hostname}:{parts.port or 6379}").geturl()
        return f"{type(self).__name__}({url!r}, prefix={self.prefix!r})"


class RedisStore(_RedisBase):
    """Shared state in Redis for sync callers (redis-py; hiredis when installed).

    ``socket_timeout`` and ``connect_timeout`` bound every call (seconds); redis-py's
    own retries are off. Extra keyword arguments go to ``redis.Redis.from_url``.
    Every redis error surfaces as :class:`stormguard.StoreError`. Scripts run on one
    connection per calling thread (``client`` keeps its own pool for other uses).
    """

    __slots__ = ("_conns", "_conns_lock", "_local", "_params", "client")

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "stormguard:",
        socket_timeout: float = 0.25,
        connect_timeout: float = 0.25,
        instances: int = 1,
        **redis_kwargs: Any,
    ) -> None:
        super().__init__(url, prefix, instances)
        redis_mod = require("redis", "redis")
        try:
            self.client: redis.Redis = redis_mod.Redis.from_url(
                url, **_client_kwargs(socket_timeout, connect_timeout, redis_kwargs)
            )
        except ValueError as exc:
            raise ConfigError("url", str(exc)) from exc
        self._params: dict[Algorithm, tuple[str, str, str]] = {}
        self._local = threading.local()
        self._conns: weakref.WeakSet[Any] = weakref.WeakSet()
        self._conns_lock = threading.Lock()

    def _connection(self) -> Any:
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            pool = self.client.connection_pool
            conn = pool.connection_class(**pool.connection_kwargs)
            local.conn, local.pid = conn, os.getpid()
            with self._conns_lock:
                self._conns.add(conn)
        return conn

    def run_script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run ``lua/<name>.lua`` in one round trip (EVALSHA, EVAL on NOSCRIPT)."""
        source, sha = load_script(name)
        conn = self._connection()
        try:
            conn.send_command("EVALSHA", sha, len(keys), *keys, *args)
            try:
                return conn.read_response()
            except Exception as exc:
                if not _is_noscript(exc):
                    raise
            conn.send_command("EVAL", source, len(keys), *keys, *args)
            return conn.read_response()
        except Exception as exc:
            if not _is_reply_error(exc):
                conn.disconnect()  # the stream may be mid-reply: start clean next time
            raise _store_error(exc) from exc

    def decide(self, requests: Sequence[LimitRequest]) -> list[Decision]:
        """Decide several limits at once, all or nothing, in one round trip."""
        keys, args = _lua.encode(self, requests)
        return _lua.decode(requests, self.run_script(_lua.LIMIT_SCRIPT, keys, args))

    def decide_one(
        self, algorithm: Algorithm, name: str, key: str, cost: float, lease: str = ""
    ) -> Decision:
        """Decide one limit (the hot path of ``RateLimiter.hit``): one EVALSHA."""
        params = self._params.get(algorithm)
        if params is None:
            first, second = algorithm.params()
            params = self._params[algorithm] = (algorithm.kind, repr(first), repr(second))
        skey = f"{self.prefix}{{{name}:{key}}}"
        reply = self.run_script(
            _lua.LIMIT_SCRIPT, (skey, skey + ":aux"), ("hit", 1, 1, *params, repr(cost), lease)
        )
        retry = reply[4]
        return _new(
            Decision,
            (
                reply[1] == 1,
                algorithm.limit,
                reply[2] / 1e6,
                reply[3] / 1e6,
                math.inf if retry < 0 else retry / 1e6,
                name,
                algorithm.window,
                (lease or None) if reply[0] == 1 and cost > 0 else None,
                (),
            ),
        )

    def release(self, request: LimitRequest) -> None:
        """Give back a concurrency lease (no-op when it has expired already)."""
        keys, args = _lua.encode_release(self, request)
        self.run_script(_lua.LIMIT_SCRIPT, keys, args)

    def renew(self, request: LimitRequest) -> bool:
        """Extend a concurrency lease; ``False`` when it had expired already."""
        keys, args = _lua.encode_release(self, request, "renew")
        return int(self.run_script(_lua.LIMIT_SCRIPT, keys, args)) == 1

    def close(self) -> None:
        """Close the per-thread connections and the connection pool."""
        try:
            with self._conns_lock:
                conns, self._conns = list(self._conns), weakref.WeakSet()
                self._local = threading.local()  # every thread starts a fresh connection
            for conn in conns:
                conn.disconnect()
            self.client.close()
        except Exception as exc:
            raise _store_error(exc) from exc

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncRedisStore(_RedisBase):
    """Shared state in Redis for asyncio callers; same contract as :class:`RedisStore`.

    Limiter hits issued in the same event-loop tick are sent as one EVALSHA of up to
    ``max_batch`` requests (each still decided all or nothing); ``max_batch=1``
    sends every hit on its own (needed if a proxy splits keys across cluster slots).
    """

    __slots__ = ("_pending", "_tasks", "client", "max_batch")

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "stormguard:",
        socket_timeout: float = 0.25,
        connect_timeout: float = 0.25,
        instances: int = 1,
        max_batch: int = 128,
        **redis_kwargs: Any,
    ) -> None:
        super().__init__(url, prefix, instances)
        aredis = require("redis.asyncio", "redis")
        retry_mod = require("redis.asyncio.retry", "redis")
        backoff_mod = require("redis.backoff", "redis")
        kwargs = _client_kwargs(socket_timeout, connect_timeout, {})
        kwargs["retry"] = retry_mod.Retry(backoff_mod.NoBackoff(), 0)
        kwargs.update(redis_kwargs)
        try:
            self.client: redis.asyncio.Redis = aredis.Redis.from_url(url, **kwargs)
        except ValueError as exc:
            raise ConfigError("url", str(exc)) from exc
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError("max_batch", f"must be an integer >= 1, got {max_batch!r}")
        self.max_batch = max_batch
        self._pending: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def run_script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run ``lua/<name>.lua`` in one round trip (EVALSHA, EVAL on NOSCRIPT)."""
        source, sha = load_script(name)
        try:
            try:
                return await self.client.evalsha(sha, len(keys), *keys, *args)
            except Exception as exc:
                if not _is_noscript(exc):
                    raise
                return await self.client.eval(source, len(keys), *keys, *args)
        except Exception as exc:
            raise _store_error(exc) from exc

    async def adecide(self, requests: Sequence[LimitRequest]) -> list[Decision]:
        """Decide several limits at once, all or nothing, in (at most) one round trip.

        Calls made in the same event-loop tick are sent together as one EVALSHA.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Decision]] = loop.create_future()
        pending = self._pending.get(loop)
        if pending is None:
            pending = self._pending[loop] = []
            loop.call_soon(self._flush, loop)
        pending.append((requests, future))
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._pending.pop(loop, [])
        for start in range(0, len(batch), self.max_batch):
            task = loop.create_task(self._send(batch[start : start + self.max_batch]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(
        self, batch: list[tuple[Sequence[LimitRequest], asyncio.Future[list[Decision]]]]
    ) -> None:
        groups = [requests for requests, _ in batch]
        try:
            keys, args = _lua.encode_batch(self, groups)
            results = _lua.decode_batch(
                groups, await self.run_script(_lua.LIMIT_SCRIPT, keys, args)
            )
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    error = StoreError(str(exc)) if isinstance(exc, Exception) else exc
                    error.__cause__ = exc
                    future.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), decisions in zip(batch, results):
            if not future.done():
                future.set_result(decisions)

    async def arelease(self, request: LimitRequest) -> None:
        """Give back a concurrency lease (no-op when it has expired already)."""
        keys, args = _lua.encode_release(self, request)
        await self.run_script(_lua.LIMIT_SCRIPT, keys, args)

    async def arenew(self, request: LimitRequest) -> bool:
        """Extend a concurrency lease; ``False`` when it had expired already."""
        keys, args = _lua.encode_release(self, request, "renew")
        return int(await self.run_script(_lua.LIMIT_SCRIPT, keys, args)) == 1

    async def aclose(self) -> None:
        """Close the connection pool."""
        try:
            await self.client.aclose()
        except Exception as exc:
            raise _store_error(exc) from exc

    async def __aenter__(self) -> AsyncRedisStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
