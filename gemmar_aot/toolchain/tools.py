"""Running the external tools: zig's clang and ld.lld (PyPI ``ziglang``), pip, apt, dpkg."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from gemmar_aot.util.errors import ToolchainError
from .pins import ZIGLANG_VERSION

#: Variables that would silently change what clang reads; scrubbed for every tool run.
_SCRUBBED_ENV = (
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "OBJC_INCLUDE_PATH",
    "CCC_OVERRIDE_OPTIONS",
    "CLANG_CONFIG_FILE_SYSTEM_DIR",
    "CLANG_CONFIG_FILE_USER_DIR",
    "HIP_PATH",
    "HIP_DEVICE_LIB_PATH",
    "ROCM_PATH",
    "HIP_PLATFORM",
    "SOURCE_DATE_EPOCH",
)


def tool_env() -> dict[str, str]:
    """The environment tools run in: the caller's, minus include/ROCm overrides, C locale."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env["LC_ALL"] = "C"
    return env


def run(cmd: Sequence[str], *, what: str, cwd: Path | None = None, fix: str = "") -> str:
    """Run a command; return stdout. On failure raise ToolchainError with its output."""
    try:
        proc = subprocess.run(
            list(cmd), cwd=cwd, env=tool_env(), capture_output=True, text=True, check=False
        )
    except FileNotFoundError as e:
        raise ToolchainError(f"{what}: cannot run {cmd[0]!r} ({e})" + (f"\n  fix: {fix}" if fix else "")) from e
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).strip().splitlines()
        tail = "\n".join("    " + line for line in out[-40:])
        raise ToolchainError(
            f"{what} failed (exit {proc.returncode}):\n  $ {' '.join(map(str, cmd))}\n{tail}"
            + (f"\n  fix: {fix}" if fix else "")
        )
    return proc.stdout


def ziglang_version() -> str | None:
    try:
        return metadata.version("ziglang")
    except metadata.PackageNotFoundError:
        return None


def zig_dir() -> Path:
    """The installed ``ziglang`` package directory (found without importing it)."""
    spec = importlib.util.find_spec("ziglang")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError(
            f"PyPI package ziglang=={ZIGLANG_VERSION} is not installed in {sys.executable}\n"
            "  fix: run `make setup` (or `pip install -e '.[build]'`)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def zig_include_dir() -> Path:
    """zig's copy of clang's builtin headers (clang 22's resource ``include/``)."""
    d = zig_dir() / "lib" / "include"
    if not (d / "stddef.h").is_file():
        raise ToolchainError(f"ziglang's clang headers are missing: {d}/stddef.h\n  fix: reinstall ziglang=={ZIGLANG_VERSION}")
    return d


def canonical_python() -> str:
    """This interpreter's path, spelled the same however it was started
    (``.venv/bin/python`` rather than ``python3``/``python3.11``), not resolved
    through symlinks (a venv's python must stay inside the venv)."""
    exe = Path(sys.executable)
    for name in ("python", "python3"):
        cand = exe.parent / name
        try:
            if cand.exists() and os.path.samefile(cand, exe):
                return str(cand)
        except OSError:
            pass
    return str(exe)


def zig_tool(tool: str, python: str | None = None) -> list[str]:
    """Command prefix for ``zig <tool>``: ``python -m ziglang <tool>``."""
    return [python or sys.executable, "-m", "ziglang", tool]


def clang_version() -> str:
    """First line of ``clang --version``, e.g. ``clang version 22.1.8``."""
    out = run(zig_tool("clang") + ["--version"], what="clang --version (ziglang)")
    return out.splitlines()[0].strip()


_LLD_RE = re.compile(r"\bLLD \d+(\.\d+)*")


def lld_identity(ld_lld: Sequence[str]) -> str:
    """The linker's identity from ``ld.lld --version``, e.g. ``LLD 22.1.8``."""
    out = run(list(ld_lld) + ["--version"], what="ld.lld --version")
    m = _LLD_RE.search(out)
    if not m:
        raise ToolchainError(f"ld.lld --version printed no 'LLD <version>': {out.strip()!r}")
    return m.group(0)
