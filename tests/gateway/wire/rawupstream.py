"""A raw recording upstream and a raw client for the wire conformance tests.

:class:`RawUpstream` listens on a free 127.0.0.1 port (one thread per connection),
logs exactly the bytes each connection receives, and answers each request from a
script: ``script(request) -> steps``, where a step is bytes to write, ``Drip(data)``
(written one byte at a time), ``Pause(seconds)``, ``CLOSE``, ``HOLD`` (write nothing
more; the connection stays open), ``Later(seconds, data)`` (bytes written on the
same connection after the answer, while it is idle: an unrequested late answer) or
``Park(data)`` (bytes kept until the test calls :meth:`RawUpstream.release_parked`,
when it knows the proxy holds the connection idle in its pool).

:func:`exchange` is the raw client: it sends bytes to the gateway and reads one
answer with h11 (the answer's status, headers and body, and whether it was cut).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import h11

__all__ = [
    "CLOSE",
    "HOLD",
    "Answer",
    "Drip",
    "Later",
    "Park",
    "Pause",
    "RawUpstream",
    "Request",
    "exchange",
]


@dataclass(frozen=True)
class Drip:
    """Bytes written one at a time."""

    data: bytes


@dataclass(frozen=True)
class Pause:
    """A pause between writes (a slow upstream, not a test's wait)."""

    seconds: float


@dataclass(frozen=True)
class Later:
    """Bytes written ``seconds`` after the answer on the same (idle) connection."""

    seconds: float
    data: bytes


@dataclass(frozen=True)
class Park:
    """Bytes written on the same connection when the test releases them."""

    data: bytes


CLOSE = "close"
HOLD = "hold"
Step = bytes | Drip | Pause | Later | Park | str


@dataclass
class Request:
    """One request as the upstream received it."""

    connection: int  # which connection (0, 1, ... in accept order)
    raw: bytes  # its exact bytes, head and body
    method: str
    target: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> list[str]:
        """The values of header ``name`` (case-insensitive)."""
        return [v for k, v in self.headers if k.lower() == name.lower()]


@dataclass
class Connection:
    """One accepted connection: every byte it received, and whether it is closed."""

    index: int
    received: bytearray = field(default_factory=bytearray)
    closed: threading.Event = field(default_factory=threading.Event)


Script = Callable[[Request], Iterable[Step]]


class RawUpstream:
    """A recording upstream on 127.0.0.1; ``with RawUpstream(script) as up: up.port``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections: list[Connection] = []
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._open: list[socket.socket] = []
        self._parked: list[tuple[socket.socket, Connection, bytes]] = []
        self._later: list[tuple[threading.Timer, Connection]] = []

    def __enter__(self) -> RawUpstream:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop listening and close every connection."""
        self._stopping = True
        try:  # wakes the thread blocked in accept() (close alone does not, on Linux)
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            for conn in self._open:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def seen(self, target: str) -> list[Request]:
        """The requests received for ``target`` (path and query), in order."""
        with self._lock:
            return [r for r in self.requests if r.target == target]

    def wait_closed(self, connection: int, timeout: float = 5.0) -> bool:
        """Whether the gateway closes connection number ``connection`` within ``timeout``."""
        return self.connections[connection].closed.wait(timeout)

    def release_parked(self, within: float = 15.0) -> list[bytes]:
        """Write every parked step's bytes now; wait (up to ``within`` seconds in all)
        for the peers to close those connections. The bytes of each connection the
        peer kept open. (A peer that keeps such a connection makes the whole wait; one
        that drops it ends it at once. On a loaded machine the bytes may reach the
        peer's socket, and its loop, some time after the write returns: until then
        they are not yet bytes that came while the connection was idle.)"""
        with self._lock:
            parked, self._parked = self._parked, []
        for sock, _, data in parked:
            _send_quietly(sock, data)
        deadline = time.monotonic() + within
        return [
            data
            for _, conn, data in parked
            if not conn.closed.wait(max(0.0, deadline - time.monotonic()))
        ]

    def settle(self, within: float = 15.0) -> int:
        """Wait (up to ``within`` seconds in all) until every ``Later`` step so far has
        been written and each connection that got one is closed, by the peer or by the
        script. How many are still open. (A late answer the peer took for the next
        request's leaves that connection one answer behind until bytes come while it
        is idle, which every proxy drops: a test calls this so that one test's late
        bytes, written late on a loaded machine, never land in the next test's
        requests.)"""
        with self._lock:
            later, self._later = self._later, []
        deadline = time.monotonic() + within
        for timer, _ in later:
            timer.join(max(0.0, deadline - time.monotonic()))
        return sum(not conn.closed.wait(max(0.0, deadline - time.monotonic())) for _, conn in later)

    # -- the server ---------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopping:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                conn = Connection(len(self.connections))
                self.connections.append(conn)
                self._open.append(sock)
            thread = threading.Thread(target=self._serve, args=(sock, conn), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, sock: socket.socket, conn: Connection) -> None:
        buffer = b""
        try:
            while True:
                request, buffer = self._read_request(sock, conn, buffer)
                if request is None:
                    return
                with self._lock:
                    self.requests.append(request)
                if not self._answer(sock, request):
                    return
        except OSError:
            return
        finally:
            conn.closed.set()
            sock.close()

    def _read_request(
        self, sock: socket.socket, conn: Connection, buffer: bytes
    ) -> tuple[Request | None, bytes]:
        while b"\r\n\r\n" not in buffer:
            data = sock.recv(65536)
            if not data:
                return None, buffer
            conn.received += data
            buffer += data
        head, _, rest = buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = [tuple(p.strip() for p in line.split(":", 1)) for line in lines[1:]]
        pairs = [(k, v) for k, v in headers]
        length = next((int(v) for k, v in pairs if k.lower() == "content-length"), 0)
        chunked = any(k.lower() == "transfer-encoding" for k, _ in pairs)
        while True:
            if chunked and b"0\r\n\r\n" in rest:
                end = rest.index(b"0\r\n\r\n") + 5
                break
            if not chunked and len(rest) >= length:
                end = length
                break
            data = sock.recv(65536)
            if not data:
                return None, buffer
            conn.received += data
            rest += data
        raw = head + b"\r\n\r\n" + rest[:end]
        return Request(conn.index, raw, method, target, pairs), rest[end:]

    def _answer(self, sock: socket.socket, request: Request) -> bool:
        """Play the script's steps; False when the connection is done."""
        for step in self.script(request):
            if isinstance(step, bytes):
                sock.sendall(step)
            elif isinstance(step, Drip):
                for i in range(len(step.data)):
                    sock.sendall(step.data[i : i + 1])
                    time.sleep(0.001)
            elif isinstance(step, Pause):
                time.sleep(step.seconds)
            elif isinstance(step, Later):
                timer = threading.Timer(step.seconds, _send_quietly, (sock, step.data))
                timer.daemon = True
                with self._lock:
                    self._later.append((timer, self.connections[request.connection]))
                timer.start()
            elif isinstance(step, Park):
                with self._lock:
                    self._parked.append((sock, self.connections[request.connection], step.data))
            elif step == CLOSE:
                sock.shutdown(socket.SHUT_RDWR)
                return False
            elif step == HOLD:
                continue
        return True


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


# -- the raw client -----------------------------------------------------------------------


@dataclass
class Answer:
    """What the client received: status 0 when no answer head came at all."""

    status: int = 0
    reason: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    complete: bool = False  # the whole answer arrived (else it was cut)
    raw: bytes = b""  # every byte received

    def header(self, name: bytes) -> list[bytes]:
        """The values of header ``name`` (lower-case)."""
        return [v for k, v in self.headers if k == name]


def exchange(
    port: int,
    data: bytes,
    *,
    sock: socket.socket | None = None,
    method: str = "GET",
    timeout: float = 10.0,
) -> Answer:
    """Send ``data`` to 127.0.0.1:``port`` (or on ``sock``) and read one answer."""
    own = sock is None
    if sock is None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.settimeout(timeout)
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method=method, target="/", headers=[("host", "x")]))
    client.send(h11.EndOfMessage())
    answer = Answer()
    try:
        sock.sendall(data)
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    return answer
                answer.raw += chunk
                client.receive_data(chunk)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                answer.status, answer.reason = event.status_code, event.reason
                answer.headers = list(event.headers)
            elif isinstance(event, h11.Data):
                answer.body += event.data
            elif isinstance(event, h11.EndOfMessage):
                answer.complete = True
                return answer
            else:  # ConnectionClosed before any answer
                return answer
    except h11.RemoteProtocolError:
        return answer
    finally:
        if own:
            sock.close()
