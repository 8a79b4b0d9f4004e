"""The build host's stand-in HIP runtime: a ``libamdhip64.so.7`` for mori's JIT v2 libraries.

mori's ``libmori_jit.so`` and ``libmori_ops_v2.so`` link against the HIP runtime, so a host with
no ROCm cannot even load them. The build drives them there (``gemmar_aot_kernels.jitv2``: mori's
own plan creation renders, keys and compiles each kernel through ``$MORI_JIT_HIPCC``), so
``make setup`` builds this stand-in from ``hip_standin.c`` with zig (``ziglang``): the seven
entry points they import, at the version nodes they import them at, running nothing (see the C
file). It never reaches a code object's bytes: it is in no key.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from gemmar_aot.util.errors import ToolchainError

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "hip_standin.c", HERE / "hip_standin.map")
#: Where setup puts it, relative to the toolchain root, and the name mori's libraries ask for.
REL = "hip-standin"
SONAME = "libamdhip64.so.7"


def library(root: Path) -> Path:
    return Path(root) / REL / SONAME


def source_digest() -> str:
    h = hashlib.sha256()
    for p in SOURCES:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def installed_digest(root: Path) -> str | None:
    """The digest of the installed library, or None when it is not there."""
    lib = library(root)
    return hashlib.sha256(lib.read_bytes()).hexdigest() if lib.is_file() else None


def install(root: Path) -> None:
    """Build the stand-in into ``<root>/hip-standin/`` with the environment's zig (the ``ziglang`` package)."""
    root = Path(root)
    out = library(root)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{SONAME}.{os.getpid()}.tmp")
    cmd = [sys.executable, "-m", "ziglang", "cc", "-shared", "-fPIC", "-O2", "-g0", "-Wall", "-Wextra", "-Werror", "-target",
           "x86_64-linux-gnu", f"-Wl,--version-script={SOURCES[1]}", f"-Wl,-soname,{SONAME}", "-o", str(tmp),
           str(SOURCES[0])]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise ToolchainError(f"building the stand-in HIP runtime failed (exit {p.returncode}):\n$ {' '.join(cmd)}\n"
                             f"{p.stderr[-3000:]}")
    os.replace(tmp, out)
