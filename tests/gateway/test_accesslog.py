"""The access log written in batches (_accesslog.py): the same JSON lines as one
json.dumps per request, in order, one write per event-loop pass, flushed on close,
bounded -- and the real gateway's lines on both request paths."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from stormguard.gateway._accesslog import AccessLog, Line, mark_default_handlers, render

Factory = Callable[..., Any]


def _old(line: Line) -> str:
    """What the gateway wrote before batching: one json.dumps of a dict, the client
    key named by its SHA-256 prefix, the time in milliseconds."""
    method, route, status, policy, rule, upstream, shadow, path, key, us = line
    client = hashlib.sha256(key.encode()).hexdigest()[:8] if key else ""
    fields: dict[str, Any] = {
        "method": method,
        "path": path,
        "route": route,
        "status": status,
        "policy": policy,
        "client": client,
        "client_rule": rule,
        "upstream": upstream,
        "ms": us / 1000,
    }
    if shadow is not None:
        fields["shadow"] = list(shadow)
    return json.dumps(fields, separators=(",", ":"))


LINES: list[Line] = [
    ("GET", "/", 200, "allowed", "header:X-API-Key", "a", None, "/echo", "h:x-api-key:k", 123),
    ("POST", "-", 404, "not_found", "", "", None, "/x", None, 12000),
    ("GET", "/", 429, "limited:per_client", "ip", "a", None, '/q"\\\n\t', "", 1),
    ("GET", "/", 502, "gateway_error", "", "b", None, "/caf\u00e9/\u2603/\U0001f600", "", 1234500),
    ("GET", "/", 200, "allowed", "ip", "a", ("shadow:trial", "shadow:x"), "/s", "ff", 3250),
    ("GET", "/", 200, "allowed", "ip", "a", (), "/s", "ff", 0),
    ("GET", "/", 200, "allowed", "ip", "a", None, "/s", "ff", 86_400_000_007),
]


def test_every_time_is_rendered_as_json_dumps_renders_it() -> None:
    """Each fraction of a millisecond (0-999 microseconds, and whole seconds beyond)
    reads as json.dumps writes us / 1000."""
    for us in [*range(3000), 999_999, 1_000_000, 123_456_789]:
        line: Line = ("GET", "/", 200, "allowed", "ip", "a", None, "/", None, us)
        assert json.loads(render(line))["ms"] == us / 1000
        assert render(line) == _old(line)


@pytest.mark.parametrize("line", LINES)
def test_a_rendered_line_is_byte_for_byte_the_json_dumps_of_before(line: Line) -> None:
    """render() gives exactly the text json.dumps gave for the same fields, keys in order."""
    assert render(line) == _old(line)


class _Stream(io.StringIO):
    """A stream that counts its writes and can be held (a writer that cannot keep up)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()

    def write(self, text: str) -> int:
        self.entered.set()
        self.open.wait(10)
        self.writes += 1
        return super().write(text)


def _default_logger() -> tuple[logging.Logger, _Stream]:
    """A logger whose one handler is a default-marked "%(message)s" stream handler.

    Built inside the test body: pytest attaches its capture handlers to loggers when the
    test starts, and a second handler rightly sends the lines through logging."""
    stream = _Stream()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    mark_default_handlers([handler])
    logger = logging.Logger(f"stormguard.test.access.{id(stream)}", logging.INFO)
    logger.propagate = False
    logger.addHandler(handler)
    return logger, stream


def _lines(n: int) -> list[Line]:
    return [("GET", "/", 200, "allowed", "ip", "a", None, f"/{i}", "", i) for i in range(n)]


def test_lines_of_several_passes_are_one_write_in_order() -> None:
    """Lines added over several event-loop passes reach the stream in one write, in
    order, and nothing is rendered or written on the request path."""
    logger, stream = _default_logger()
    access = AccessLog(logger, interval=60)

    async def main() -> None:
        for batch in range(3):
            for line in _lines(50)[batch * 10 : batch * 10 + 10]:
                access.add(line)
            await asyncio.sleep(0)
        assert len(access._pending) == 30 and stream.writes == 0

    asyncio.run(main())
    access.close()
    assert stream.writes == 1
    assert stream.getvalue() == "".join(render(line) + "\n" for line in _lines(50)[:30])


