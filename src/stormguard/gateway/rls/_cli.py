# `stormguard ratelimit-service --config FILE [--config FILE ...] [--listen HOST:PORT]
# [--admin HOST:PORT] [--store URL] [--workers N]` and `stormguard ratelimit-service
# check FILE...`. Flags -> validated options and domains -> run() (the CLI is an
# adapter too).
from __future__ import annotations

import sys
from typing import Any

import click

from ..._errors import ConfigError, MissingExtra

__all__ = ["ratelimit_service_group"]


def _check(paths: tuple[str, ...]) -> dict[str, Any]:
    try:
        from .._config import GatewayConfigError
        from ._config import load_domains
    except ImportError as exc:
        raise click.ClickException(str(MissingExtra(exc.name or "pydantic", "gateway"))) from exc
    try:
        return load_domains(paths)
    except GatewayConfigError as exc:
        for line in exc.errors:
            click.echo(line, err=True)
        click.echo(f"{len(exc.errors)} error(s)", err=True)
        sys.exit(1)


def _options(**flags: Any) -> Any:
    from ._service import ServiceOptions

    flags["admin"] = None if flags["admin"] in ("off", "none", "") else flags["admin"]
    try:
        return ServiceOptions(**flags)
    except ConfigError as exc:
        message = str(exc).removeprefix(f"{exc.field}: ")
        raise click.BadParameter(message, param_hint=f"--{exc.field.replace('_', '-')}") from None


@click.group(name="ratelimit-service", invoke_without_command=True)
@click.option(
    "--config",
    "configs",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="A domain's config file (envoyproxy/ratelimit YAML); repeat for more domains.",
)
@click.option("--listen", default="127.0.0.1:8081", show_default=True, help="gRPC HOST:PORT.")
@click.option(
    "--admin",
    default="127.0.0.1:6070",
    show_default=True,
    help="HOST:PORT of /metrics /status /healthz /readyz /dashboard ('off': none).",
)
@click.option("--store", default="memory", show_default=True, help="memory or a redis:// URL.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--on-store-error",
    type=click.Choice(["open", "closed", "local"]),
    default="local",
    show_default=True,
    help="What a store outage answers: allow, refuse, or decide locally.",
)
@click.option("--instances", type=click.IntRange(min=1), help="Fleet size 'local' divides by.")
@click.option(
    "--headers",
    type=click.Choice(["ietf", "github", "both", "none"]),
    default="ietf",
    show_default=True,
    help="Rate-limit headers in response_headers_to_add.",
)
@click.option("--drain", type=float, default=10.0, show_default=True, help="Seconds to drain.")
@click.option("--store-prefix", default="stormguard:", show_default=True, help="Redis key prefix.")
@click.option("--store-timeout", type=float, default=0.25, show_default=True, help="Redis timeout.")
@click.pass_context
def ratelimit_service_group(ctx: click.Context, /, configs: tuple[str, ...], **flags: Any) -> None:
    """Envoy's global rate-limit service (envoy.service.ratelimit.v3) on stormguard's limits."""
    if ctx.invoked_subcommand is not None:
        return
    if not configs:
        raise click.UsageError("give --config FILE (or: stormguard ratelimit-service check FILE)")
    _check(configs)
    options = _options(**flags)
    from .._serve import multiprocess_env

    keep = multiprocess_env(options.workers)  # before anything imports prometheus_client
    try:
        from ._serve import run

        run(configs, options)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if keep is not None:
            keep.cleanup()


@ratelimit_service_group.command(name="check")
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
def check_command(paths: tuple[str, ...]) -> None:
    """Validate config files; exit 0 when valid, 1 with every error otherwise."""
    domains = _check(paths)
    limits = sum(len(domain.limits()) for domain in domains.values())
    click.echo(f"ok: {len(domains)} domain(s), {limits} limit(s)")
