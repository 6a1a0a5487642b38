"""Helpers of the protection tests: Redis stores whose scripts run on a fake clock."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from stormguard.testing import FakeClock

# The scripts of the shared protection objects take one test-only argument after
# their own: `now`, so they run on the fake clock instead of Redis' TIME. Only this
# wrapper passes it; the library never does.
FAKE_TIME_SCRIPTS = frozenset(
    {"breaker_acquire", "breaker_record", "breaker_force_open", "breaker_reset"}
    | {"budget", "cooldown"}
)


# These stores test shared state, not a slow Redis: on a loaded CI machine a connect
# can take longer than the 0.25 s default, and the breaker then rightly decides
# locally, which is not what these tests look at. The fallback tests pass their own.
GENEROUS_TIMEOUTS = {"socket_timeout": 10.0, "connect_timeout": 10.0}


def fake_time_redis_store(url: str, prefix: str, clock: FakeClock, **kwargs: Any) -> Any:
    """A RedisStore whose protection scripts read ``clock`` instead of Redis' clock."""
    from stormguard.stores import RedisStore

    class FakeTimeRedisStore(RedisStore):
        def run_script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
            if name in FAKE_TIME_SCRIPTS:
                args = [*args, repr(clock.monotonic())]
            return super().run_script(name, keys, args)

    return FakeTimeRedisStore(url, prefix=prefix, **{**GENEROUS_TIMEOUTS, **kwargs})


def fake_time_async_redis_store(url: str, prefix: str, clock: FakeClock, **kwargs: Any) -> Any:
    """The AsyncRedisStore twin of :func:`fake_time_redis_store`."""
    from stormguard.stores import AsyncRedisStore

    class FakeTimeAsyncRedisStore(AsyncRedisStore):
        async def run_script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
            if name in FAKE_TIME_SCRIPTS:
                args = [*args, repr(clock.monotonic())]
            return await super().run_script(name, keys, args)

    return FakeTimeAsyncRedisStore(url, prefix=prefix, **{**GENEROUS_TIMEOUTS, **kwargs})


StoreFactory = Callable[[], Any]


def run_threads(target: Callable[..., Any], count: int, timeout: float = 30.0) -> None:
    """Run ``target(i)`` for i in range(count), each in its own thread, and wait for all."""
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
