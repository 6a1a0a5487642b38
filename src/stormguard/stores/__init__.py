"""Where limiter (and breaker/budget) state lives when it is shared.

``MemoryStore`` keeps it in this process; ``RedisStore`` / ``AsyncRedisStore`` keep
it in Redis so a fleet shares one quota. ``from_url`` picks one from a URL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

from .._errors import ConfigError
from ._memory import MemoryStore

if TYPE_CHECKING:
    from ._redis import AsyncRedisStore, RedisStore

__all__ = ["AsyncRedisStore", "MemoryStore", "RedisStore", "from_url"]

_REDIS_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)


def __getattr__(name: str) -> Any:
    # The Redis stores import redis-py lazily so `import stormguard` needs only the
    # standard library.
    if name in ("RedisStore", "AsyncRedisStore"):
        from . import _redis

        return getattr(_redis, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@overload
def from_url(
    url: str, *, asyncio: Literal[False] = ..., **kwargs: Any
) -> MemoryStore | RedisStore: ...
@overload
def from_url(
    url: str, *, asyncio: Literal[True], **kwargs: Any
) -> MemoryStore | AsyncRedisStore: ...
def from_url(
    url: str, *, asyncio: bool = False, **kwargs: Any
) -> MemoryStore | RedisStore | AsyncRedisStore:
    """A store for ``url``: ``memory://``, ``redis://``, ``rediss://``, ``unix://``,
    ``redis+cluster://host:port`` / ``rediss+cluster://host:port`` for a Redis
    Cluster (any one node; the client discovers the others), or
    ``redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]`` for the master
    a set of Redis Sentinels names (it follows failovers; see docs/stores/sentinel.md).

    ``asyncio=True`` returns an :class:`AsyncRedisStore` for Redis URLs. Keyword
    arguments go to the store (``max_keys`` for memory; ``prefix``, timeouts and
    redis-py options for Redis).
    """
    scheme = url.partition("://")[0].lower()
    if scheme == "memory":
        return MemoryStore(**kwargs)
    if scheme in _REDIS_SCHEMES:
        from ._redis import AsyncRedisStore, RedisStore

        return AsyncRedisStore(url, **kwargs) if asyncio else RedisStore(url, **kwargs)
    raise ConfigError("url", f"scheme must be memory, {', '.join(_REDIS_SCHEMES)}; got {url!r}")
