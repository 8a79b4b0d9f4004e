"""clang's resource directory for the HIP device build.

zig's clang (22.1.8) ships the builtin headers but not clang's HIP/CUDA wrapper
headers; those come from Debian's libclang-common-19-dev. The resource dir is
zig's ``include/`` plus the wrapper headers zig lacks, with one patch.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from gemmar_aot.util.errors import ToolchainError
from .fsutil import staging_dir
from .paths import Layout
from .tools import run

#: Where the wrapper headers are inside the .deb.
DEB_INCLUDE = Path("usr/lib/llvm-19/lib/clang/19/include")
#: What is taken from it (globs relative to DEB_INCLUDE); everything else comes from zig.
WRAPPER_GLOBS = ("__clang_hip_*.h", "__clang_cuda_*.h", "cuda_wrappers")

#: The patch, applied to the copied file. In the non-OpenMP branch the complex
#: helpers use ``max``, which nothing declares for HIP; use the builtins.
PATCH_FILE = "__clang_cuda_complex_builtins.h"
PATCHES = (
    ("#define _fmaxd max\n", "#define _fmaxd __builtin_fmax\n"),
    ("#define _fmaxf max\n", "#define _fmaxf __builtin_fmaxf\n"),
)


def describe_patches() -> list[str]:
    """The patch, as recorded in the fingerprint."""
    return [f"{PATCH_FILE}: {a.strip()!r} -> {b.strip()!r}" for a, b in PATCHES]


def _apply_patches(path: Path) -> None:
    text = path.read_text()
    for old, new in PATCHES:
        count = text.count(old)
        if count != 1:
            raise ToolchainError(
                f"patch for {path.name} does not apply: expected {old.strip()!r} once, found it {count} times"
                " (libclang-common-19-dev changed? it is pinned in gemmar_aot/toolchain/pins.py)"
            )
        text = text.replace(old, new)
    path.write_text(text)


def install_resource_dir(layout: Layout, deb: Path, zig_include: Path) -> None:
    if shutil.which("dpkg") is None:
        raise ToolchainError(
            f"dpkg is not available to unpack {deb.name}\n  fix: run setup on a Debian/Ubuntu host"
        )
    with tempfile.TemporaryDirectory(prefix=".deb-", dir=layout.root) as td, staging_dir(layout.resource_dir) as tmp:
        run(["dpkg", "-x", str(deb), td], what=f"dpkg -x {deb.name}")
        src = Path(td) / DEB_INCLUDE
        if not src.is_dir():
            raise ToolchainError(f"{deb.name} has no {DEB_INCLUDE}")
        inc = tmp / "include"
        shutil.copytree(zig_include, inc, symlinks=False)
        taken = 0
        for pattern in WRAPPER_GLOBS:
            for p in sorted(src.glob(pattern)):
                dest = inc / p.name
                if dest.exists():
                    continue  # zig (clang 22) has its own: keep the newer one
                if p.is_dir():
                    shutil.copytree(p, dest, symlinks=False)
                else:
                    shutil.copyfile(p, dest)
                taken += 1
        if taken == 0 or not (inc / "__clang_hip_runtime_wrapper.h").is_file():
            raise ToolchainError(f"{deb.name}: no HIP wrapper headers found under {DEB_INCLUDE}")
        _apply_patches(inc / PATCH_FILE)
