"""What one ShouldRateLimit call costs in CPU instructions, under callgrind.

    python -m bench rls-instructions [--quick]

Three processes run under valgrind's callgrind, one at a time, and answer the same
two-descriptor RateLimitRequest as ``python -m bench rls`` sends (memory store):

* in-process: the service's Decider called in a loop (the decision alone);
* grpc.aio floor: a bare grpc.aio server answering a fixed RateLimitResponse to the
  same request bytes (what gRPC and the messages cost before any decision);
* service: `stormguard ratelimit-service` itself, called by a grpcio client.

Counters are zeroed, N calls made, counters dumped, for two values of N; the
difference divided by the difference in calls leaves out what does not grow with
them. Instructions do not depend on what else the machine runs: this is the measure
to judge a change of the service's own work by (wall-clock figures: bench rls).

Needs valgrind (Debian package ``valgrind``); else it says so and skips.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_gateway import _free_port, _wait_port
from bench.bench_gateway_instructions import _control
from bench.bench_rls import CONFIG, SRC

CALLS = (500, 1500)  # quick: (200, 600)

IN_PROCESS = """
import asyncio, os, subprocess, sys
from bench.bench_rls import CONFIG, _request
from stormguard.gateway.rls._config import parse_domain
from stormguard.gateway.rls._decide import Decider
from stormguard.stores import MemoryStore
domain = parse_domain(CONFIG)
decider = Decider({domain.name: domain}, MemoryStore())
requests = [_request(n) for n in range(100)]
async def run(n):
    for i in range(n):
        await decider.decide(requests[i % 100])
def control(*args):
    subprocess.run(["callgrind_control", *args, str(os.getpid())], capture_output=True, check=True)
asyncio.run(run(300))
control("-i", "on")
for n in map(int, sys.argv[1:]):
    control("-z")
    asyncio.run(run(n))
    control("-d")
"""

FLOOR = """
import asyncio, sys, grpc, grpc.aio
from stormguard.gateway.rls._pb import rls_pb2
Response = rls_pb2.RateLimitResponse
ANSWER = Response(overall_code=Response.OK, statuses=[{"code": Response.OK}] * 2)
async def answer(request, context):
    return ANSWER
async def main(port):
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    handler = grpc.unary_unary_rpc_method_handler(
        answer,
        request_deserializer=rls_pb2.RateLimitRequest.FromString,
        response_serializer=Response.SerializeToString,
    )
    service = "envoy.service.ratelimit.v3.RateLimitService"
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {"ShouldRateLimit": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()
asyncio.run(main(int(sys.argv[1])))
"""


def _calls(port: int, n: int) -> None:
    import grpc

    from bench.bench_rls import _request
    from stormguard.gateway.rls._pb import rls_pb2

    requests = [_request(i) for i in range(100)]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            request_serializer=rls_pb2.RateLimitRequest.SerializeToString,
            response_deserializer=rls_pb2.RateLimitResponse.FromString,
        )
        for i in range(n):
            call(requests[i % 100], timeout=120)


def _totals(out: Path, pid: int, dumps: int) -> list[int]:
    # The totals of the first `dumps` dumps of process `pid`, in order.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        paths = sorted(
            (p for p in glob.glob(f"{out}.{pid}.*") if p.rsplit(".", 1)[1].isdigit()),
            key=lambda p: int(p.rsplit(".", 1)[1]),
        )
        found = []
        for path in paths[:dumps]:
            lines = [x for x in Path(path).read_text().splitlines() if x.startswith("totals:")]
            if lines:
                found.append(int(lines[0].split()[1]))
        if len(found) == dumps:
            return found
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


def _valgrind(out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p"]


def _served(out: Path, cmd: list[str], port: int, low: int, high: int) -> float:
    # Instructions per call of a server process under callgrind.
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{SRC.parent}", "PYTHONHASHSEED": "0"}
    proc = subprocess.Popen(
        [*_valgrind(out), *cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_port(port, proc, timeout=300)
        _calls(port, 200)  # warm
        _control(proc.pid, "-i", "on")
        _calls(port, 100)
        for n in (low, high):
            _control(proc.pid, "-z")
            _calls(port, n)
            _control(proc.pid, "-d")
        first, second = _totals(out, proc.pid, 2)
    finally:
        proc.terminate()
        proc.wait()
    return (second - first) / (high - low)


def _in_process(out: Path, low: int, high: int) -> float:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{SRC.parent}", "PYTHONHASHSEED": "0"}
    cmd = [*_valgrind(out), sys.executable, "-c", IN_PROCESS, str(low), str(high)]
    subprocess.run(cmd, env=env, capture_output=True, check=True)
    pids = {p.rsplit(".", 2)[1] for p in glob.glob(f"{out}.*.*")}
    (pid,) = pids
    first, second = _totals(out, int(pid), 2)
    return (second - first) / (high - low)


def main(quick: bool = False) -> None:
    """Print instructions per call for the three contenders."""
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian package 'valgrind'): count skipped")
        return
    low, high = (200, 600) if quick else CALLS
    rows: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="stormguard-bench-rls-instr-") as tmp:
        workdir = Path(tmp)
        config = workdir / "bench.yaml"
        config.write_text(CONFIG)
        rows["in-process decision"] = _in_process(workdir / "inproc", low, high)
        port = _free_port()
        floor = [sys.executable, "-c", FLOOR, str(port)]
        rows["grpc.aio floor (fixed answer)"] = _served(workdir / "floor", floor, port, low, high)
        port = _free_port()
        service = [sys.executable, "-c", "from stormguard.cli import main; main()"]
        service += ["ratelimit-service", f"--config={config}", f"--listen=127.0.0.1:{port}"]
        service += ["--admin=off"]
        rows["ratelimit-service"] = _served(workdir / "service", service, port, low, high)
    print(f"instructions per ShouldRateLimit call (memory store, {low} and {high} calls)")
    for name, per in rows.items():
        print(f"{name:32} {per:12,.0f}")
    own = rows["ratelimit-service"] - rows["grpc.aio floor (fixed answer)"]
    print(f"{'service minus the floor':32} {own:12,.0f}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
