"""Redis killed mid-run: the answers follow `--on-store-error`, never a gRPC error.

Each test starts its own redis-server (`owned_redis`; the shared one is never
stopped), calls the service from a background thread while the server dies, and
checks the answers during the outage and after Redis is back."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from net_support import RedisLike
from rls_process import Service, ServiceFactory
from rls_support import codes, request

pytestmark = [pytest.mark.redis, pytest.mark.slow]
pytest.importorskip("redis")

CONFIG = """\
domain: outage
descriptors:
  - key: client
    rate_limit: {unit: day, requests_per_unit: 4}
"""


def _service(factory: ServiceFactory, redis: RedisLike, mode: str, *extra: str) -> Service:
    flags = (f"--store={redis.url}", f"--on-store-error={mode}", *extra)
    return factory(CONFIG, flags=flags)


def _answers(service: Service, value: str, n: int) -> list[str]:
    return [codes(service.call(request("outage", [("client", value)])))[0] for _ in range(n)]


class Caller(threading.Thread):
    """Calls the service until stopped; keeps every answer and every gRPC error."""

    def __init__(self, service: Service) -> None:
        super().__init__(daemon=True)
        self.service = service
        self.answers: list[str] = []
        self.errors: list[Any] = []
        self.done = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.done.is_set():
            n += 1
            try:
                answer = self.service.call(request("outage", [("client", f"bg{n % 7}")]))
                self.answers.append(codes(answer)[0])
            except grpc.RpcError as exc:
                self.errors.append(exc.code())

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=30)


@pytest.mark.parametrize(
    ("mode", "extra", "during"),
    [
        ("open", (), ["OK"] * 6),  # availability first
        ("closed", (), ["OVER_LIMIT"] * 6),  # protection first
        ("local", (), ["OK"] * 4 + ["OVER_LIMIT"] * 2),  # the whole quota, locally
        ("local", ("--instances=2",), ["OK"] * 2 + ["OVER_LIMIT"] * 4),  # a share of it
    ],
)
def test_answers_follow_on_store_error(
    owned_redis: RedisLike,
    service_factory: ServiceFactory,
    eventually: Any,
    mode: str,
    extra: tuple[str, ...],
    during: list[str],
) -> None:
    """Before: exact; during the outage: the mode's answer; after: exact again."""
    service = _service(service_factory, owned_redis, mode, *extra)
    assert _answers(service, "before", 5) == ["OK"] * 4 + ["OVER_LIMIT"]
    caller = Caller(service)
    caller.start()
    eventually(lambda: len(caller.answers) >= 5)
    owned_redis.stop()
    running = False
    try:
        eventually(lambda: service.status()["store"] == "unavailable")
        assert _answers(service, "during", 6) == during
        eventually(lambda: len(caller.answers) >= 50)
        owned_redis.start()
        running = True
        eventually(lambda: service.status()["store"] == "ok", timeout=20)
    finally:
        if not running:
            owned_redis.start()
        caller.stop()
    assert caller.errors == []  # never a gRPC error of the service's own
    # back on Redis (a fresh one: it keeps nothing on disk), exact again
    assert _answers(service, "after", 5) == ["OK"] * 4 + ["OVER_LIMIT"]


def test_a_dead_redis_at_start_still_answers(
    owned_redis: RedisLike, service_factory: ServiceFactory
) -> None:
    """A service whose Redis is down from the start answers by its mode at once."""
    owned_redis.stop()
    try:
        service = _service(service_factory, owned_redis, "closed")
        assert _answers(service, "x", 2) == ["OVER_LIMIT"] * 2
    finally:
        owned_redis.start()
