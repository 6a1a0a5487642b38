# `stormguard gateway --config FILE [--workers N]` and `stormguard gateway check FILE`.
# Flags -> validated config -> run() (the CLI is an adapter too).
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from .._errors import MissingExtra

if TYPE_CHECKING:
    from ._config import GatewayConfig

__all__ = ["gateway_group"]


def _load(path: str, workers: int) -> GatewayConfig:
    try:
        from ._config import GatewayConfigError, check_workers, load_config
    except ImportError as exc:
        raise click.ClickException(str(MissingExtra(exc.name or "pydantic", "gateway"))) from exc
    try:
        config = load_config(path)
        check_workers(config, workers, path)
    except GatewayConfigError as exc:
        for line in exc.errors:
            click.echo(line, err=True)
        click.echo(f"{path}: {len(exc.errors)} error(s)", err=True)
        sys.exit(1)
    from ._history import history_settings

    try:
        history_settings()  # the admin listener's /history ring (environment variables)
    except ValueError as exc:
        click.echo(str(exc), err=True)
        sys.exit(1)
    return config


def _workers(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--workers", type=click.IntRange(min=1), default=1, show_default=True, help=help_text
    )


@click.group(name="gateway", invoke_without_command=True)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Gateway config file (YAML or TOML).",
)
@_workers("Worker processes on one port.")
@click.pass_context
def gateway_group(ctx: click.Context, config_path: str | None, workers: int) -> None:
    """An HTTP + WebSocket gateway: limits, breakers, bulkheads, idempotency."""
    if ctx.invoked_subcommand is not None:
        return
    if config_path is None:
        raise click.UsageError("give --config FILE (or: stormguard gateway check FILE)")
    _load(config_path, workers)
    from ._serve import multiprocess_env, run

    keep = multiprocess_env(workers)  # before anything imports prometheus_client
    try:
        run(config_path, workers=workers)
    finally:
        if keep is not None:
            keep.cleanup()


@gateway_group.command(name="check")
@click.argument("path", type=click.Path(dir_okay=False))
@_workers("Check for this many workers.")
def check_command(path: str, workers: int) -> None:
    """Validate a gateway config file; exit 0 when valid, 1 with every error otherwise."""
    config = _load(path, workers)
    from ._config import config_warnings

    for line in config_warnings(config):
        click.echo(f"{path}: warning: {line}", err=True)
    n_routes = len(config.routes)
    n_up = len(config.upstreams)
    click.echo(f"{path}: ok ({n_up} upstream(s), {n_routes} route(s))")