@pytest.mark.parametrize("knob", ["interval", "batch"])
def test_a_batch_goes_to_the_writer_after_interval_or_at_batch_lines(knob: str) -> None:
    """A batch is written without close(): once ``interval`` has passed (here 0), or
    as soon as it holds ``batch`` lines."""
    logger, stream = _default_logger()
    settings = {"interval": 0.0} if knob == "interval" else {"interval": 60, "batch": 4}
    access = AccessLog(logger, **settings)

    async def main() -> None:
        for line in _lines(4):
            access.add(line)
        if knob == "interval":
            assert access._pending  # waiting for the timer
            for _ in range(10):  # call_later(0) runs in one of the next passes
                await asyncio.sleep(0)
        assert not access._pending  # handed to the writer thread
        assert stream.entered.wait(10)

    asyncio.run(main())
    access.close()
    assert stream.writes == 1
    assert stream.getvalue().splitlines() == [render(line) for line in _lines(4)]


def test_close_writes_the_lines_still_pending() -> None:
    """Lines added just before shutdown are written by close(), none lost."""
    logger, stream = _default_logger()
    access = AccessLog(logger, interval=60)

    async def main() -> None:
        for line in _lines(3):
            access.add(line)
        access.close()  # before the batch is due

    asyncio.run(main())
    assert stream.getvalue().splitlines() == [render(line) for line in _lines(3)]


def test_lines_over_the_bound_are_dropped_and_counted() -> None:
    """While the writer is stuck at most ``max_backlog`` lines wait; the rest are dropped,
    counted, and the lines kept are written in order once it moves again."""
    logger, stream = _default_logger()
    drops: list[int] = []
    access = AccessLog(logger, batch=1, max_backlog=5, on_drop=drops.append)
    stream.open.clear()
    lines = _lines(12)
    access.add(lines[0])  # the first batch: the writer takes it and is stuck
    assert stream.entered.wait(10)
    for line in lines[1:]:  # 4 more fit beside it; 7 are over the bound
        access.add(line)
    assert access.dropped == 7 and sum(drops) == 7
    stream.open.set()
    access.close()
    assert stream.getvalue().splitlines() == [render(line) for line in lines[:5]]


def test_a_users_handler_gets_one_record_per_line_in_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With a handler of the user's (not the gateway's default) the lines go through
    logging, one record each, in order, when their batch is due."""
    logger = logging.getLogger("stormguard.test.access.user")
    access = AccessLog(logger, interval=60)

    async def main() -> None:
        with caplog.at_level(logging.INFO, logger=logger.name):
            for line in LINES:
                access.add(line)
            await asyncio.sleep(0)
            assert not caplog.records
            access.flush()

    asyncio.run(main())
    access.close()
    assert [r.getMessage() for r in caplog.records] == [render(line) for line in LINES]


def _access_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"method"')]


def test_the_gateway_logs_every_request_in_order_on_both_paths_and_at_stop(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """A real gateway logs GETs (callback path) and POSTs (ASGI path) in the order they
    ended, with the pinned fields, and every line is in its output after SIGTERM."""
    up = upstream_factory()
    config: dict[str, Any] = {
        "clients": {"key": ["header:X-API-Key", "ip"]},
        "upstreams": {"a": {"url": up.url}},
        "routes": [{"path": "/", "upstream": "a"}],
    }
    gw = gateway_factory(config)
    sent = []
    with httpx.Client(timeout=10) as client:
        for i in range(20):
            if i % 2:
                r = client.post(f"{gw.url}/echo/{i}", content=b"x", headers={"X-API-Key": "k"})
                sent.append(("POST", f"/echo/{i}"))
            else:
                r = client.get(f"{gw.url}/echo/{i}", headers={"X-API-Key": "k"})
                sent.append(("GET", f"/echo/{i}"))
            assert r.status_code == 200
    gw.stop()
    lines = _access_lines(gw.output())
    assert [(line["method"], line["path"]) for line in lines] == sent
    assert list(lines[0]) == [
        "method",
        "path",
        "route",
        "status",
        "policy",
        "client",
        "client_rule",
        "upstream",
        "ms",
    ]
    assert {(line["status"], line["policy"], line["client_rule"]) for line in lines} == {
        (200, "allowed", "header:X-API-Key")
    }
    named = hashlib.sha256(b"h:x-api-key:k").hexdigest()[:8]  # on both paths alike
    assert {line["client"] for line in lines} == {named}


def test_dropped_access_lines_are_a_metric(
    upstream_factory: Factory, gateway_factory: Factory
) -> None:
    """/metrics carries the count of access lines dropped over the bound (0 here)."""
    up = upstream_factory()
    gw = gateway_factory(
        {"upstreams": {"a": {"url": up.url}}, "routes": [{"path": "/", "upstream": "a"}]}
    )
    assert httpx.get(f"{gw.url}/echo").status_code == 200
    _, metrics = gw.admin("/metrics")
    assert b"stormguard_gateway_access_log_dropped_total 0.0" in metrics
