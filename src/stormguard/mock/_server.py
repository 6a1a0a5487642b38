# The socket side of the mock: asyncio streams + h11 for HTTP/1.1, so that faults
# can do what a well-behaved server framework never would — reset the connection
# before any response, close it silently, send a broken chunked body, or hold it
# open until the client gives up. The Planner (_faults.py) decides; this plays.
#
# MockServer runs in-process on a background thread with its own event loop
# (start()/stop(), context manager, `.url`), or in the foreground from the CLI
# (`serve_forever()`). It listens on loopback unless told otherwise.
#
# Bounded by construction: a request head must arrive within `header_timeout`
# seconds of the server starting to wait for it (a fresh connection, or the end of
# the previous answer on a kept-alive one) and its body within `body_timeout` more;
# otherwise the connection is closed (with a 408 when part of a request had come).
# At most `max_connections` are served at once (more get a 503 and are closed),
# each holding at most a 64 KiB head and a 16 MiB body.
#
# What the journal says was sent was sent: when an answer cannot be written (h11
# refuses it, or the socket is gone) the entry says `send-failed` with the reason.
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import h11

from .._errors import ConfigError
from .._scope import Scope
from ._checker import Checker, Report
from ._faults import Plan, Planner
from ._journal import MockState, attempt_of
from ._scenario import Scenario, load_scenario, parse_scenario

__all__ = ["MockServer"]

logger = logging.getLogger("stormguard.mock")

ADMIN_PREFIX = "/__mock/"
_MAX_BODY = 16 * 1024 * 1024
_MAX_HEAD = 64 * 1024


class _ReadTimeout(Exception):
    """The client did not finish sending its request in time."""

    def __init__(self, started: bool) -> None:
        super().__init__("request read timed out")
        self.started = started  # part of a request had arrived: answer 408


def _coerce(scenario: Scenario | Mapping[str, Any] | str | Path) -> Scenario:
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, Mapping):
        return parse_scenario(scenario)
    return load_scenario(scenario)


