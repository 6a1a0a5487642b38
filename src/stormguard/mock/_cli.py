# `stormguard mock`: flags -> MockServer -> serve until Ctrl-C; `stormguard mock
# verify JOURNAL.json`: the retry-contract checker, exit status 1 on violations and
# 2 when the file is not a journal.
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .._errors import MissingExtra, ScenarioError

try:
    import click
except ImportError as exc:  # pragma: no cover - needs the extra missing
    raise MissingExtra("click", "mock") from exc

from ._checker import check_journal

__all__ = ["mock_group"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _serve(
    scenario: Path,
    host: str,
    port: int,
    seed: int | None,
    journal_out: Path | None,
    quiet: bool,
) -> None:
    from .._extras import require

    try:
        require("h11", "mock")
    except MissingExtra as exc:
        raise click.ClickException(str(exc)) from exc
    from ._server import MockServer

    def log(entry: dict[str, Any]) -> None:
        key = entry["idempotency_key"]
        answer = entry["status"] if entry["status"] is not None else "no answer"
        effect = f" [{entry['resource']}: {entry['side_effect']}]" if entry["side_effect"] else ""
        click.echo(
            f"{entry['method']} {entry['path']} client={entry['client']}"
            f"{f' key={key}' if key else ''} -> {answer} ({entry['outcome']}){effect}",
            err=True,
        )

    try:
        server = MockServer(
            scenario, host=host, port=port, seed=seed, on_request=None if quiet else log
        )
    except ScenarioError as exc:
        raise click.ClickException(f"invalid scenario:\n{exc}") from exc
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        click.echo(f"warning: listening on {host}, reachable from other machines", err=True)

    def announce() -> None:
        name = server.scenario.name or scenario.name
        click.echo(
            f"stormguard mock: serving {name} on {server.url}\n"
            f"  admin: GET {server.url}/__mock/journal | GET /__mock/ledger | "
            "POST /__mock/reset\n  Ctrl-C to stop",
            err=True,
        )

    async def run() -> None:
        task = asyncio.create_task(server.serve_forever(ready=announce))
        # SIGTERM stops the server like Ctrl-C does (and still writes --journal-out).
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    finally:
        if journal_out is not None:
            journal_out.write_text(json.dumps(server.journal(), indent=1), encoding="utf-8")
            click.echo(f"journal written to {journal_out}", err=True)


_scenario_option = click.option(
    "--scenario",
    "-s",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Scenario file (.yaml/.yml or .toml).",
)
_host_option = click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on."
)
_port_option = click.option(
    "--port", "-p", default=8000, show_default=True, type=click.IntRange(0, 65535)
)
_seed_option = click.option("--seed", type=int, help="Override the scenario's RNG seed.")
_quiet_option = click.option("--quiet", "-q", is_flag=True, help="Do not log each request.")
_journal_option = click.option(
    "--journal-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the journal to this JSON file on exit.",
)


def _serve_options(command: _F) -> _F:
    """How to serve a scenario: the flags :func:`_serve` takes after the scenario."""
    for option in (_quiet_option, _journal_option, _seed_option, _port_option, _host_option):
        command = option(command)
    return command


@click.group(
    name="mock",
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@_scenario_option
@_serve_options
@click.pass_context
def mock_group(ctx: click.Context, /, scenario: Path | None, **serve: Any) -> None:
    """Fault-injection mock server and retry-contract checker.

    \b
    stormguard mock --scenario examples/payments.yaml --port 8000
    stormguard mock verify journal.json
    """
    if ctx.invoked_subcommand is not None:
        return
    if scenario is None:  # `stormguard mock` alone: show the usage
        click.echo(ctx.get_help())
        ctx.exit(2)
    _serve(scenario, **serve)


@mock_group.command("serve")
@click.option(
    "--scenario",
    "-s",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Scenario file (.yaml/.yml or .toml).",
)
@_serve_options
def serve_command(scenario: Path, **serve: Any) -> None:
    """Serve a scenario until Ctrl-C (same as `stormguard mock --scenario FILE`)."""
    _serve(scenario, **serve)


@mock_group.command("verify")
@click.argument("journal", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
@click.option(
    "--tolerance",
    default=0.05,
    show_default=True,
    type=float,
    help="Seconds an attempt may come before its Retry-After.",
)
def verify_command(journal: Path, as_json: bool, tolerance: float) -> None:
    """Check a journal against the retry contract.

    Exit status 0: no violations (an empty journal says so); 1: violations;
    2: the file is not a mock journal.
    """
    try:
        report = check_journal(journal, tolerance=tolerance)
    except (ValueError, OSError) as exc:
        click.echo(f"Error: cannot check {journal}: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1))
    else:
        click.echo(report.summary())
        if not report.requests:
            click.echo("OK: empty journal, nothing to check")
        else:
            click.echo("OK: no violations" if report.ok else "FAILED: retry contract violated")
    sys.exit(0 if report.ok else 1)
