"""The ``stormguard`` command: flags -> config object -> run().

Subcommands live beside the code they drive and are imported only when invoked,
so ``stormguard --help`` stays fast and a missing extra only breaks its own
subcommand (with a message naming the extra).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from ._errors import MissingExtra

# name -> (module, attribute, one-line help)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": (
        "stormguard.gateway._demo_cli",
        "demo_group",
        "Naive vs stormguard client against a flaky API; 'demo gateway': behind the gateway.",
    ),
    "gateway": (
        "stormguard.gateway._cli",
        "gateway_group",
        "HTTP + WebSocket gateway: limits, breakers, bulkheads, idempotency.",
    ),
    "mock": (
        "stormguard.mock._cli",
        "mock_group",
        "Run the fault-injection mock server; verify journals.",
    ),
    "ratelimit-service": (
        "stormguard.gateway.rls._cli",
        "ratelimit_service_group",
        "Envoy's global rate-limit service (gRPC) on stormguard's limits and stores.",
    ),
    "simulate": (
        "stormguard.sim._cli",
        "simulate_command",
        "Simulate a retry policy across a fleet.",
    ),
}


# The extra each subcommand needs (`cli` has what mock and demo need).
_EXTRAS = {"gateway": "gateway", "simulate": "sim"}


def _extra_of(command: list[str] | None) -> str:
    """The extra that makes ``stormguard COMMAND`` work (``cli`` by default)."""
    return _EXTRAS.get(command[0], "cli") if command else "cli"


def _build(command: list[str] | None = None) -> Any:
    try:
        import click
    except ImportError as exc:  # pragma: no cover - exercised without the extra
        raise MissingExtra("click", _extra_of(command)) from exc

    class LazyGroup(click.Group):
        def list_commands(self, ctx: click.Context) -> list[str]:
            return sorted(_COMMANDS)

        def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
            entry = _COMMANDS.get(cmd_name)
            if entry is None:
                return None
            module_name, attr, help_text = entry
            try:
                module = importlib.import_module(module_name)
            except MissingExtra as exc:
                raise click.ClickException(str(exc)) from exc
            except ModuleNotFoundError as exc:
                if exc.name and exc.name.startswith("stormguard"):
                    return _unavailable(cmd_name, help_text)
                raise click.ClickException(
                    f"{exc.name!r} is not installed; install it with: pip install 'stormguard[all]'"
                ) from exc
            command: click.Command = getattr(module, attr)
            return command

        def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
            rows = [(name, entry[2]) for name, entry in sorted(_COMMANDS.items())]
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def _unavailable(name: str, help_text: str) -> click.Command:
        @click.command(name=name, help=help_text)
        def missing() -> None:
            raise click.ClickException(f"'stormguard {name}' is not available in this build")

        return missing

    @click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(package_name="stormguard")
    def main() -> None:
        """stormguard: keep retry storms, thundering herds and cascading failures away."""

    return main


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``stormguard`` console script."""
    args = sys.argv[1:] if argv is None else argv
    try:
        group = _build(args[:1])
    except MissingExtra as exc:
        print(f"stormguard: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    group.main(args=argv, prog_name="stormguard")


if __name__ == "__main__":  # pragma: no cover
    main()