class MockServer(Scope):
    """A fault-injection HTTP/1.1 server playing a scenario.

    >>> with MockServer({"routes": [{"match": {"path": "/ping"}}]}) as mock:
    ...     httpx.get(mock.url + "/ping").status_code
    200

    ``scenario`` is a :class:`Scenario`, a dict, or a path to a YAML/TOML file.
    ``port=0`` picks a free port; ``.url`` is the base URL once started.
    ``seed`` overrides the scenario's seed for probabilities and delays.
    ``on_request`` is called (on the server's thread) with a copy of each journal
    entry once its answer is complete.

    ``header_timeout`` (seconds, default 30) bounds the wait for a request's head,
    counted from the moment the server waits for it (a new connection, or the end
    of the previous answer); ``body_timeout`` (default 60) bounds the time for its
    body after the head. A request not complete in time gets a 408 (nothing when
    nothing had arrived) and its connection is closed. ``max_connections`` (default
    1024) caps connections served at once; more are answered 503 and closed.
    """

    def __init__(
        self,
        scenario: Scenario | Mapping[str, Any] | str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int | None = None,
        on_request: Callable[[dict[str, Any]], None] | None = None,
        header_timeout: float = 30.0,
        body_timeout: float = 60.0,
        max_connections: int = 1024,
    ) -> None:
        for name, value in (("header_timeout", header_timeout), ("body_timeout", body_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(name, f"must be a number of seconds > 0, got {value!r}")
        if isinstance(max_connections, bool) or not (
            isinstance(max_connections, int) and max_connections >= 1
        ):
            raise ConfigError(
                "max_connections", f"must be an integer >= 1, got {max_connections!r}"
            )
        self.header_timeout = float(header_timeout)
        self.body_timeout = float(body_timeout)
        self.max_connections = max_connections
        self.scenario = _coerce(scenario)
        self.on_request = on_request
        self.host = host
        self.port = port
        self._state = MockState()
        self._planner = Planner(self.scenario, self._state, seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._stopped: asyncio.Event | None = None

    # --- the Python API -------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321`` (valid once started)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def journal(self) -> list[dict[str, Any]]:
        """A copy of the journal: one dict per request, in arrival order."""
        return self._state.journal()

    @property
    def open_connections(self) -> int:
        """Connections being served right now."""
        return len(self._connections)

    def ledger(self) -> dict[str, dict[str, int]]:
        """A copy of the ledger: ``{resource: {key or request id: side effects}}``."""
        return self._state.ledger_copy()

    def reset(self) -> None:
        """Forget journal, ledger, sequence positions and rate limits."""
        self._planner.reset()

    def check(self, **options: Any) -> Report:
        """Run the retry-contract checker on the journal (options of ``Checker``)."""
        return Checker(**options).check(self.journal())

    def start(self) -> MockServer:
        """Start serving on a background thread; returns once the port is bound."""
        if self._thread is not None:
            raise RuntimeError("MockServer already started")
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_until_complete(self._wait_stopped())
            finally:
                loop.run_until_complete(self._close())
                loop.close()

        self._thread = threading.Thread(target=run, name="stormguard-mock", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        """Stop serving, drop open connections and join the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        stopped = self._stopped
        if stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopped.set)
        thread.join(timeout=10)
        self._thread = None
        self._loop = None

    def _enter(self) -> None:
        self.start()

    def _exit(self, exc: BaseException | None) -> None:
        self.stop()

    async def serve_forever(self, ready: Callable[[], None] | None = None) -> None:
        """Serve in the current event loop until cancelled (used by the CLI).

        ``ready`` is called once the port is bound (``.url`` is then valid).
        """
        await self._open()
        if ready is not None:
            ready()
        try:
            await self._wait_stopped()
        finally:
            await self._close()

    # --- lifecycle -------------------------------------------------------------

    async def _open(self) -> None:
        self._stopped = asyncio.Event()
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        sockets = self._server.sockets
        if sockets:
            self.port = int(sockets[0].getsockname()[1])

    async def _wait_stopped(self) -> None:
        assert self._stopped is not None
        await self._stopped.wait()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=1)

    # --- connections ------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self.max_connections:
            await _close_with(writer, b"503 Service Unavailable", b"Retry-After: 1\r\n")
            return
        self._connections.add(task)
        try:
            await self._connection(reader, writer)
        except _ReadTimeout as exc:
            if exc.started:  # part of a request came: say why it is dropped
                await _close_with(writer, b"408 Request Timeout")
            else:
                _abort(writer)
        except h11.RemoteProtocolError:
            # Not HTTP/1.1 we can parse: answer 400 when we still can, then close.
            await _close_with(writer, b"400 Bad Request")
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            _abort(writer)
        except Exception:
            logger.exception("stormguard mock: error while serving a connection")
            _abort(writer)
        finally:
            self._connections.discard(task)
            if not writer.is_closing():
                writer.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)
        peer = writer.get_extra_info("peername")
        peer_host = str(peer[0]) if isinstance(peer, tuple) else "unknown"
        while True:
            request = await _read_request(conn, reader, self.header_timeout, self.body_timeout)
            if request is None:
                return
            head, body = request
            keep_open = await self._serve(conn, reader, writer, head, body, peer_host)
            if not keep_open or conn.our_state is not h11.DONE:
                return
            if conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _serve(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head: h11.Request,
        body: bytes,
        peer_host: str,
    ) -> bool:
        target = head.target.decode("latin-1")
        path, _, query = target.partition("?")
        method = head.method.decode("ascii").upper()
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1") for name, value in head.headers
        }
        if path.startswith(ADMIN_PREFIX):
            status, payload = self._admin(method, path)
            await _send(conn, writer, status, [("Content-Type", "application/json")], payload)
            return True
        plan = self._planner.plan(
            method=method,
            path=path,
            query=query,
            client=headers.get("x-client-id") or peer_host,
            idempotency_key=headers.get("idempotency-key"),
            attempt=attempt_of(headers),
            body_sha256=hashlib.sha256(body).hexdigest(),
        )
        try:
            return await self._play(conn, reader, writer, plan)
        finally:
            self._planner.finish(plan)
            if self.on_request is not None:
                try:
                    self.on_request(dict(plan.entry))
                except Exception:
                    logger.exception("stormguard mock: on_request hook failed")

    async def _play(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        plan: Plan,
    ) -> bool:
        if plan.delay > 0 and await _client_left_during(conn, reader, plan.delay):
            # The client gave up (its timeout) before the answer: nothing is sent.
            # A side effect already decided stays: "processed, answer lost".
            self._planner.client_gone(plan)
            _abort(writer)
            return False
        action = plan.action
        if action in ("reset", "commit-then-reset"):
            _reset(writer)
            return False
        if action == "empty":
            writer.close()
            return False
        if action == "malformed-chunked":
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                b'5\r\n{"id"\r\nzz-not-a-chunk-size\r\n\r\n'
            )
            await writer.drain()
            writer.close()
            return False
        if action == "hang":
            # Hold the connection until the client closes it (its timeout) or the
            # server stops; whatever the client sends meanwhile is ignored.
            while await reader.read(65536):
                pass
            _abort(writer)
            return False
        head = plan.entry["method"] == "HEAD"
        try:
            await _send(conn, writer, plan.status, plan.headers, plan.body, head=head)
        except Exception as exc:
            # h11 refused the answer (a header it will not write) or the socket is
            # gone: the journal must not claim it was sent.
            self._planner.send_failed(plan, f"{type(exc).__name__}: {exc}")
            _abort(writer)
            return False
        return True

    # --- admin API ----------------------------------------------------------------

    def _admin(self, method: str, path: str) -> tuple[int, bytes]:
        name = path[len(ADMIN_PREFIX) :].strip("/")
        if method == "GET" and name == "journal":
            return 200, json.dumps(self.journal()).encode()
        if method == "GET" and name == "ledger":
            return 200, json.dumps(self.ledger()).encode()
        if method == "POST" and name == "reset":
            self.reset()
            return 200, b'{"reset":true}'
        if method == "GET" and name == "check":
            return 200, json.dumps(self.check().to_dict()).encode()
        return 404, json.dumps({"error": f"unknown admin endpoint {method} {path}"}).encode()


async def _read_request(
    conn: h11.Connection,
    reader: asyncio.StreamReader,
    header_timeout: float,
    body_timeout: float,
) -> tuple[h11.Request, bytes] | None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + header_timeout
    head: h11.Request | None = None
    started = False
    chunks: list[bytes] = []
    size = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise _ReadTimeout(started)
            try:
                data = await asyncio.wait_for(reader.read(65536), remaining)
            except TimeoutError:
                raise _ReadTimeout(started) from None
            started = started or bool(data)
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            head = event
            deadline = loop.time() + body_timeout
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > _MAX_BODY:
                raise h11.RemoteProtocolError("request body too large")
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return head, b"".join(chunks)
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


async def _client_left_during(
    conn: h11.Connection, reader: asyncio.StreamReader, seconds: float
) -> bool:
    # Wait `seconds`, watching the socket: True as soon as the client closes it.
    # Bytes that arrive meanwhile (a pipelined request) are handed to h11, which
    # keeps them for the next cycle.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (remaining := deadline - loop.time()) > 0:
        try:
            data = await asyncio.wait_for(reader.read(65536), remaining)
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        if not data:
            return True
        conn.receive_data(data)
    return False


async def _send(
    conn: h11.Connection,
    writer: asyncio.StreamWriter,
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    *,
    head: bool = False,
) -> None:
    names = {name.lower() for name, _ in headers}
    out = [(name, value) for name, value in headers if name.lower() != "content-length"]
    if status in (204, 304):
        body = b""  # these never carry a body (RFC 9110 15.3.5, 15.4.5)
    else:
        out.append(("Content-Length", str(len(body))))
    if "server" not in names:
        out.append(("Server", "stormguard-mock"))
    data = conn.send(h11.Response(status_code=status, headers=out)) or b""
    if body and not head:  # a HEAD answer has the GET headers and no body
        data += conn.send(h11.Data(data=body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    writer.write(data)
    await writer.drain()


async def _close_with(writer: asyncio.StreamWriter, status: bytes, headers: bytes = b"") -> None:
    # An answer written by hand (the connection is not in a state h11 can answer
    # from), then the connection is dropped.
    with contextlib.suppress(Exception):
        writer.write(
            b"HTTP/1.1 "
            + status
            + b"\r\nContent-Length: 0\r\n"
            + headers
            + b"Connection: close\r\n\r\n"
        )
        await writer.drain()
    _abort(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    # SO_LINGER with a zero timeout makes close() send RST instead of FIN: the
    # client sees "connection reset by peer", not a clean end of stream.
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    _abort(writer)


def _abort(writer: asyncio.StreamWriter) -> None:
    transport = writer.transport
    with contextlib.suppress(Exception):
        transport.abort()
