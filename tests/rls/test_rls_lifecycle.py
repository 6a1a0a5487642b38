"""Start, check, reload and drain: bad configs never run, reloads swap whole, SIGTERM
lets calls in flight finish."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rls_process import ServiceFactory
from rls_support import codes, request

CLI = [sys.executable, "-c", "from stormguard.cli import main; main()", "ratelimit-service"]
GOOD = """\
domain: life
descriptors:
  - key: client
    rate_limit: {unit: day, requests_per_unit: 2}
"""
BROKEN = """\
domain: life
descriptors:
  - key: client
    rate_limit: {unit: fortnight, requests_per_unit: 2}
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def test_bad_config_never_starts(tmp_path: Path) -> None:
    """A config with errors exits 1 with every error line, and never listens."""
    path = tmp_path / "bad.yaml"
    path.write_text(BROKEN)
    done = _run(f"--config={path}", "--listen=127.0.0.1:1", "--admin=off")
    assert done.returncode == 1
    assert (
        f"{path}:4:18: descriptors.0.rate_limit.unit: invalid rate limit unit 'fortnight'"
        in done.stderr
    )


def test_check_command(tmp_path: Path) -> None:
    """`ratelimit-service check` says ok for a good file, and every error for a bad one."""
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text(BROKEN)
    ok = _run("check", str(good))
    assert ok.returncode == 0 and "ok: 1 domain(s), 1 limit(s)" in ok.stdout
    failed = _run("check", str(good), str(bad))
    assert failed.returncode == 1 and f"{bad}:4:18:" in failed.stderr


def test_workers_need_a_shared_store(tmp_path: Path) -> None:
    """--workers 2 with the memory store is refused, naming --workers."""
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    done = _run(f"--config={path}", "--workers=2")
    assert done.returncode == 2
    assert "--workers" in done.stderr and "redis://" in done.stderr


def test_reload_on_sighup_and_on_change(service_factory: ServiceFactory, eventually: Any) -> None:
    """A changed file applies (SIGHUP or mtime); a broken one is refused, the old stays."""
    service = service_factory(GOOD)
    path = service.configs[0]

    def limit_of(value: str) -> int:
        answer = service.call(request("life", [("client", value)]))
        return int(answer.statuses[0].current_limit.requests_per_unit)

    assert limit_of("a") == 2
    path.write_text(GOOD.replace("requests_per_unit: 2", "requests_per_unit: 7"))
    service.signal(signal.SIGHUP)
    eventually(lambda: limit_of("b") == 7)
    path.write_text(BROKEN)
    service.signal(signal.SIGHUP)
    eventually(lambda: "reload refused; keeping the running configuration" in service.output())
    assert f"{path}:4:18: descriptors.0.rate_limit.unit" in service.output()
    assert limit_of("c") == 7
    path.write_text(GOOD.replace("requests_per_unit: 2", "requests_per_unit: 9"))
    eventually(lambda: limit_of("d") == 9)  # no signal: the file's mtime changed
    assert service.proc is not None and service.proc.poll() is None


@pytest.mark.redis
@pytest.mark.slow
def test_sigterm_drains_calls_in_flight(
    owned_redis: Any, service_factory: ServiceFactory, eventually: Any
) -> None:
    """SIGTERM: /readyz turns 503, the call in flight is answered, the process exits 0."""
    pytest.importorskip("redis")
    flags = (f"--store={owned_redis.url}", "--store-timeout=20", "--drain=20")
    service = service_factory(GOOD, flags=flags)
    assert codes(service.call(request("life", [("client", "warm")])))[0] == "OK"
    redis_process = owned_redis.process  # our own redis-server: we may pause it
    redis_process.send_signal(signal.SIGSTOP)
    try:
        pending = service.future(request("life", [("client", "slow")]))
        eventually(lambda: service.status()["in_flight"] == 1)
        service.signal(signal.SIGTERM)
        eventually(lambda: service.admin("/readyz")[0] == 503)
        assert not pending.done()
    finally:
        redis_process.send_signal(signal.SIGCONT)
    assert codes(pending.result(timeout=30)) == ["OK", "OK"]
    assert service.proc is not None
    assert service.proc.wait(timeout=30) == 0


def test_missing_protobuf_names_the_extra() -> None:
    """Without the protobuf runtime the service's modules say which extra installs it."""
    code = (
        "import sys; sys.modules['google.protobuf'] = None\n"
        "try:\n"
        "    import stormguard.gateway.rls._decide\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "MissingExtra" in done.stdout
    assert "pip install 'stormguard[gateway]'" in done.stdout
