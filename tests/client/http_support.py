"""A scripted HTTP server on loopback for the adapter tests (imported by conftest).

Each test scripts the responses (status, headers, optional delay) the server plays
in order (the last one repeats) and reads back what arrived: method, path, headers,
body and the monotonic time of each request.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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
