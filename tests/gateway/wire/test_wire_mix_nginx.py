"""The gateway beside nginx, both plain reverse proxies with keep-alive to the SAME
misbehaving raw upstream: two honest clients and a misbehaving third, counted per proxy.

Every request names itself (``?tag=nginx-a17``) and the upstream echoes the tag into the
body (``for-nginx-a17``), so each answer a client reads says which request it answers. The third
client's requests make the upstream misbehave after its answer: a second answer in the
same write (``same_read``), or a second answer written a moment later on the
connection, once it went back to the pool (``late``). A late answer that lands after
the connection was reused cannot always be told from the real one (nginx gives some
out too), so that case is measured against nginx in the same run (issue 24, item 3):
wrong answers of any kind at most 1.5x nginx's, answers meant for another client at
most max(3x nginx's, 10), correct answers at least 0.9x nginx's. In the same-read
case no client may ever get another client's answer. The ``idle`` case runs in rounds
and writes the late answer once the round is over, while every pooled connection is
idle: the gateway must close every such connection (the next round starts once it
did, or after 15 s), and a proxy that keeps such bytes for the next request fails the
same bounds (nginx, which drops the connection, gives out none).

nginx missing: the test is skipped, unless ``STORMGUARD_REQUIRE_NGINX=1`` (CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rawclient import Connection
from rawupstream import CLOSE, Later, Park, RawUpstream, Request, Step

from net_support import free_port, listening, stop_process, wait_started

pytestmark = pytest.mark.slow

HONEST = ("a", "b")
EVIL = "evil"
ROUNDS = 1000  # requests per client per proxy (2,000 honest ones per proxy)
# Every request of the third client makes the upstream answer twice in one write; one
# in LATE_EVERY makes it send a late answer, after one of LATE_DELAYS (spread over the
# time a pooled connection sits idle and the time it is reused). A late answer taken
# for the next request's leaves that connection one answer behind until a proxy
# notices; the upstream closes each connection after CONNECTION_REQUESTS answers (as
# servers cap keep-alive requests), so that how long a poisoned connection lasts is
# bounded and the counts are sums of many short runs, not of a few endless ones.
LATE_EVERY = 10
CONNECTION_REQUESTS = 20
LATE_DELAYS = (0.0, 0.0005, 0.001, 0.002, 0.004)
# The `idle` case runs in rounds: every client sends one request, and once all are
# answered (every pooled connection back in its pool, idle) the upstream writes a late
# answer for each of the third client's requests. A proxy can tell those were never
# asked for and must drop the connection; one that kept the bytes would hand them to
# whichever client's request reuses it next.
IDLE_ROUNDS = 100


def _nginx_or_skip() -> str:
    nginx = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.path.exists(p)), None
    )
    if nginx is None:
        why = "nginx is not installed (Debian package 'nginx'): no peer to measure against"
        if os.environ.get("STORMGUARD_REQUIRE_NGINX") == "1":
            pytest.fail(f"STORMGUARD_REQUIRE_NGINX=1 but {why}")
        pytest.skip(why)
    return nginx


def _answer(tag: str) -> bytes:
    body = f"for-{tag}".encode()
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


_answered: dict[int, int] = {}  # answers per upstream connection (one thread each)


def _script(request: Request) -> Iterable[Step]:
    """Echo the tag; the third client's requests misbehave as their path says."""
    path, _, query = request.target.partition("?")
    tag = query.removeprefix("tag=")
    answer = _answer(tag)
    _answered[request.connection] = count = _answered.get(request.connection, 0) + 1
    if count % CONNECTION_REQUESTS == 0:
        return (answer, CLOSE)
    client = tag.split("-", 1)[-1]
    if not client.startswith(EVIL):
        return (answer,)
    extra = _answer(f"{tag}-extra")  # names the third client's request
    if path.endswith("/same_read"):
        return (answer + extra,)  # two answers in one write
    if path.endswith("/idle"):
        return (answer, Park(extra))  # written when the round is over
    number, rest = divmod(int(client.removeprefix(EVIL)), LATE_EVERY)
    if rest:
        return (answer,)
    return (answer, Later(LATE_DELAYS[number % len(LATE_DELAYS)], extra))


