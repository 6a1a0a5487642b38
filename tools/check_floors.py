"""Check that constraints/floors.txt is the floors of pyproject.toml, and installed.

Usage: python tools/check_floors.py constraints/floors.txt

Every `name==version` pin must equal the highest `name>=version` lower bound in
pyproject.toml's optional dependencies (so raising a floor means raising both), and
the venv running this script must have exactly that version installed. Exits 1 with
one line per mismatch.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _floors(pyproject: Path) -> dict[str, set[str]]:
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    found: dict[str, set[str]] = {}
    for reqs in data["project"]["optional-dependencies"].values():
        for req in reqs:
            m = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([^,;\s]+)", req)
            if m:
                found.setdefault(_norm(m.group(1)), set()).add(m.group(3))
    return found


def main(argv: list[str]) -> int:
    path = Path(argv[1] if len(argv) > 1 else "constraints/floors.txt")
    floors = _floors(path.parent.parent / "pyproject.toml")
    problems: list[str] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, pin = line.partition("==")
        key = _norm(name)
        bounds = floors.get(key)
        floor = max(bounds, key=_key) if bounds else None
        if floor is None or not _same(pin, floor):
            # `.[test]` installs every extra, so the highest bound is the one in force
            problems.append(f"{name}=={pin}: pyproject.toml's floor is {floor or 'none'}")
        try:
            have = metadata.version(key)
        except metadata.PackageNotFoundError:
            problems.append(f"{name}=={pin}: not installed")
            continue
        if not _same(have, pin):
            problems.append(f"{name}=={pin}: {have} installed")
    for line in problems:
        print(f"floors: {line}", file=sys.stderr)
    return 1 if problems else 0


def _key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v))


def _same(a: str, b: str) -> bool:
    """`6.0` and `6.0.0` name one version."""

    def parts(v: str) -> list[str]:
        p = v.split(".")
        while len(p) > 1 and p[-1] == "0":
            p.pop()
        return p

    return parts(a) == parts(b)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
