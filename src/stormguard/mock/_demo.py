# `stormguard demo`: the same payments workload sent through a naive client and
# through stormguard's client, against the mock playing a flaky payments API.
#
# Every figure in the final table is read from the mock's own journal and ledger —
# what the server saw and charged — never from what the clients believe:
#   requests received   journal entries
#   peak request rate   most journal arrivals within any one second
#   charges             side effects in the ledger
#   double charges      payments (same body) with more than one side effect
#   payments succeeded  payments that got a 2xx answer from the server
#   time to finish      first arrival to last answer
#   contract violations the retry-contract checker run on the journal
from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .._errors import MissingExtra

try:
    import click
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - needs the extra missing
    raise MissingExtra(exc.name or "rich", "mock") from exc

import stormguard
from stormguard.httpx import RetryTransport
from stormguard.protection import OriginGuards

from ._checker import check_journal
from ._server import MockServer

__all__ = ["DemoResult", "demo_command", "demo_scenario", "run_demo"]

PATH = "/v1/payments"
_F = TypeVar("_F", bound=Callable[..., Any])


# How the API refuses past its limit: Stripe's 429 + Retry-After, or GitHub's primary
# limit, 403 + X-RateLimit-Remaining: 0 + X-RateLimit-Reset and no Retry-After.
LIMIT_STYLES: dict[str, dict[str, Any]] = {
    "stripe": {"headers": "stripe"},
    "github": {"headers": "github", "status": 403, "retry_after": False},
}


def demo_scenario(
    seed: int = 7, *, rate_limit: int = 150, limit_style: str = "stripe"
) -> dict[str, Any]:
    """The flaky payments API of the demo (also a scenario-file example)."""
    return {
        "name": "flaky payments API",
        "seed": seed,
        "routes": [
            {
                "match": {"method": "POST", "path": PATH},
                "sequence_per": "idempotency-key",
                "resource": "payments",
                "rate_limit": {
                    "limit": rate_limit,
                    "window": 1,
                    "per": "global",
                    **LIMIT_STYLES[limit_style],
                },
                "delay": {"lognormal": {"median": 0.015, "sigma": 0.6, "max": 0.3}},
                "sequence": [
                    {"fault": "commit-then-reset", "probability": 0.12},
                    {"status": 503, "headers": {"Retry-After": "1"}, "probability": 0.15},
                    {"fault": "commit-then-504", "probability": 0.08},
                    {"status": 201, "body": {"status": "succeeded"}},
                ],
            }
        ],
    }


def stormguard_policy() -> stormguard.RetryPolicy:
    """The policy of the demo's stormguard client."""
    return stormguard.RetryPolicy(
        attempts=8,
        backoff=stormguard.FullJitter(0.1, 2.0),
        deadline=30.0,
        max_wait=5.0,
    )


# --- the two clients -----------------------------------------------------------


