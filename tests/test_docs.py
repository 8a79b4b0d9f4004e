"""README.md and docs/*.md hold together: every relative link finds its file (and its heading, for an
``#anchor``), every ``gemmar-aot <command>`` they show is a command of the CLI, and every
``make <target>`` a target of the Makefile. Reads Markdown only: no build, no toolchain."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from gemmar_aot.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: The issue's bar for the page a newcomer reads first.
README_MAX_LINES = 300

_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_LINK = re.compile(r"\]\(([^()\s]+)\)")
#: Where a command starts: a line, or after ``;``, ``|``, ``&&``, ``$(`` or a CI ``script:``, then any
#: ``VAR=value`` assignments.
_AT_COMMAND = r"(?:^|;|\||&&|\$\(|script:)[ \t]*(?:[A-Z][A-Z0-9_]*=\S*[ \t]+)*"
#: ``gemmar-aot`` (or a path ending in ``/gemmar-aot``) run as a command, and the words after it.
_GEMMAR = re.compile(_AT_COMMAND + r"(?:[\w.~-]*/)*gemmar-aot[ \t]+([A-Za-z][\w-]*)(?:[ \t]+([A-Za-z][\w-]*))?",
                     re.MULTILINE)
#: ``make``, its ``VAR=value`` arguments, and the target.
_MAKE = re.compile(_AT_COMMAND + r"make((?:[ \t]+[A-Z][A-Z0-9_]*=\S*)*)[ \t]+([a-z][\w.-]*)", re.MULTILINE)
#: A shell, TOML or YAML comment in a code block (what it says is prose, not a command).
_COMMENT = re.compile(r"(?:^|(?<=\s))#.*$", re.MULTILINE)


def _split(text: str) -> tuple[str, list[str]]:
    """``text`` without its fenced code blocks (each fence line kept blank, so lines still count),
    and the code blocks' contents."""
    prose, blocks, block, fence = [], [], [], None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None and m:
            fence, block = m.group(1), []
            prose.append("")
        elif fence is not None and line.startswith(fence):
            fence = None
            blocks.append("\n".join(block))
            prose.append("")
        elif fence is not None:
            block.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered (code marks and link targets dropped),
    lower case, every character but letters, digits, ``_``, ``-`` and spaces dropped, spaces made
    ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of ``page``, repeats numbered as GitHub numbers them (``-1``, ``-2``)."""
    prose, _ = _split(page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for line in prose.splitlines():
        m = _HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link outside code."""
    prose, _ = _split(page.read_text())
    prose = _INLINE_CODE.sub(lambda m: " " * len(m.group(0)) if "\n" not in m.group(0) else
                             "\n" * m.group(0).count("\n"), prose)
    return [(prose.count("\n", 0, m.start()) + 1, m.group(1)) for m in _LINK.finditer(prose)]


def code(page: Path) -> list[str]:
    """The text of every code block and every inline code span of ``page``."""
    prose, blocks = _split(page.read_text())
    return [_COMMENT.sub("", b) for b in blocks] + [m.group(2) for m in _INLINE_CODE.finditer(prose)]


def _id(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_the_pages_are_there():
    assert len(PAGES) > 10, f"expected README.md and the pages of docs/, found {[_id(p) for p in PAGES]}"


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, (f"README.md is {n} lines, more than {README_MAX_LINES}: move the reference "
                                   f"into a page of docs/ and link it")


def test_every_page_of_docs_is_linked_from_the_readme():
    linked = {(ROOT / t.split("#")[0]).resolve() for _, t in links(ROOT / "README.md") if not _external(t)}
    orphans = [_id(p) for p in PAGES[1:] if p.resolve() not in linked]
    assert not orphans, f"pages of docs/ the README does not link: {orphans}; add them to its table of pages"


def _external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target) is not None


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_relative_link_resolves(page: Path):
    bad = []
    for line, target in links(page):
        if _external(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{_id(page)}:{line}: {target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            near = sorted(anchors(dest), key=lambda a: -len(set(a.split("-")) & set(anchor.split("-"))))[:3]
            bad.append(f"{_id(page)}:{line}: {target}: {_id(dest)} has no heading #{anchor} (nearest: {near})")
    assert not bad, "links that do not resolve:\n" + "\n".join(bad)


def _commands() -> dict[str, click.Command]:
    return dict(main.commands)


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_gemmar_aot_command_named_exists(page: Path):
    commands, bad = _commands(), []
    for text in code(page):
        for m in _GEMMAR.finditer(text):
            name, sub = m.group(1), m.group(2)
            cmd = commands.get(name)
            if cmd is None:
                bad.append(f"{_id(page)}: `{m.group(0).strip()}`: no command {name!r} (gemmar-aot has: "
                           f"{', '.join(sorted(commands))})")
            elif isinstance(cmd, click.Group) and sub is not None and sub not in cmd.commands:
                bad.append(f"{_id(page)}: `{m.group(0).strip()}`: {name} has no command {sub!r} "
                           f"(it has: {', '.join(sorted(cmd.commands))})")
    assert not bad, "commands the docs name that gemmar-aot does not have:\n" + "\n".join(bad)


def makefile_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:(?![:=])", line)
        if m:
            targets.update(m.group(1).split())
    return targets - {".PHONY"}


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_make_target_named_exists(page: Path):
    targets, bad = makefile_targets(), []
    for text in code(page):
        for m in _MAKE.finditer(text):
            if m.group(2) not in targets:
                bad.append(f"{_id(page)}: `{m.group(0).strip()}`: no target {m.group(2)!r} in the Makefile "
                           f"(it has: {', '.join(sorted(targets))})")
    assert not bad, "make targets the docs name that the Makefile does not have:\n" + "\n".join(bad)


def test_the_checks_see_what_they_check():
    """The extractors find what the README shows (so a test above cannot pass by seeing nothing), and
    refuse what they should."""
    readme = ROOT / "README.md"
    found = {m.group(1) for t in code(readme) for m in _GEMMAR.finditer(t)}
    assert {"doctor", "plan", "build", "wheel", "mori-patch", "suggest"} <= found, found
    assert {m.group(2) for t in code(readme) for m in _MAKE.finditer(t)} >= {"build", "test"}
    assert {"build", "test", "setup"} <= makefile_targets()
    assert any(t.startswith("docs/") for _, t in links(readme))
    assert slug("mori's JIT v2 (HIP-backend `[[ep]]` entries): EP v2, multi-node included") == \
        "moris-jit-v2-hip-backend-ep-entries-ep-v2-multi-node-included"
    assert slug('A miss padded to the next bucket: `on_miss="pad"`') == "a-miss-padded-to-the-next-bucket-on_misspad"
    for not_a_command in ('auth_basic "gemmar-aot cache";', "~/.cache/gemmar-aot/hsaco", "pip install ./gemmar-aot x",
                          "INFO gemmar_aot.mori_patch: gemmar-aot serves mori.ops.gemm_ar"):
        assert not _GEMMAR.search(not_a_command), not_a_command
    assert [m.group(1) for m in _GEMMAR.finditer("GEMMAR_AOT_X=1 .venv/bin/gemmar-aot bulid M.toml")] == ["bulid"]
    assert [m.group(1) for m in _GEMMAR.finditer("build: {script: gemmar-aot wheel M; gemmar-aot ls}")] == \
        ["wheel", "ls"]
    assert [m.group(2) for m in _MAKE.finditer("make build PROFILE=nightly; make TOOLCHAIN=x setup")] == \
        ["build", "setup"]
