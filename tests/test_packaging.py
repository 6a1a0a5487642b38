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


def test_a_missing_redis_is_named_as_redis() -> None:
    """RedisStore on a core install (no site-packages) names the package to install,
    not 'redis.retry'."""
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "src"
    code = (
        f"import sys; sys.path.insert(0, {str(src)!r})\n"
        "from stormguard.stores import RedisStore\n"
        "try:\n"
        "    RedisStore('redis://127.0.0.1:1')\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "MissingExtra 'redis' is not installed" in result.stdout
    assert "redis.retry" not in result.stdout


def test_the_mock_fixture_on_a_core_install_names_the_mock_extra() -> None:
    """The pytest plugin's server without h11: MissingExtra naming stormguard[mock]."""
    code = (
        "import sys; sys.modules['h11'] = None\n"
        "from stormguard.mock import pytest_plugin\n"
        "try:\n"
        "    pytest_plugin._server_class()\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "MissingExtra 'h11' is not installed" in result.stdout
    assert "pip install 'stormguard[mock]'" in result.stdout


def test_the_cli_extra_has_what_mock_and_demo_need() -> None:
    """`pip install stormguard[cli]` (advertised for `stormguard mock` and `demo`)
    installs every package of the `mock` extra."""
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]

    def names(extra: str) -> set[str]:
        return {req.split(">")[0].split("[")[0].lower() for req in extras[extra]}

    assert names("mock") <= names("cli")


@pytest.mark.parametrize(("command", "extra"), [("simulate", "sim"), ("mock", "cli")])
def test_the_command_without_click_names_its_extra(command: str, extra: str) -> None:
    """`stormguard simulate` without click says stormguard[sim]; mock says [cli]."""
    code = (
        "import sys; sys.modules['click'] = None\n"
        "from stormguard import cli\n"
        f"cli.main([{command!r}])\n"
    )
    result = run_python(code)
    assert result.returncode == 2
    assert f"pip install 'stormguard[{extra}]'" in result.stderr
