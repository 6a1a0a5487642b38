# `stormguard demo` is a group: without a subcommand it runs the client demo
# (stormguard.mock._demo, naive vs stormguard client against the mock), and
# `stormguard demo gateway` runs the gateway demo and `stormguard demo overload` the
# overload one (imported only when asked, so the client demo needs no gateway extra).
from __future__ import annotations

from typing import Any

import click

from ..mock._demo import demo_command

__all__ = ["demo_group"]


class _DemoGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return ["gateway", "overload"]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "gateway":
            from ._demo import gateway_demo_command

            return gateway_demo_command
        if cmd_name == "overload":
            from ._demo_overload import overload_demo_command

            return overload_demo_command
        return None


@click.group(
    name="demo",
    cls=_DemoGroup,
    invoke_without_command=True,
    params=list(demo_command.params),
    help=(
        f"{demo_command.help}\n\n"
        "'stormguard demo gateway': the gateway in front of a failing upstream; "
        "'stormguard demo overload': an upstream at 3x its capacity behind the gateway."
    ),
)
@click.pass_context
def demo_group(ctx: click.Context, /, **options: Any) -> None:
    if ctx.invoked_subcommand is None:
        assert demo_command.callback is not None
        ctx.invoke(demo_command.callback, **options)