@dataclass
class Counts:
    """What one proxy's clients received."""

    correct: int = 0
    wrong: int = 0  # anything but the request's own complete 200 answer
    foreign: int = 0  # an answer naming another client's request
    kept: int = 0  # (idle case) connections still open 15 s after the late answer
    seen: list[bytes] = field(default_factory=list)  # the first wrong answers' bodies

    def add(self, other: Counts) -> None:
        self.correct += other.correct
        self.wrong += other.wrong
        self.foreign += other.foreign
        self.kept += other.kept
        self.seen += other.seen[: 5 - len(self.seen)]


@dataclass(frozen=True)
class Proxy:
    """A contender: its port and the path prefix that reaches the upstream through it."""

    port: int
    prefix: str


def _client(
    proxy: Proxy,
    name: str,
    client: str,
    scenario: str,
    counts: Counts,
    rounds: threading.Barrier | None,
) -> None:
    port = proxy.port
    conn = Connection(port, timeout=10)
    try:
        for i in range(ROUNDS if rounds is None else IDLE_ROUNDS):
            if rounds is not None and i:
                rounds.wait(timeout=30)  # every client's previous answer is in
            tag = f"{name}-{client}{i}"
            target = f"{proxy.prefix}/{scenario}?tag={tag}"
            conn.send(f"GET {target} HTTP/1.1\r\nHost: mix.test\r\n\r\n".encode())
            try:
                answer = conn.answer()
            except (EOFError, OSError, ValueError):
                counts.wrong += 1  # cut, or no answer: a new connection for the next one
                conn.close()
                conn = Connection(port, timeout=10)
                continue
            if answer.status == 200 and answer.body == f"for-{tag}".encode():
                counts.correct += 1
                continue
            counts.wrong += 1
            counts.seen.append(answer.body[:60])
            prefix = f"for-{name}-".encode()
            if answer.body.startswith(prefix) and not answer.body[len(prefix) :].startswith(
                client.encode()
            ):
                counts.foreign += 1
            if answer.header(b"connection") == b"close":
                conn.close()
                conn = Connection(port, timeout=10)
        if rounds is not None:
            rounds.wait(timeout=30)
    finally:
        conn.close()


