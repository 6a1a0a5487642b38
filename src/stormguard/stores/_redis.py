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
# Every redis-py exception is mapped to StoreError here, at the boundary. Timeouts
# are bounded (0.25 s by default) and redis-py's own retries are switched off, so a
# dead Redis costs a caller at most one connect or read timeout.
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._errors import StoreError
from .._extras import require
from ..core._limiters import Decision, LimitRequest
from . import _lua

if TYPE_CHECKING:
    import redis
    import redis.asyncio

__all__ = ["AsyncRedisStore", "RedisStore"]

_SCRIPTS: dict[str, tuple[str, str]] = {}


def load_script(name: str) -> tuple[str, str]:
    """Return ``(source, sha1)`` of ``lua/<name>.lua``, read once per process."""
    cached = _SCRIPTS.get(name)
    if cached is None:
        if name == _lua.LIMIT_SCRIPT:
            source = _lua.limit_script_source()
        else:
            source = resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")
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
        return f"{type(self).__name__}({self.url!r}, prefix={self.prefix!r})"


class RedisStore(_RedisBase):
    """Shared state in Redis for sync callers (redis-py; hiredis when installed).

    ``socket_timeout`` and ``connect_timeout`` bound every call (seconds); redis-py's
    own retries are off. Extra keyword arguments go to ``redis.Redis.from_url``.
    Every redis error surfaces as :class:`stormguard.StoreError`.
    """

    __slots__ = ("client",)

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
        self.client: redis.Redis = redis_mod.Redis.from_url(
            url, **_client_kwargs(socket_timeout, connect_timeout, redis_kwargs)
        )

    def run_script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run ``lua/<name>.lua`` in one round trip (EVALSHA, EVAL on NOSCRIPT)."""
        source, sha = load_script(name)
        try:
            try:
                return self.client.evalsha(sha, len(keys), *keys, *args)
            except Exception as exc:
                if not _is_noscript(exc):
                    raise
                return self.client.eval(source, len(keys), *keys, *args)
        except Exception as exc:
            raise _store_error(exc) from exc

    def decide(self, requests: Sequence[LimitRequest]) -> list[Decision]:
        """Decide several limits at once, all or nothing, in one round trip."""
        keys, args = _lua.encode(self, requests)
        return _lua.decode(requests, self.run_script(_lua.LIMIT_SCRIPT, keys, args))

    def release(self, request: LimitRequest) -> None:
        """Give back a concurrency lease (no-op when it has expired already)."""
        keys, args = _lua.encode_release(self, request)
        self.run_script(_lua.LIMIT_SCRIPT, keys, args)

    def renew(self, request: LimitRequest) -> bool:
        """Extend a concurrency lease; ``False`` when it had expired already."""
        keys, args = _lua.encode_release(self, request, "renew")
        return int(self.run_script(_lua.LIMIT_SCRIPT, keys, args)) == 1

    def close(self) -> None:
        """Close the connection pool."""
        try:
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
    """Shared state in Redis for asyncio callers; same contract as :class:`RedisStore`."""

    __slots__ = ("client",)

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
        aredis = require("redis.asyncio", "redis")
        retry_mod = require("redis.asyncio.retry", "redis")
        backoff_mod = require("redis.backoff", "redis")
        kwargs = _client_kwargs(socket_timeout, connect_timeout, {})
        kwargs["retry"] = retry_mod.Retry(backoff_mod.NoBackoff(), 0)
        kwargs.update(redis_kwargs)
        self.client: redis.asyncio.Redis = aredis.Redis.from_url(url, **kwargs)

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
        """Decide several limits at once, all or nothing, in one round trip."""
        keys, args = _lua.encode(self, requests)
        return _lua.decode(requests, await self.run_script(_lua.LIMIT_SCRIPT, keys, args))

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
