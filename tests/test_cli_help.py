"""The tool says what it builds and serves: every kernel family mori compiles at run time, on both
archs, not last week's "gemm_ar kernels (gfx950)". Help texts, package docstrings and the
package description; reads text only (no build, no toolchain)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gemmar_aot.cli import main

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent

#: What "the tool today" means, each as (what it is, a pattern any wording of it matches).
FAMILIES = [
    ("mori's GEMM + all-reduce (gemm_ar)", r"gemm_ar|GEMM \+ all-reduce"),
    ("EP v2's FlyDSL backend", r"EP v2'?s? FlyDSL|EP v2 FlyDSL"),
    ("mori's hipcc-JIT kernels", r"hipcc-JIT|hipcc JIT"),
    ("EP v1", r"EP v1"),
    ("the collectives, shmem and IO kernels", r"collectives, shmem,? (and )?IO"),
    ("mori's JIT v2", r"JIT v2"),
    ("EP v2's HIP backend", r"HIP backend|HIP-backend"),
    ("gfx950 (MI355X)", r"gfx950"),
    ("gfx942 (MI300X)", r"gfx942"),
]
#: What the tool said when it built one family for one arch.
STALE = [r"gemm_ar kernels \(gfx950\)", r"into gfx950 code objects", r"GEMM \+ all-reduce kernels on gfx950\b(?!,)",
         r"^Serve `from mori\.ops\.gemm_ar import GemmAllReduceOp`"]


def _help(*args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def _missing(text: str) -> list[str]:
    return [what for what, pattern in FAMILIES if not re.search(pattern, text)]


def _stale(text: str) -> list[str]:
    return [p for p in STALE if re.search(p, text, re.MULTILINE)]


def test_gemmar_aot_help_names_every_family():
    text = _help()
    assert "gemm_ar kernels (gfx950)" not in text
    assert not _missing(text), f"`gemmar-aot --help` does not name: {_missing(text)}\n{text}"
    assert "MI355X" in text and "MI300X" in text


def test_build_help_names_both_archs_and_every_entry_kind():
    text = _help("build")
    assert "gfx950 code objects" not in text
    for word in ("[[tuple]]", "[[ep]]", "[[hipcc]]", "gfx950", "gfx942", "JIT v2", "hipcc-JIT"):
        assert word in text, f"`gemmar-aot build --help` does not say {word}:\n{text}"


def test_mori_patch_help_names_everything_the_hook_serves():
    from gemmar_aot.mori_patch import TARGETS

    text = _help("mori-patch")
    for target in TARGETS:  # the packages the hook patches, named as the help names them
        family = {"mori.jit.core": "hipcc JIT", "mori.ops._jit_loader": "hipcc JIT", "mori.jit.v2.plan_api": "JIT v2"}
        assert family.get(target, target) in text, f"`gemmar-aot mori-patch --help` does not name {target}:\n{text}"


@pytest.mark.parametrize("name", sorted(main.commands))
def test_no_command_help_describes_last_weeks_tool(name: str):
    cmd = main.commands[name]
    texts = [_help(name)] + ([_help(name, sub) for sub in cmd.commands] if isinstance(cmd, click.Group) else [])
    for text in texts:
        assert not _stale(text), f"`gemmar-aot {name} --help` still says {_stale(text)}"


#: The three ways mori compiles at run time, which every package docstring that describes the tool
#: names: FlyDSL (gemm_ar, EP v2's FlyDSL backend), hipcc at first use, and its JIT v2.
PATHS = [("FlyDSL", r"FlyDSL"), ("hipcc", r"hipcc"), ("JIT v2", r"JIT v2")]


@pytest.mark.parametrize("path", ["gemmar_aot/__init__.py", "gemmar_aot/runtime/__init__.py", "kernels/__init__.py",
                                  "gemmar_aot/toolchain/__init__.py", "gemmar_aot/builder/manifest.py"])
def test_package_docstrings_describe_todays_tool(path: str):
    """Read from the file (``kernels/`` installs as ``gemmar_aot_kernels`` from whichever checkout
    pip installed), so this checkout's text is the one held."""
    doc = ast.get_docstring(ast.parse((ROOT / path).read_text())) or ""
    text = " ".join(doc.split())
    assert not _stale(text), f"{path}'s docstring still says {_stale(text)}"
    missing = [what for what, pattern in PATHS if not re.search(pattern, text)]
    assert not missing, f"{path}'s docstring does not name: {missing}"


def test_the_package_description_names_every_family():
    desc = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    assert not _stale(desc), desc
    assert not _missing(desc), f"pyproject.toml's description does not name: {_missing(desc)}"