def _mix(
    proxies: dict[str, Proxy], scenario: str, upstream: RawUpstream, *, idle: bool = False
) -> dict[str, Counts]:
    """Every proxy's three clients at once; the counts per proxy. ``idle``: in rounds,
    the parked late answers written between two rounds. It starts once the late
    answers of an earlier mix are written and their connections closed."""
    assert upstream.settle() == 0, "a connection that got a late answer is still open"
    totals = {name: Counts() for name in proxies}
    parts: list[tuple[str, Counts]] = []
    threads = []
    rounds = None
    kept: list[bytes] = []  # the late answers of the connections a proxy kept open
    if idle:
        release = upstream.release_parked
        rounds = threading.Barrier(len(proxies) * (len(HONEST) + 1), lambda: kept.extend(release()))
    for name, proxy in proxies.items():
        for client in (*HONEST, EVIL):
            counts = Counts()
            parts.append((name, counts))
            args = (proxy, name, client, scenario, counts, rounds)
            threads.append(threading.Thread(target=_client, args=args, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a client hung"
    for name, counts in parts:
        totals[name].add(counts)
    for data in kept:  # b"...for-callback-evil7-extra": the proxy's name follows "for-"
        totals[data.rpartition(b"for-")[2].split(b"-", 1)[0].decode()].kept += 1
    return totals


def _nginx_conf(directory: Path, port: int, upstream: int) -> Path:
    (directory / "logs").mkdir(parents=True)
    conf = directory / "nginx.conf"
    conf.write_text(
        textwrap.dedent(
            f"""\
            worker_processes 1;
            daemon off;
            pid {directory}/nginx.pid;
            error_log {directory}/logs/error.log crit;
            events {{ worker_connections 1024; }}
            http {{
                access_log off;
                client_body_temp_path {directory}/body;
                proxy_temp_path {directory}/proxy;
                fastcgi_temp_path {directory}/fastcgi;
                uwsgi_temp_path {directory}/uwsgi;
                scgi_temp_path {directory}/scgi;
                upstream backend {{ server 127.0.0.1:{upstream}; keepalive 16; }}
                server {{
                    listen 127.0.0.1:{port};
                    keepalive_requests 100000;
                    location / {{
                        proxy_http_version 1.1;
                        proxy_set_header Connection "";
                        proxy_read_timeout 5s;
                        proxy_pass http://backend;
                    }}
                }}
            }}
            """
        )
    )
    return conf


@pytest.fixture(scope="module")
def upstream(gateway_driver: str) -> Iterator[RawUpstream]:
    """One upstream per chain driver (its record of requests is per gateway)."""
    with RawUpstream(_script) as up:
        yield up


@pytest.fixture(scope="module")
def nginx(upstream: RawUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    nginx = _nginx_or_skip()
    directory = tmp_path_factory.mktemp("nginx")
    port = free_port()
    conf = _nginx_conf(directory, port, upstream.port)
    cmd = [nginx, "-p", str(directory), "-c", str(conf)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_started(lambda: listening(port), proc, "nginx")
        yield Proxy(port, "/mix")
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def proxies(
    upstream: RawUpstream, nginx: Proxy, start_gateway: Callable[[dict[str, Any]], Any]
) -> dict[str, Proxy]:
    """nginx, and the gateway on both its paths: the callback path (a plain route) and
    the ASGI path (an idempotency route)."""
    gateway = start_gateway(
        {
            "access_log": False,  # as nginx's
            "upstreams": {"u": {"url": upstream.url, "timeout": {"read": 5}}},
            "routes": [
                {"path": "/mix", "upstream": "u"},
                {"path": "/mixi", "upstream": "u", "idempotency": "honor"},
            ],
        }
    )
    port = int(gateway.http_port)
    found = {"nginx": nginx, "callback": Proxy(port, "/mix"), "asgi": Proxy(port, "/mixi")}
    for proxy in found.values():  # an answer through each, before the counting starts
        with Connection(proxy.port, timeout=5) as conn:
            conn.send(
                f"GET {proxy.prefix}/warm?tag=w-a0 HTTP/1.1\r\nHost: mix.test\r\n\r\n".encode()
            )
            assert conn.answer().body == b"for-w-a0"
    return found


def test_same_read_second_answer_never_reaches_another_client(
    proxies: dict[str, Proxy], upstream: RawUpstream
) -> None:
    """A second upstream answer in the same write as the third client's: no client of
    the gateway ever gets another client's answer, and it answers as well as nginx."""
    counts = _mix(proxies, "same_read", upstream)
    print(f"same_read: {counts}")
    nginx = counts.pop("nginx")
    for path, gateway in counts.items():
        why = f"{path}: {gateway} against nginx's {nginx}"
        assert gateway.foreign == 0, why
        assert gateway.wrong <= 1.5 * nginx.wrong, why
        assert gateway.correct >= 0.9 * nginx.correct, why


def test_late_answer_relative_to_nginx(proxies: dict[str, Proxy], upstream: RawUpstream) -> None:
    """An unrequested answer after the connection went back to the pool: wrong answers
    at most 1.5x nginx's, another client's at most max(3x nginx's, 10), correct answers
    at least 0.9x nginx's, in the same run."""
    counts = _mix(proxies, "late", upstream)
    print(f"late: {counts}")
    nginx = counts.pop("nginx")
    for path, gateway in counts.items():
        why = f"{path}: {gateway} against nginx's {nginx}"
        assert gateway.wrong <= 1.5 * nginx.wrong, why
        assert gateway.foreign <= max(3 * nginx.foreign, 10), why
        assert gateway.correct >= 0.9 * nginx.correct, why


def test_late_answer_on_an_idle_pooled_connection_relative_to_nginx(
    proxies: dict[str, Proxy], upstream: RawUpstream
) -> None:
    """An unrequested answer written while the connection waits idle in the proxy's pool
    (after every answer of the round was complete): the bounds above, in the same run
    as nginx; the gateway drops such a connection, so it hands no client's answer to
    another."""
    counts = _mix(proxies, "idle", upstream, idle=True)
    print(f"idle: {counts}")
    nginx = counts.pop("nginx")
    for path, gateway in counts.items():
        why = f"{path}: {gateway} against nginx's {nginx}"
        assert gateway.kept == 0, why  # it drops every connection the bytes came on
        assert gateway.wrong <= 1.5 * nginx.wrong, why
        assert gateway.foreign <= max(3 * nginx.foreign, 10), why
        assert gateway.correct >= 0.9 * nginx.correct, why
