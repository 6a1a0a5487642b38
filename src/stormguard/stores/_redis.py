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
# `:suffix` after the closing brace. Limiter keys are `<prefix>{<key>}:<name>`
# (see _lua.py), so one client's limits share a slot.
#
# Redis Cluster: a `redis+cluster://` (`rediss+cluster://`) URL or a
# redis.cluster.RedisCluster / redis.asyncio.cluster.RedisCluster client. Every
# script call then touches one slot: a decision whose keys share a slot (one
# limit, or a group of limits on the same key) is one EVALSHA as on a single
# Redis; a group whose keys span slots (per client + global) is decided slot by
# slot, still all or nothing and never over-admitting (_lua.across_slots). The
# async store's tick batches are split by slot, one EVALSHA per slot.
#
# Connections. The sync store runs scripts on one redis-py Connection per thread
# (created from the client's pool settings, re-created after fork): taking and
# returning a pooled connection costs as much as the round trip on a busy host.
# On a cluster, the cluster client routes each script to its slot's node (its
# sync client is created on first use: it connects when it is built).
# The async store coalesces: the hits that arrive in one event-loop tick go out
# as one EVALSHA carrying every group (each group still all or nothing), so each
# hit costs at most one round trip and 64 concurrent callers share a few.
#
# Every redis-py exception is mapped to StoreError here, at the boundary. Timeouts
# are bounded (0.25 s by default) and redis-py's own retries are switched off, so a
# dead Redis costs a caller at most one connect or read timeout.
from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import os
import threading
import weakref
from collections.abc import Callable, Generator, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .._errors import ConfigError, StoreError
from .._extras import require
from .._scope import AsyncScope, Scope
from ..core._limiters import Algorithm, Decision, LimitRequest
from . import _lua, _pipeline, _resp, _scripts
from ._sentinel import SENTINEL_SCHEMES, master_client

if TYPE_CHECKING:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.cluster

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


