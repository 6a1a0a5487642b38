"""The README and every docs page: their Python runs, their links hold, their bounds stay.

Every ```python block in README.md and docs/**/*.md is executed as written, each in a
fresh namespace in a temporary working directory. A block that cannot run (it needs
the network, a long-running server or a package outside the test extra) is preceded,
on the line directly above its fence, by ``<!-- docs-test: skip: REASON -->``; the
reason is required. Inside a docs page a block may include a file of the repository
with a line of its own, ``--8<-- "path"`` (pymdownx.snippets), and the test runs it
with that file's text in its place, so a page can show an example file without a copy.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from stormguard.protection import reset_process_guards
from test_exported_members import PROMISED

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CHANGELOG = ROOT / "CHANGELOG.md"
README_MAX_LINES = 250

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<marker>`{3,}|~{3,})[ \t]*(?P<info>[^\n]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*skip(?P<colon>:)?(?P<reason>.*?)-->\s*$")
_SNIPPET = re.compile(r'^--8<--\s+"(?P<path>[^"]+)"\s*$')


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    above: str  # the line directly above the opening fence

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def markdown_files() -> list[Path]:
    """README.md and every Markdown page of the site, in a stable order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path) -> Iterator[Block]:
    """The fenced code blocks of ``path`` (indented ones dedented by their fence's indent)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opened = _FENCE.match(lines[index])
        if opened is None:
            index += 1
            continue
        indent, marker = opened["indent"], opened["marker"]
        info = opened["info"].strip()
        closing = re.compile(rf"^[ \t]*{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$")
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            text = lines[end]
            body.append(text[len(indent) :] if text.startswith(indent) else text.lstrip())
            end += 1
        language = re.split(r"[\s{]", info, maxsplit=1)[0].lower() if info else ""
        above = lines[index - 1] if index > 0 else ""
        yield Block(path, index + 1, language, "\n".join(body) + "\n", above)
        index = end + 1


def python_blocks() -> list[Block]:
    """Every ```python block of the README and the docs."""
    return [b for p in markdown_files() for b in blocks(p) if b.language in ("python", "py")]


def skip_reason(block: Block) -> str | None:
    """The reason given on the line above the block, or None when it is not marked."""
    marked = _MARKER.match(block.above)
    return None if marked is None else marked["reason"].strip()


def runnable() -> list[Block]:
    """The Python blocks that are not marked to skip."""
    return [b for b in python_blocks() if skip_reason(b) is None]


def expand_snippets(code: str) -> str:
    """Replace each ``--8<-- "path"`` line with the text of that repository file."""
    out = []
    for line in code.splitlines(keepends=True):
        included = _SNIPPET.match(line.strip())
        out.append((ROOT / included["path"]).read_text(encoding="utf-8") if included else line)
    return "".join(out)


@pytest.mark.parametrize("block", runnable(), ids=lambda b: b.where)
def test_python_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The block executes as written, without raising."""
    monkeypatch.chdir(tmp_path)
    code = expand_snippets(block.code)
    # Each block runs as if in a fresh process: no origin paused or breaker opened by
    # another page's example (the HTTP adapters share per-origin guards process-wide).
    reset_process_guards()
    try:
        exec(compile(code, block.where, "exec"), {"__name__": "__docs__"})
    finally:
        reset_process_guards()


def test_pages_keep_their_examples() -> None:
    """The README and the site keep their runnable examples (none silently dropped)."""
    readme = [b for b in runnable() if b.path == README]
    assert len(readme) >= 4  # one per audience: client (two), server side, testing
    assert len(runnable()) >= 55


def test_every_skip_marker_gives_a_reason() -> None:
    """A skip marker names why its block cannot run (``docs-test: skip: REASON``)."""
    unexplained = [
        b.where for b in python_blocks() if skip_reason(b) == "" or _bare_marker(b.above)
    ]
    assert unexplained == []


def _bare_marker(line: str) -> bool:
    marked = _MARKER.match(line)
    return marked is not None and marked["colon"] is None


def test_skip_markers_stand_above_python_blocks() -> None:
    """Every skip marker is directly above a Python block (none left dangling)."""
    marked = {(b.path, b.line - 1) for b in python_blocks() if skip_reason(b) is not None}
    dangling = []
    for path in markdown_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.match(r"^\s*<!--.*docs-test", line) and (path, number) not in marked:
                dangling.append(f"{path.relative_to(ROOT)}:{number}")
    assert dangling == []


def test_no_old_skip_markers() -> None:
    """The old ``readme-test: skip`` markers are gone (they gave no reason)."""
    old = [p.name for p in markdown_files() if "readme-test" in p.read_text(encoding="utf-8")]
    assert old == []


def test_readme_is_a_front_door() -> None:
    """The README stays short: new sections go to the docs site."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES


def _relative_links(text: str) -> list[str]:
    inline = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    defined = re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", text, re.M)
    return [
        target
        for target in inline + defined
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("#")
    ]


def test_readme_links_point_at_files() -> None:
    """Every relative link and image of the README names a file of the repository."""
    text = README.read_text(encoding="utf-8")
    links = _relative_links(text)
    assert links, "the README links into the docs"
    missing = [t for t in links if not (ROOT / t.split("#", 1)[0]).exists()]
    assert missing == []


def test_readme_links_into_the_site() -> None:
    """The README points readers at the docs pages (docs/*.md), not only at itself."""
    pages = [t for t in _relative_links(README.read_text(encoding="utf-8")) if t.endswith(".md")]
    assert len([t for t in pages if t.startswith("docs/")]) >= 10


def _nav_pages(node: object) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from _nav_pages(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _nav_pages(value)


def test_every_page_is_in_the_nav() -> None:
    """Each docs page is reachable from the site's navigation, and each nav entry exists."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = set(_nav_pages(config["nav"]))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert sorted(pages - nav) == []
    assert sorted(nav - pages) == []


# -- the API reference: the promised names, and only those ------------------------------


def _documented() -> list[tuple[str, str]]:
    """(page, identifier) of every ``::: identifier`` in the API reference."""
    found = []
    for page in sorted((DOCS / "reference" / "api").glob("*.md")):
        for match in re.finditer(r"^:::\s+(\S+)", page.read_text(encoding="utf-8"), re.M):
            found.append((page.name, match.group(1)))
    return found


def _resolve(identifier: str) -> object:
    module_name, _, name = identifier.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def test_reference_documents_only_promised_names() -> None:
    """Every object the API reference renders is a name the contract promises."""
    promised = {f"{module}.{name}" for module, names in PROMISED.items() for name in names}
    extra = [ident for _, ident in _documented() if ident not in promised]
    assert extra == []


def test_reference_documents_every_promised_name() -> None:
    """Every promised name is in the API reference (under one of the paths it has)."""
    shown = {id(_resolve(ident)) for _, ident in _documented()}
    missing = [
        f"{module}.{name}"
        for module, names in PROMISED.items()
        for name in names
        if id(getattr(importlib.import_module(module), name)) not in shown
    ]
    assert missing == []


def test_reference_shows_each_object_once() -> None:
    """No object is rendered twice (one anchor per object keeps links unambiguous)."""
    seen: dict[int, str] = {}
    twice = []
    for _, ident in _documented():
        key = id(_resolve(ident))
        if key in seen:
            twice.append(f"{seen[key]} and {ident}")
        seen[key] = ident
    assert twice == []


# -- the changelog ------------------------------------------------------------------------

_SECTIONS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
_VERSION = re.compile(r"^## \[(?P<version>\d+\.\d+\.\d+)\] - (?P<date>\d{4}-\d{2}-\d{2})$")


def _changelog_heads() -> list[str]:
    lines = CHANGELOG.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.startswith(("# ", "## ", "### "))]


def test_changelog_opens_with_unreleased() -> None:
    """CHANGELOG.md is a Keep a Changelog file whose first section is "Unreleased"."""
    heads = _changelog_heads()
    assert heads[0] == "# Changelog"
    versions = [h for h in heads if h.startswith("## ")]
    assert versions[0] == "## [Unreleased]"
    assert all(_VERSION.match(h) for h in versions[1:]), versions


def test_changelog_sections_are_the_standard_ones() -> None:
    """Within each release, changes sit under Added/Changed/Deprecated/Removed/Fixed/Security."""
    subsections = [h[4:].strip() for h in _changelog_heads() if h.startswith("### ")]
    assert subsections
    assert [s for s in subsections if s not in _SECTIONS] == []


def test_changelog_versions_descend() -> None:
    """Released versions are listed newest first, with the project's current version among them."""
    found = [_VERSION.match(h) for h in _changelog_heads()]
    versions = [tuple(int(p) for p in m["version"].split(".")) for m in found if m]
    assert versions == sorted(versions, reverse=True)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    current = re.search(r'^version = "(\d+)\.(\d+)\.(\d+)"', pyproject, re.M)
    assert current is not None
    assert tuple(int(p) for p in current.groups()) in versions


def test_site_includes_the_changelog() -> None:
    """The site's changelog page is CHANGELOG.md itself (included, never a copy)."""
    page = (DOCS / "changelog.md").read_text(encoding="utf-8")
    assert '--8<-- "CHANGELOG.md"' in page


# -- configuration examples: what the pages show is what the gateway and the mock accept --


def _yaml_blocks(top_key: str) -> list[Block]:
    return [
        b
        for p in markdown_files()
        for b in blocks(p)
        if b.language in ("yaml", "yml") and re.search(rf"^{top_key}:", b.code, re.M)
    ]


def _scenario_blocks() -> list[Block]:
    """YAML blocks with top-level routes but no upstreams: the mock's scenario files."""
    gateway = {b.where for b in _yaml_blocks("upstreams")}
    return [b for b in _yaml_blocks("routes") if b.where not in gateway]


@pytest.mark.parametrize("block", _yaml_blocks("upstreams"), ids=lambda b: b.where)
def test_gateway_configuration_is_valid(block: Block) -> None:
    """A gateway file shown on a page passes `stormguard gateway check` (${VAR} set to memory)."""
    from stormguard.gateway._config import parse_config

    env = {name: "memory" for name in re.findall(r"\$\{(\w+)", block.code)}
    config = parse_config(block.code, block.where, env=env)
    assert config.routes


@pytest.mark.parametrize("block", _scenario_blocks(), ids=lambda b: b.where)
def test_mock_scenario_is_valid(block: Block) -> None:
    """A mock scenario shown on a page loads without an error."""
    from stormguard.mock import parse_scenario

    scenario = parse_scenario(yaml.safe_load(block.code))
    assert scenario.routes


def test_pages_show_configuration_examples() -> None:
    """The gateway pages keep their configuration examples (so the two tests above check some)."""
    assert len(_yaml_blocks("upstreams")) >= 4
    assert _scenario_blocks()
