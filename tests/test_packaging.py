"""Packaging promises: stdlib-only core import, clear errors for missing extras."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run code in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_import_needs_only_the_standard_library() -> None:
    """`import stormguard` loads no third-party module."""
    result = run_python(
        "import sys, json; import stormguard; print(json.dumps(sorted(sys.modules)))"
    )
    assert result.returncode == 0, result.stderr
    loaded = {name.split(".")[0] for name in json.loads(result.stdout)}
    foreign = sorted(
        name
        for name in loaded
        if name not in sys.stdlib_module_names
        and name not in {"stormguard", "__main__"}
        and not name.startswith("_")
    )
    assert foreign == []


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("stormguard.httpx", "httpx", "httpx"),
        ("stormguard.requests", "requests", "requests"),
        ("stormguard.grpc", "grpc", "grpc"),
        ("stormguard.stores", "redis", "redis"),
    ],
)
def test_missing_extra_names_the_install_command(module: str, missing: str, extra: str) -> None:
    """Importing an adapter without its library says which extra to install."""
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "try:\n"
        f"    import {module}\n"
        f"    if {module!r} == 'stormguard.stores': {module}.RedisStore('redis://127.0.0.1:1')\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "MissingExtra" in result.stdout
    assert f"pip install 'stormguard[{extra}]'" in result.stdout
