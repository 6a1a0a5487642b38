# Scenario `occ`: optimistic-concurrency contention, the model of the AWS
# Architecture Blog post "Exponential Backoff And Jitter" (2015).
#
# The model
# ---------
# One server holds one row with a version. `read` returns the version; `write(v)`
# succeeds only if v is the current version, which it then increments. The server
# takes no time and has no capacity limit. Every one-way message takes
# |Normal(10, 2)| time units, drawn independently. N clients start at t = 0; each
# wants one successful write: read, on the reply send the write at once; on a
# failed write count `attempt += 1` (the first retry has attempt = 1) and send the
# next read after sleeping backoff(attempt). Base 5, cap 2000:
#     none          0
#     exponential   min(cap, base * 2**attempt)
#     full          uniform(0, that)
#     equal         that/2 + uniform(0, that/2)
#     decorrelated  min(cap, uniform(base, 3 * sleep)), sleep starting at base
# calls = writes the server processed (reads not counted); time = when the last
# client receives its success reply.
#
# The same backoffs as the library
# --------------------------------
# The library counts failures n = 1, 2, ... and draws under min(cap, base*2**(n-1)).
# After the client's attempt-th failed write it has failed n = attempt times, but
# the model sleeps under base*2**attempt: the model's attempt a is the library's
# failures n = a + 1 (the first retry sleeps under 2*base = 10). `library_backoff`
# gives the library object for each strategy and `run_events` calls
# `.delay(attempt + 1, rng, previous)` on it. The fast engine draws the same
# formulas with numpy (`sleep_draws`); tests/sim/test_occ.py feeds both the same
# uniforms and checks the values are identical.
#
# Two engines, one model
# ----------------------
# `run_events` is the straightforward event loop: a heapq of messages (read
# arrives, read reply, write arrives, write reply, wake-up), one event at a time.
# It is the reference, and the baseline in bench/bench_sim.py.
#
# `run_batch` is the fast engine. Only writes decide anything: a read at server
# time r sees the version at r, so a write arriving at w succeeds exactly when no
# write succeeded in (r, w). Each client has one write in flight; when it fails,
# the client's next write arrives at w + c where c = reply + sleep + read request
# + read reply + write request, all drawn in advance (c > 0). So with
#     H = min over clients of (w + c)
# every in-flight write with w < H can be decided before any new write exists, in
# w order: the first write whose read came after the last success succeeds (its
# read is after every earlier success, since each read precedes its own write),
# that success becomes the last one, and so on; every other write in the batch
# fails. A batch holds most of the fleet under contention: 190 clients without
# backoff (8,000 writes a run) take about 100 rounds of array operations, over
# 100 runs side by side (arrays of runs x clients, the finished clients' columns
# dropped as the fleet shrinks). tests/sim/test_sim_occ.py replays the decided
# writes one by one in time order and checks every verdict. Configurations run
# in parallel worker processes, each with its own seed stream, so results do not
# depend on the worker count.
from __future__ import annotations

import heapq
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError
from ..core._backoff import (
    Backoff,
    DecorrelatedJitter,
    EqualJitter,
    Exponential,
    FullJitter,
    NoBackoff,
)
from ._engine import numpy, seed_words

__all__ = [
    "BASE",
    "CAP",
    "EVENTS_PER_CALL",
    "STRATEGIES",
    "OccRow",
    "library_backoff",
    "run_batch",
    "run_events",
    "sleep_draws",
    "summarise",
    "sweep",
]

BASE = 5.0
CAP = 2000.0
MESSAGE_MEAN = 10.0
MESSAGE_SD = 2.0
STRATEGIES = ("none", "exponential", "full", "equal", "decorrelated")
# Each write cycle is four messages: read request, read reply, write request,
# write reply. Events per second are counted in these messages.
EVENTS_PER_CALL = 4


def library_backoff(strategy: str) -> Backoff:
    """The stormguard backoff object the model's strategy stands for."""
    if strategy == "none":
        return NoBackoff()
    if strategy == "exponential":
        return Exponential(BASE, CAP)
    if strategy == "full":
        return FullJitter(BASE, CAP)
    if strategy == "equal":
        return EqualJitter(BASE, CAP)
    if strategy == "decorrelated":
        return DecorrelatedJitter(BASE, CAP)
    raise ConfigError("strategy", f"expected one of {STRATEGIES}, got {strategy!r}")


def sleep_draws(strategy: str, attempt: Any, previous: Any, uniform: Any) -> Any:
    """Vectorised sleeps: the library's formulas for failures ``attempt + 1``.

    ``attempt`` (model attempt, >= 1), ``previous`` (the client's last sleep, base at
    first) and ``uniform`` (draws in [0, 1)) are numpy arrays of the same shape.
    ``uniform(a, b)`` is ``a + (b - a) * u`` exactly as ``random.Random.uniform``.
    """
    np = numpy()
    if strategy == "none":
        return np.zeros(np.shape(uniform))
    if strategy == "decorrelated":
        last = np.maximum(previous, BASE)
        return np.minimum(CAP, BASE + (3.0 * last - BASE) * uniform)
    # min(cap, base * 2**(n-1)) with n = attempt + 1; exp2 is exact on integers.
    ceiling = np.minimum(CAP, BASE * np.exp2(np.minimum(attempt, 1023)))
    if strategy == "exponential":
        return ceiling
    if strategy == "full":
        return 0.0 + (ceiling - 0.0) * uniform
    if strategy == "equal":
        half = ceiling / 2.0
        return half + (half - 0.0) * uniform
    raise ConfigError("strategy", f"expected one of {STRATEGIES}, got {strategy!r}")


