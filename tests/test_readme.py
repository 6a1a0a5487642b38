"""Every Python snippet in the README runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
# A block preceded by this HTML comment needs the network or a long-running server.
SKIP_MARK = "<!-- readme-test: skip -->"


def snippets() -> list[tuple[int, str]]:
    """(line number, code) of each ```python block not marked to skip."""
    text = README.read_text(encoding="utf-8")
    found = []
    for match in re.finditer(r"```python\n(.*?)```", text, re.S):
        before = text[: match.start()].rstrip().splitlines()[-1:] or [""]
        if before[0].strip() == SKIP_MARK:
            continue
        found.append((text.count("\n", 0, match.start()) + 1, match.group(1)))
    return found


@pytest.mark.parametrize(
    ("line", "code"), snippets(), ids=lambda v: str(v) if isinstance(v, int) else ""
)
def test_readme_snippet_runs(
    line: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snippet executes without raising."""
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})


def test_readme_has_snippets() -> None:
    """The README keeps its copy-paste examples."""
    assert len(snippets()) >= 5
