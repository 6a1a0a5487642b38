# Import an optional dependency, or say which extra installs it.
from __future__ import annotations

import importlib
from types import ModuleType

from ._errors import MissingExtra


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise MissingExtra naming ``pip install 'stormguard[extra]'``.

    The error names the module that is missing: ``redis`` when ``redis.retry`` is
    asked for without redis installed, not the submodule.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or module
        raise MissingExtra(missing, extra) from exc