# -- the reference engine: a plain heapq of messages ------------------------------

_READ_AT_SERVER, _READ_REPLY, _WRITE_AT_SERVER, _WRITE_REPLY, _WAKE = range(5)


def run_events(strategy: str, clients: int, rng: random.Random) -> tuple[int, float]:
    """One run, message by message, calling the library backoff: (calls, time)."""
    backoff = library_backoff(strategy)
    gauss = rng.gauss

    def message() -> float:
        return abs(gauss(MESSAGE_MEAN, MESSAGE_SD))

    version = 0
    seen = [0] * clients  # version each client read
    attempt = [0] * clients
    previous: list[float | None] = [None] * clients
    queue: list[tuple[float, int, int, int, bool]] = []
    seq = 0
    for client in range(clients):
        queue.append((message(), seq, _READ_AT_SERVER, client, False))
        seq += 1
    heapq.heapify(queue)
    calls = 0
    last_reply = 0.0
    while queue:
        now, _, kind, client, ok = heapq.heappop(queue)
        if kind == _READ_AT_SERVER:
            seen[client] = version  # the version the reply carries
            heapq.heappush(queue, (now + message(), seq, _READ_REPLY, client, False))
        elif kind == _READ_REPLY:
            heapq.heappush(queue, (now + message(), seq, _WRITE_AT_SERVER, client, False))
        elif kind == _WRITE_AT_SERVER:
            calls += 1
            ok = seen[client] == version
            if ok:
                version += 1
            heapq.heappush(queue, (now + message(), seq, _WRITE_REPLY, client, ok))
        elif kind == _WRITE_REPLY:
            if ok:
                last_reply = now
            else:
                attempt[client] += 1
                sleep = backoff.delay(attempt[client] + 1, rng, previous[client])
                previous[client] = sleep
                heapq.heappush(queue, (now + sleep, seq, _WAKE, client, False))
        else:  # _WAKE
            heapq.heappush(queue, (now + message(), seq, _READ_AT_SERVER, client, False))
        seq += 1
    return calls, last_reply


# -- the fast engine: batches of writes, runs side by side -----------------------


def run_batch(
    strategy: str, clients: int, runs: int, seed_seq: Any, *, trace: list[Any] | None = None
) -> tuple[Any, Any]:
    """``runs`` independent runs at once: arrays (calls per run, time per run).

    With ``trace``, every decided write is appended as arrays ``(run, read time,
    write time, succeeded)``, one tuple per round, so a test can replay them.
    """
    np = numpy()
    library_backoff(strategy)  # validates the name
    # SFC64: a fast, well-tested generator; the normal draws are the largest cost.
    rng = np.random.Generator(np.random.SFC64(seed_seq))
    shape = (runs, clients)
    inf = math.inf

    def message(size: Any) -> Any:
        return np.abs(rng.normal(MESSAGE_MEAN, MESSAGE_SD, size))

    read = message(shape)  # server time of the read behind each write in flight
    write = read + message(shape) + message(shape)  # server time of that write
    attempt = np.ones(shape)  # the model's attempt number should this write fail
    # Drawn in advance for the cycle after a failure of the write in flight:
    # reply = the write's reply; to_read = reply + sleep + read request (the next
    # read's server time is write + to_read); cycle = to_read + read reply +
    # write request (the next write's server time is write + cycle).
    reply = message(shape)
    sleep = sleep_draws(strategy, attempt, np.full(shape, BASE), rng.random(shape))
    to_read = reply + sleep + message(shape)
    cycle = to_read + message(shape) + message(shape)
    calls = np.zeros(runs, dtype=np.int64)
    finish = np.zeros(runs)
    last_success = np.full(runs, -inf)
    rows = np.arange(runs)
    width = clients
    rounds = 0
    while True:
        rounds += 1
        if rounds % 4 == 0:
            # Finished clients hold write = inf. Clients are interchangeable, so
            # every row is reordered to put its waiting clients first and the
            # columns nobody needs any more are dropped: the arrays shrink as
            # the fleet finishes.
            active = int(np.isfinite(write).sum(axis=1).max())
            if active == 0:
                break
            if active <= 0.75 * width:
                order = np.argsort(write, axis=1)[:, :active]
                read, write, attempt, reply, sleep, to_read, cycle = (
                    np.take_along_axis(column, order, axis=1)
                    for column in (read, write, attempt, reply, sleep, to_read, cycle)
                )
                width = active
        horizon = np.min(write + cycle, axis=1)
        batch = write < horizon[:, None]
        sizes = batch.sum(axis=1)
        if not sizes.any():
            break
        calls += sizes
        if trace is not None:
            decided = batch.copy()
            snapshot = (read.copy(), write.copy())
        live = rows[sizes > 0]
        while live.size:
            candidates = batch[live] & (read[live] > last_success[live, None])
            first = np.where(candidates, write[live], inf).argmin(axis=1)
            hit = candidates[np.arange(live.size), first]
            live, first = live[hit], first[hit]
            won = write[live, first]
            last_success[live] = won
            finish[live] = np.maximum(finish[live], won + reply[live, first])
            batch[live, first] = False
            write[live, first] = inf
            read[live, first] = inf
            cycle[live, first] = 0.0
        if trace is not None:
            where = np.nonzero(decided)
            trace.append((where[0], snapshot[0][where], snapshot[1][where], ~batch[where]))
        failed = np.flatnonzero(batch)
        count = failed.size
        if count:
            # Flat views (the arrays are contiguous) indexed by position.
            write_, read_, attempt_ = write.reshape(-1), read.reshape(-1), attempt.reshape(-1)
            reply_, sleep_ = reply.reshape(-1), sleep.reshape(-1)
            to_read_, cycle_ = to_read.reshape(-1), cycle.reshape(-1)
            was = write_[failed]
            read_[failed] = was + to_read_[failed]
            write_[failed] = was + cycle_[failed]
            next_attempt = attempt_[failed] + 1
            attempt_[failed] = next_attempt
            new_reply = message(count)
            reply_[failed] = new_reply
            new_sleep = sleep_draws(strategy, next_attempt, sleep_[failed], rng.random(count))
            sleep_[failed] = new_sleep
            new_to_read = new_reply + new_sleep + message(count)
            to_read_[failed] = new_to_read
            cycle_[failed] = new_to_read + message(count) + message(count)
    return calls, finish