def _naive_client(client_id: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(headers={"X-Client-Id": client_id}, timeout=5.0)


def _stormguard_client(client_id: str) -> httpx.AsyncClient:
    # Each demo client stands for a separate host, so each gets its own per-origin
    # protection (in one real process they would share the process-wide set).
    transport = RetryTransport(
        policy=stormguard_policy(), idempotency_keys=True, guards=OriginGuards()
    )
    return httpx.AsyncClient(transport=transport, headers={"X-Client-Id": client_id}, timeout=5.0)


async def _naive_pay(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> bool:
    # The articles' anti-pattern: retry at once on any error, no idempotency key.
    for _ in range(10):
        try:
            response = await client.post(url, json=body)
        except httpx.TransportError:
            continue
        if response.status_code < 300:
            return True
        if response.status_code < 500 and response.status_code != 429:
            return False
    return False


async def _stormguard_pay(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> bool:
    # All the retrying happens inside RetryTransport.
    try:
        response = await client.post(url, json=body)
    except (httpx.HTTPError, stormguard.StormguardError):  # incl. CircuitOpen, RateLimited
        return False
    return response.status_code < 300


CLIENTS: dict[str, tuple[str, Callable[[str], httpx.AsyncClient], Any]] = {
    "naive": ("naive client", _naive_client, _naive_pay),
    "stormguard": ("stormguard client", _stormguard_client, _stormguard_pay),
}


# --- measuring from the server's records ----------------------------------------


@dataclass(frozen=True, slots=True)
class DemoResult:
    """What the server saw of one run."""

    label: str
    payments: int
    requests: int
    peak_rate: int
    charges: int
    double_charges: int
    succeeded: int
    seconds: float
    violations: Mapping[str, int]


def _peak_rate(times: Sequence[float], window: float = 1.0) -> int:
    times = sorted(times)
    best = start = 0
    for end, t in enumerate(times):
        while t - times[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


def measure(
    label: str,
    payments: int,
    journal: list[dict[str, Any]],
    ledger: Mapping[str, Mapping[str, int]],
) -> DemoResult:
    """Figures of one run, from the mock's journal and ledger only."""
    charges_per_payment: Counter[str] = Counter()
    succeeded: set[str] = set()
    for entry in journal:
        if entry.get("side_effect") is not None:
            charges_per_payment[entry["body_sha256"]] += 1
        if entry.get("status") is not None and 200 <= entry["status"] < 300:
            succeeded.add(entry["body_sha256"])
    charges = sum(ledger.get("payments", {}).values())
    ends = [e["end"] or e["time"] for e in journal]
    seconds = (max(ends) - min(e["time"] for e in journal)) if journal else 0.0
    report = check_journal(journal)
    return DemoResult(
        label=label,
        payments=payments,
        requests=len(journal),
        peak_rate=_peak_rate([e["time"] for e in journal]),
        charges=charges,
        double_charges=sum(1 for n in charges_per_payment.values() if n > 1),
        succeeded=len(succeeded),
        seconds=seconds,
        violations=dict(report.by_kind),
    )


# --- running ------------------------------------------------------------------


async def _run_workload(
    kind: str,
    url: str,
    payments: int,
    clients: int,
    on_progress: Callable[[int], None],
) -> None:
    _, make_client, pay = CLIENTS[kind]
    done = 0

    async def crowd_member(n: int) -> None:
        nonlocal done
        async with make_client(f"{kind}-{n:03d}") as client:
            for i in range(n, payments, clients):
                body = {"payment_id": f"pay_{i:05d}", "amount": 1000 + i, "currency": "eur"}
                await pay(client, url + PATH, body)
                done += 1
                on_progress(done)

    await asyncio.gather(*(crowd_member(n) for n in range(clients)))


def run_demo(
    *,
    payments: int = 300,
    clients: int = 30,
    seed: int = 7,
    rate_limit: int = 150,
    limit_style: str = "stripe",
    console: Console | None = None,
) -> list[DemoResult]:
    """Run both clients one after the other against a fresh mock; return the figures."""
    console = console or Console()
    results: list[DemoResult] = []
    with MockServer(demo_scenario(seed, rate_limit=rate_limit, limit_style=limit_style)) as mock:
        for kind in ("naive", "stormguard"):
            mock.reset()
            label = CLIENTS[kind][0]
            with Progress(
                TextColumn("{task.description:<18}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("payments · server received {task.fields[requests]} requests"),
                console=console,
                transient=False,
            ) as progress:
                task = progress.add_task(label, total=payments, requests=0)

                def update(done: int, task: Any = task, progress: Progress = progress) -> None:
                    progress.update(task, completed=done, requests=len(mock._state.entries))

                asyncio.run(_run_workload(kind, mock.url, payments, clients, update))
                update(payments)
            time.sleep(0.05)  # let the server close the last journal entries
            results.append(measure(label, payments, mock.journal(), mock.ledger()))
    return results


def render(results: Sequence[DemoResult], console: Console) -> None:
    """The side-by-side table and the checker's findings."""
    table = Table(title="Same workload, same flaky API — as the server saw it")
    table.add_column("")
    for result in results:
        table.add_column(result.label, justify="right")

    def row(name: str, values: Sequence[str]) -> None:
        table.add_row(name, *values)

    row("requests received", [f"{r.requests:,}" for r in results])
    row("peak request rate", [f"{r.peak_rate:,}/s" for r in results])
    row("charges made", [f"{r.charges:,}" for r in results])
    row("double charges", [_alert(r.double_charges) for r in results])
    row("payments succeeded", [f"{r.succeeded}/{r.payments}" for r in results])
    row("time to finish", [f"{r.seconds:.1f} s" for r in results])
    row("contract violations", [_alert(sum(r.violations.values())) for r in results])
    console.print(table)
    for result in results:
        if result.violations:
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(result.violations.items()))
            console.print(f"[bold]{result.label}[/]: {kinds}")
    console.print(
        "Every figure comes from the mock server's journal and ledger, not from the "
        "clients. Try it yourself: [bold]stormguard mock --scenario "
        "examples/payments.yaml[/]"
    )


def _alert(count: int) -> str:
    return f"[bold red]{count:,}[/]" if count else "[green]0[/]"


def _count_option(flag: str, default: int, most: int, help: str) -> Callable[[_F], _F]:
    # A whole number from 1 to `most`, its default shown in --help.
    return click.option(
        flag, default=default, show_default=True, type=click.IntRange(1, most), help=help
    )


@click.command(name="demo")
@_count_option("--payments", 300, 100_000, "Payments in the workload.")
@_count_option("--clients", 30, 1000, "Concurrent clients.")
@click.option("--seed", default=7, show_default=True, help="Seed of the mock's faults.")
@_count_option("--rate-limit", 150, 10**9, "The API's global limit, requests per second.")
@click.option(
    "--limit-style",
    type=click.Choice(sorted(LIMIT_STYLES)),
    default="stripe",
    show_default=True,
    help="How the API refuses past its limit: Stripe's 429 + Retry-After, or GitHub's "
    "403 + X-RateLimit-Remaining: 0 + X-RateLimit-Reset.",
)
def demo_command(**options: Any) -> None:
    """Naive vs stormguard client against a flaky payments API (under a minute)."""
    console = Console()
    console.print(
        "[bold]stormguard demo[/]: {payments} payments from {clients} concurrent clients "
        "against a flaky payments API (mock on loopback: connection resets after "
        "charging, 503 + Retry-After, 504 after charging, {rate_limit} req/s limit, "
        "refused {limit_style}-style)\n".format(**options)
    )
    results = run_demo(**options, console=console)  # the options are run_demo's keywords
    console.print()
    render(results, console)
