# Reading the Lua scripts shipped in stores/lua/. A script may start with
# `--#include <name>` lines; the named helper files (stores/lua/<name>.lua) are
# placed in front of it, so helpers shared by several scripts are written once
# and every script is still one self-contained EVALSHA.
from __future__ import annotations

from importlib.resources.abc import Traversable

__all__ = ["script_source"]

_INCLUDE = "--#include "


def script_source(lua: Traversable, name: str) -> str:
    """The source of ``<lua>/<name>.lua`` with its ``--#include`` helpers in front."""
    source = lua.joinpath(f"{name}.lua").read_text("utf-8")
    helpers = [
        lua.joinpath(f"{line[len(_INCLUDE) :].strip()}.lua").read_text("utf-8")
        for line in source.splitlines()
        if line.startswith(_INCLUDE)
    ]
    return "\n".join([*helpers, source]) if helpers else source