# -- the sweep ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OccRow:
    """One line of occ.csv (``writes`` is the total over all runs, for event counts)."""

    strategy: str
    clients: int
    runs: int
    calls_mean: float
    calls_sd: float
    time_mean: float
    time_sd: float
    writes: int


def summarise(strategy: str, clients: int, calls: Any, times: Any) -> OccRow:
    """Mean and sample standard deviation (ddof=1) over the runs."""
    np = numpy()
    runs = len(calls)
    ddof = 1 if runs > 1 else 0
    return OccRow(
        strategy=strategy,
        clients=clients,
        runs=runs,
        calls_mean=float(np.mean(calls)),
        calls_sd=float(np.std(calls, ddof=ddof)),
        time_mean=float(np.mean(times)),
        time_sd=float(np.std(times, ddof=ddof)),
        writes=int(np.sum(calls)),
    )


def _task(args: tuple[str, int, int, int]) -> OccRow:
    np = numpy()
    strategy, clients, runs, seed = args
    seed_seq = np.random.SeedSequence(seed_words(seed, "occ", strategy, clients))
    calls, times = run_batch(strategy, clients, runs, seed_seq)
    return summarise(strategy, clients, calls, times)


def _cost(task: tuple[str, int, int, int]) -> float:
    strategy, clients, runs, _ = task
    weight = {"none": 4.0, "exponential": 3.0}.get(strategy, 1.5)
    return weight * clients * clients * runs


def sweep(
    strategies: Sequence[str],
    clients: Sequence[int],
    runs: int,
    seed: int,
    *,
    jobs: int | None = None,
    tick: Callable[[float], None] | None = None,
) -> list[OccRow]:
    """Every (strategy, clients) configuration, ``runs`` runs each, in worker processes.

    Rows come back in (strategy, clients) order whatever ``jobs`` is; ``tick`` is
    called with each finished configuration's share of the estimated work.
    """
    for strategy in strategies:
        library_backoff(strategy)
    tasks = [(s, n, runs, seed) for s in strategies for n in clients]
    total = sum(_cost(t) for t in tasks) or 1.0
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    results: dict[tuple[str, int], OccRow] = {}
    if jobs == 1:
        for task in tasks:
            results[task[0], task[1]] = _task(task)
            if tick:
                tick(_cost(task) / total)
    else:
        import multiprocessing
        import threading
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # fork starts workers at once with numpy already imported, but forking a
        # process that runs other threads can deadlock the child: then forkserver.
        methods = multiprocessing.get_all_start_methods()
        if "fork" in methods and threading.active_count() == 1:
            method: str | None = "fork"
        else:
            method = "forkserver" if "forkserver" in methods else None
        context = multiprocessing.get_context(method)
        # The biggest configurations first, so no worker is left with one at the end.
        ordered = sorted(tasks, key=_cost, reverse=True)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {pool.submit(_task, task): task for task in ordered}
            for future in as_completed(futures):
                task = futures[future]
                results[task[0], task[1]] = future.result()
                if tick:
                    tick(_cost(task) / total)
    return [results[s, n] for s, n, _, _ in tasks]