def _cluster_url(url: str) -> str | None:
    """``redis://...`` for a ``redis+cluster://...`` URL (rediss too); None otherwise."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("redis+cluster", "rediss+cluster"):
        return f"{scheme.lower().partition('+')[0]}://{rest}"
    return None


def _without_password(url: str) -> str:
    # The URL with its userinfo replaced by *** (several hosts, as Sentinel has, too).
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if not sep or "@" not in netloc or not urlsplit(f"x://{netloc}/").password:
        return url
    return f"{scheme}://***@{netloc.rpartition('@')[2]}{slash}{path}"


def _is_sentinel(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def _is_cluster_client(client: object) -> bool:
    # Either redis-py cluster client (sync or asyncio), without importing them.
    return any(
        cls.__name__ == "RedisCluster" and cls.__module__.startswith("redis.")
        for cls in type(client).__mro__
    )


def _store_error(exc: Exception) -> StoreError:
    err = StoreError(f"redis: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


def _is_reply_error(exc: Exception) -> bool:
    # An error *reply* (script error, NOSCRIPT): the connection is still in sync.
    return any(cls.__name__ == "ResponseError" for cls in type(exc).__mro__)


def _is_noscript(exc: Exception) -> bool:
    return type(exc).__name__ == "NoScriptError" or str(exc).startswith("NOSCRIPT")


def _run_on_client(
    client: Any, source: str, sha: str, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    # A script on a pooled (cluster) client; the async store awaits the same calls.
    try:
        try:
            return client.evalsha(sha, len(keys), *keys, *args)
        except Exception as exc:
            if not _is_noscript(exc):
                raise
        return client.eval(source, len(keys), *keys, *args)
    except Exception as exc:
        raise _store_error(exc) from exc


class _RedisBase:
    __slots__ = ("__weakref__", "_owned", "cluster", "instances", "prefix", "url")

    def __init__(self, url: str, prefix: str, instances: int, cluster: bool, owned: bool) -> None:
        self.url = url
        self.prefix = prefix
        self.instances = instances
        self.cluster = cluster  # a Redis Cluster: each script call stays in one slot
        self._owned = owned  # close() closes the client only if the store made it

    def key(self, *parts: str) -> str:
        """Build a prefixed key ``<prefix>{part1:part2:...}`` (braces: cluster hash tag)."""
        return f"{self.prefix}{{{':'.join(parts)}}}"

    def _slot(self, request: LimitRequest) -> int:
        # The cluster slot of a limit's keys (its hash tag is the limited key).
        key_slot: Callable[[bytes], int] = require("redis.crc", "redis").key_slot
        return key_slot(self.key(request.key).encode())

    def _slot_parts(self, requests: Sequence[LimitRequest]) -> list[list[int]]:
        # Indices of `requests` per cluster slot, in order of first appearance.
        parts: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            parts.setdefault(self._slot(request), []).append(i)
        return list(parts.values())

    def _split(
        self, requests: Sequence[LimitRequest]
    ) -> Generator[_lua.Call, Any, list[Decision]] | None:
        # The slot-by-slot machine, or None when one script call decides the group.
        if self.cluster and len(requests) > 1:
            parts = self._slot_parts(requests)
            if len(parts) > 1:
                return _lua.across_slots(self, requests, parts)
        return None

    def __repr__(self) -> str:
        # Shown in outage log lines: never print a password from the URL.
        return f"{type(self).__name__}({_without_password(self.url)!r}, prefix={self.prefix!r})"


class RedisStore(_RedisBase, Scope):
    """Shared state in Redis for sync callers (redis-py; hiredis when installed).

    ``url`` is a ``redis://``, ``rediss://`` or ``unix://`` URL, a
    ``redis+cluster://host:port`` (``rediss+cluster://``) URL naming one node of a
    Redis Cluster, a ``redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]``
    URL (the master the sentinels name, followed across failovers), or a ready
    ``redis.Redis`` / ``redis.cluster.RedisCluster`` client (which ``close()``
    leaves open). ``socket_timeout`` and
    ``connect_timeout`` bound every call (seconds); redis-py's own retries are off.
    Extra keyword arguments go to ``from_url`` of the redis-py client. Every redis
    error surfaces as :class:`stormguard.StoreError`. Scripts run on one connection
    per calling thread (``client`` keeps its own pool for other uses).

    On a cluster, a decision whose keys share a slot (one limit, or several limits
    on the same key) is one round trip; a group spanning slots (per client + global)
    takes one round trip per slot, still all or nothing and never over-admitting.
    """

    __slots__ = ("_client", "_conns", "_conns_lock", "_factory", "_local", "_pooled")

    def __init__(
        self,
        url: str | redis.Redis | redis.cluster.RedisCluster,
        *,
        prefix: str = "stormguard:",
        socket_timeout: float = 0.25,
        connect_timeout: float = 0.25,
        instances: int = 1,
        **redis_kwargs: Any,
    ) -> None:
        self._client: Any = None
        self._factory: Callable[[], Any] | None = None
        self._pooled = False  # scripts through the client's pool (Sentinel follows failovers)
        if not isinstance(url, str):
            self._client, cluster, owned, text = url, _is_cluster_client(url), False, repr(url)
        else:
            kwargs = _client_kwargs(socket_timeout, connect_timeout, redis_kwargs)
            node_url, owned, text = _cluster_url(url), True, url
            cluster = node_url is not None
            try:
                if _is_sentinel(url):
                    self._client = master_client(url, kwargs, asyncio=False)
                    self._pooled = True
                elif node_url is not None:
                    # The sync cluster client connects when built: build it on first use,
                    # so a store made during an outage follows on_store_error.
                    require("redis.connection", "redis").parse_url(node_url)
                    cluster_cls = require("redis.cluster", "redis").RedisCluster
                    self._factory = functools.partial(cluster_cls.from_url, node_url, **kwargs)
                else:
                    self._client = require("redis", "redis").Redis.from_url(url, **kwargs)
            except ValueError as exc:
                raise ConfigError("url", str(exc)) from exc
        super().__init__(text, prefix, instances, cluster, owned)
        self._local = threading.local()
        self._conns: weakref.WeakSet[Any] = weakref.WeakSet()
        self._conns_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The redis-py client (``redis.Redis``, or ``redis.cluster.RedisCluster``)."""
        client = self._client
        if client is None:
            with self._conns_lock:
                if self._client is None:
                    assert self._factory is not None
                    try:
                        self._client = self._factory()
                    except Exception as exc:
                        raise _store_error(exc) from exc
                client = self._client
        return client

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

    def run_script(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run ``lua/<name>.lua`` in one round trip (EVALSHA, EVAL on NOSCRIPT)."""
        source, sha = load_script(name)
        if self.cluster or self._pooled:
            return _run_on_client(self.client, source, sha, keys, args)
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
        """Decide several limits at once, all or nothing, in one round trip.

        (On a cluster, one round trip per slot when the keys span slots.)
        """
        machine = self._split(requests)
        if machine is not None:
            reply = None
            try:
                while True:
                    reply = self.run_script(_lua.LIMIT_SCRIPT, *machine.send(reply))
            except StopIteration as done:
                decisions: list[Decision] = done.value
                return decisions
        keys, args = _lua.encode(self, requests)
        return _lua.decode(requests, self.run_script(_lua.LIMIT_SCRIPT, keys, args))

    def decide_one(
        self, algorithm: Algorithm, name: str, key: str, cost: float, lease: str = ""
    ) -> Decision:
        """Decide one limit (the hot path of ``RateLimiter.hit``): one EVALSHA."""
        encoded = _lua.piece(self, algorithm, name, key, cost, lease)
        reply = self.run_script(_lua.LIMIT_SCRIPT, encoded.keys, (b"b", b"4", *encoded.args))
        retry = reply[5]
        return _new(
            Decision,
            (
                reply[2] == 1,
                algorithm.limit,
                reply[3] / 1e6,
                reply[4] / 1e6,
                math.inf if retry < 0 else retry / 1e6,
                name,
                algorithm.window,
                (lease or None) if reply[1] == _lua.COMMITTED and cost > 0 else None,
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
        """Close the per-thread connections and the client (if the store made it)."""
        try:
            with self._conns_lock:
                conns, self._conns = list(self._conns), weakref.WeakSet()
                self._local = threading.local()  # every thread starts a fresh connection
            for conn in conns:
                conn.disconnect()
            if self._owned and self._client is not None:
                self._client.close()
        except Exception as exc:
            raise _store_error(exc) from exc

    def _exit(self, exc: BaseException | None) -> None:
        self.close()


class AsyncRedisStore(_RedisBase, AsyncScope):
    """Shared state in Redis for asyncio callers; same contract as :class:`RedisStore`.

    ``url`` may also be a ``redis.asyncio.Redis`` or
    ``redis.asyncio.cluster.RedisCluster`` client. Limiter decisions are batched:
    those that arrive in one event-loop pass while Redis is idle go out together at
    the end of the pass, and those that arrive while a batch is in flight go out
    together when its reply arrives, as one EVALSHA of up to ``max_batch`` requests
    (each still decided all or nothing; on a cluster, one EVALSHA per slot).
    ``max_batch=1`` sends every decision on its own. With a ``redis://`` or
    ``unix://`` URL (and hiredis installed) the decisions travel on a connection of
    the store's own, one per event loop; everything else uses the redis-py client.

    ``socket_timeout`` bounds how long Redis may leave a sent batch unanswered
    (measured from its last reply, so a busy Redis that keeps answering is not
    "down"); ``connect_timeout`` bounds a connect.
    """

    __slots__ = (
        "_connect_timeout",
        "_pipelines",
        "_target",
        "_timeout",
        "client",
        "max_batch",
    )

    def __init__(
        self,
        url: str | redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster,
        *,
        prefix: str = "stormguard:",
        socket_timeout: float = 0.25,
        connect_timeout: float = 0.25,
        instances: int = 1,
        max_batch: int = 128,
        **redis_kwargs: Any,
    ) -> None:
        self._target: _resp.Target | None = None
        if not isinstance(url, str):
            self.client: Any = url
            super().__init__(repr(url), prefix, instances, _is_cluster_client(url), False)
        else:
            retry_mod = require("redis.asyncio.retry", "redis")
            backoff_mod = require("redis.backoff", "redis")
            kwargs = _client_kwargs(socket_timeout, connect_timeout, {})
            kwargs["retry"] = retry_mod.Retry(backoff_mod.NoBackoff(), 0)
            kwargs.update(redis_kwargs)
            node_url = _cluster_url(url)
            try:
                if _is_sentinel(url):
                    self.client = master_client(url, kwargs, asyncio=True)
                elif node_url is not None:
                    cluster_cls = require("redis.asyncio.cluster", "redis").RedisCluster
                    self.client = cluster_cls.from_url(node_url, **kwargs)
                else:
                    self.client = require("redis.asyncio", "redis").Redis.from_url(url, **kwargs)
                    self._target = _own_target(url, redis_kwargs)
            except ValueError as exc:
                raise ConfigError("url", str(exc)) from exc
            super().__init__(url, prefix, instances, node_url is not None, True)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError("max_batch", f"must be an integer >= 1, got {max_batch!r}")
        self.max_batch = max_batch
        self._timeout = float(socket_timeout)
        self._connect_timeout = float(connect_timeout)
        self._pipelines: dict[asyncio.AbstractEventLoop, Any] = {}

    @property
    def own_connection(self) -> bool:
        """Whether limiter decisions travel on the store's own connection."""
        return self._target is not None

    async def run_script(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run ``lua/<name>.lua`` in one round trip (EVALSHA, EVAL on NOSCRIPT)."""
        source, sha = load_script(name)
        try:
            if self.cluster:
                # A no-op once the client knows the cluster; without it, concurrent
                # first calls race redis-py's own initialisation (broken connections).
                await self.client.initialize()
            try:
                return await self.client.evalsha(sha, len(keys), *keys, *args)
            except Exception as exc:
                if not _is_noscript(exc):
                    raise
                return await self.client.eval(source, len(keys), *keys, *args)
        except Exception as exc:
            raise _store_error(exc) from exc

    def pipeline(self, loop: asyncio.AbstractEventLoop) -> Any:
        """The batching of limiter calls on ``loop`` (stores/_pipeline.py)."""
        pipelines = self._pipelines
        found = pipelines.get(loop)
        if found is None:
            for old in [other for other in pipelines if other.is_closed()]:
                del pipelines[old]
            if self._target is not None:
                found = _pipeline.OwnPipeline(
                    loop,
                    self._target,
                    load_script(_lua.LIMIT_SCRIPT),
                    max_batch=self.max_batch,
                    timeout=self._timeout,
                    connect_timeout=self._connect_timeout,
                )
            else:
                slot_of = self._slot_of_key if self.cluster else None
                found = _pipeline.ClientPipeline(
                    loop, self._run_limit, slot_of, max_batch=self.max_batch
                )
            pipelines[loop] = found
        return found

    def submit(self, item: _lua.Item, callback: Any) -> None:
        """Decide an encoded request (:func:`stores._lua.item_of`) in a coming batch:
        ``callback(results, stamp)``, or ``callback(None, StoreError)``, runs from
        the store's callbacks when its reply is in. Call it on the running loop."""
        self.pipeline(asyncio.get_running_loop()).submit(item, callback)

    async def _run_limit(self, keys: list[bytes], args: list[bytes]) -> Any:
        return await self.run_script(_lua.LIMIT_SCRIPT, keys, args)

    def _slot_of_key(self, key: str) -> int:
        key_slot: Callable[[bytes], int] = require("redis.crc", "redis").key_slot
        return key_slot(self.key(key).encode())

    async def adecide(self, requests: Sequence[LimitRequest]) -> list[Decision]:
        """Decide several limits at once, all or nothing, in (at most) one round trip.

        Calls made together share a batch (see the class notes; on a cluster one
        EVALSHA per slot, and one round trip per slot for a group whose keys span
        slots).
        """
        machine = self._split(requests)
        if machine is not None:
            reply = None
            try:
                while True:
                    reply = await self.run_script(_lua.LIMIT_SCRIPT, *machine.send(reply))
            except StopIteration as done:
                decisions: list[Decision] = done.value
                return decisions
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Decision]] = loop.create_future()

        def answered(results: Any, stamp: Any) -> None:
            if future.done():
                return
            if results is None:
                future.set_exception(stamp)
            else:
                future.set_result(results[0][1])

        self.pipeline(loop).submit(_lua.request_item(self, requests), answered)
        return await future

    async def arelease(self, request: LimitRequest) -> None:
        """Give back a concurrency lease (no-op when it has expired already)."""
        keys, args = _lua.encode_release(self, request)
        await self.run_script(_lua.LIMIT_SCRIPT, keys, args)

    async def arenew(self, request: LimitRequest) -> bool:
        """Extend a concurrency lease; ``False`` when it had expired already."""
        keys, args = _lua.encode_release(self, request, "renew")
        return int(await self.run_script(_lua.LIMIT_SCRIPT, keys, args)) == 1

    async def aclose(self) -> None:
        """Close the store's own connections, and the client's pool if it made it."""
        pipelines, self._pipelines = self._pipelines, {}
        for pipeline in pipelines.values():
            pipeline.close()
        if not self._owned:
            return
        try:
            await self.client.aclose()
        except Exception as exc:
            raise _store_error(exc) from exc

    async def _aexit(self, exc: BaseException | None) -> None:
        await self.aclose()


# redis-py options that the store's own connection cannot honour: with any of them,
# decisions go through the redis-py client instead.
_OWN_OPTIONS = frozenset(
    {"socket_timeout", "socket_connect_timeout", "retry", "health_check_interval"}
)


def _own_target(url: str, redis_kwargs: dict[str, Any]) -> _resp.Target | None:
    # The store's own connection serves plain redis:// and unix:// URLs whose query
    # asks for nothing it does not do, with hiredis installed.
    scheme = url.partition("://")[0].lower()
    if scheme not in ("redis", "unix") or "?" in url or set(redis_kwargs) - _OWN_OPTIONS:
        return None
    try:
        require("hiredis", "redis")
    except Exception:
        return None
    return _resp.Target(url)
