"""A scripted HTTP server on loopback for the adapter tests (imported by conftest).

Each test scripts the responses (status, headers, optional delay) the server plays
in order (the last one repeats) and reads back what arrived: method, path, headers,
body and the monotonic time of each request.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import requests

from stormguard import RetryPolicy, RetryRecord
from stormguard.httpx import RetryTransport
from stormguard.requests import RetryAdapter


@dataclass(frozen=True)
class Step:
    """One scripted response."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    delay: float = 0.0
    # Send only this many bytes of the body (Content-Length still says all), then hang up.
    cut_body_at: int | None = None


@dataclass(frozen=True)
class Received:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


class ScriptedServer:
    """A threading HTTP server that plays a script of responses."""

    def __init__(self) -> None:
        self.steps: list[Step] = [Step()]
        self.received: list[Received] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                """Silence the default stderr logging."""

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = self._read_chunked()
                with server._lock:
                    index = len(server.received)
                    server.received.append(
                        Received(
                            self.command,
                            self.path,
                            dict(self.headers.items()),
                            body,
                            time.monotonic(),
                        )
                    )
                    step = server.steps[min(index, len(server.steps) - 1)]
                if step.delay:
                    time.sleep(step.delay)
                try:
                    self.send_response(step.status)
                    for name, value in step.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(step.body)))
                    self.end_headers()
                    if step.cut_body_at is None:
                        self.wfile.write(step.body)
                    else:
                        self.wfile.write(step.body[: step.cut_body_at])
                        self.wfile.flush()
                        self.close_connection = True
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _read_chunked(self) -> bytes:
                chunks = []
                while True:
                    size = int(self.rfile.readline().strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def script(self, *steps: Step) -> None:
        """Set the responses to play, in order; the last one repeats."""
        with self._lock:
            self.steps = list(steps)
            self.received.clear()

    def close(self) -> None:
        """Stop serving."""
        self._httpd.shutdown()
        self._httpd.server_close()


@dataclass
class Result:
    """What the caller got back."""

    status: int | None
    error: BaseException | None
    records: list[RetryRecord]


Sender = Callable[..., Result]


def send_httpx_sync(
    url: str,
    *,
    method: str = "GET",
    policy: RetryPolicy,
    clock: Any = None,
    idempotency_keys: bool = False,
    headers: dict[str, str] | None = None,
    content: Any = None,
    **options: Any,
) -> Result:
    """One request through httpx.Client + RetryTransport (``options``: its keywords)."""
    records: list[RetryRecord] = []
    transport = RetryTransport(
        policy=policy,
        clock=clock,
        idempotency_keys=idempotency_keys,
        on_retry=records.append,
        **options,
    )
    with httpx.Client(transport=transport, timeout=10) as client:
        try:
            response = client.request(method, url, headers=headers, content=content)
        except httpx.HTTPError as exc:
            return Result(None, exc, records)
        return Result(response.status_code, None, records)


def send_httpx_async(
    url: str,
    *,
    method: str = "GET",
    policy: RetryPolicy,
    clock: Any = None,
    idempotency_keys: bool = False,
    headers: dict[str, str] | None = None,
    content: Any = None,
    **options: Any,
) -> Result:
    """One request through httpx.AsyncClient + RetryTransport."""
    records: list[RetryRecord] = []

    async def go() -> Result:
        transport = RetryTransport(
            policy=policy,
            clock=clock,
            idempotency_keys=idempotency_keys,
            on_retry=records.append,
            **options,
        )
        body = content
        if content is not None and not isinstance(content, bytes):
            chunks = list(content)

            async def agen() -> Any:
                for chunk in chunks:
                    yield chunk

            body = agen()
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            try:
                response = await client.request(method, url, headers=headers, content=body)
            except httpx.HTTPError as exc:
                return Result(None, exc, records)
            return Result(response.status_code, None, records)

    return asyncio.run(go())


def send_requests(
    url: str,
    *,
    method: str = "GET",
    policy: RetryPolicy,
    clock: Any = None,
    idempotency_keys: bool = False,
    headers: dict[str, str] | None = None,
    content: Any = None,
    **options: Any,
) -> Result:
    """One request through requests.Session + RetryAdapter."""
    records: list[RetryRecord] = []
    adapter = RetryAdapter(
        policy=policy,
        clock=clock,
        idempotency_keys=idempotency_keys,
        on_retry=records.append,
        **options,
    )
    with requests.Session() as session:
        session.mount("http://", adapter)
        try:
            response = session.request(method, url, headers=headers, data=content, timeout=10)
        except requests.RequestException as exc:
            return Result(None, exc, records)
        return Result(response.status_code, None, records)
