# Import an optional dependency, or say which extra installs it.
from __future__ import annotations

import importlib
from types import ModuleType

from ._errors import MissingExtra


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise MissingExtra naming ``pip install 'stormguard[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(module, extra) from exc
