# Redis Sentinel: the store's client follows the master the sentinels name.
#
# URL: redis+sentinel://[[user]:password@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]
# (rediss+sentinel:// for TLS to the master). The credentials are the master's; the
# sentinels are asked without them. The client is redis-py's public Sentinel
# (`Sentinel(...).master_for(name)`): its connection pool asks the sentinels for
# the master's address whenever it connects, so after a failover the next
# connection reaches the new master. Calls in between fail -- each limiter then
# answers by its on_store_error, as for a single Redis -- and the first call that
# reaches the new master rejoins.
from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import unquote

from .._errors import ConfigError
from .._extras import require

__all__ = ["SENTINEL_SCHEMES", "SentinelURL", "master_client", "parse_sentinel_url"]

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
_DEFAULT_PORT = 26379


class SentinelURL(NamedTuple):
    """The parts of a ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int
    username: str | None
    password: str | None
    tls: bool


def parse_sentinel_url(url: str) -> SentinelURL:
    """Split a Sentinel URL; :class:`ConfigError` naming ``url`` when it is malformed."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        raise ConfigError("url", f"not a redis+sentinel:// URL: {url!r}")
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, has_password, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if has_password else None
    sentinels = []
    for part in netloc.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon:
            host, port = part.strip(), str(_DEFAULT_PORT)
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError("url", f"each sentinel must be HOST:PORT, got {part!r} in {url!r}")
        sentinels.append((host, int(port)))
    names = [p for p in path.split("/") if p]
    if not names or len(names) > 2:
        raise ConfigError("url", f"expected .../MASTER_NAME[/DB] after the sentinels: {url!r}")
    db = 0
    if len(names) == 2:
        if not names[1].isdigit():
            raise ConfigError("url", f"the database must be a number, got {names[1]!r}")
        db = int(names[1])
    return SentinelURL(
        tuple(sentinels), unquote(names[0]), db, username, password, scheme.lower()[5] == "s"
    )


def master_client(url: str, kwargs: dict[str, Any], *, asyncio: bool) -> Any:
    """A redis-py client of the master named by ``url`` (sync, or ``asyncio``);
    ``kwargs`` go to its connections (timeouts, retry) and, for the timeouts, to the
    sentinels too."""
    parts = parse_sentinel_url(url)
    module = require("redis.asyncio.sentinel" if asyncio else "redis.sentinel", "redis")
    timeouts = {
        name: kwargs[name]
        for name in ("socket_timeout", "socket_connect_timeout")
        if name in kwargs
    }
    sentinel = module.Sentinel(list(parts.sentinels), sentinel_kwargs=dict(timeouts), **timeouts)
    options = dict(kwargs)
    if parts.password is not None:
        options["password"] = parts.password
    if parts.username is not None:
        options["username"] = parts.username
    if parts.tls:
        options["ssl"] = True
    return sentinel.master_for(parts.master, db=parts.db, **options)
