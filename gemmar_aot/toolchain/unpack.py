"""Unpack the parts of the pinned wheels the build needs (never pip-installed)."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path, PurePosixPath

from gemmar_aot.util.errors import ToolchainError
from .fsutil import staging_dir
from .paths import Layout


def _safe_member(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts:
        raise ToolchainError(f"refusing to unpack wheel member with unsafe path {name!r}")
    return p


def extract_prefixes(wheel: Path, mapping: dict[str, Path]) -> int:
    """Extract members under each ``prefix/`` of ``mapping`` into its directory
    (the prefix stripped). Returns the number of files written."""
    n = 0
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            member = _safe_member(info.filename)
            for prefix, dest in mapping.items():
                pre = PurePosixPath(prefix)
                if member.parts[: len(pre.parts)] == pre.parts:
                    out = dest.joinpath(*member.parts[len(pre.parts) :])
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(info) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    n += 1
                    break
    return n


def install_mori(layout: Layout, wheel: Path) -> None:
    """The wheel's ``mori/`` tree -> ``<root>/mori-<version>/mori``."""
    with staging_dir(layout.mori_dir) as tmp:
        n = extract_prefixes(wheel, {"mori": tmp / "mori"})
        for rel in ("ops/gemm_ar/op.py", "_jit-sources/src/cco/device/cco_device_wrapper.cpp"):
            if not (tmp / "mori" / rel).is_file():
                raise ToolchainError(f"{wheel.name} has no mori/{rel} ({n} files unpacked)")


def install_hip(layout: Layout, wheel: Path) -> None:
    """triton's HIP headers and ockl/ocml bitcode -> ``<root>/hip/{include,lib}``."""
    with staging_dir(layout.hip_dir) as tmp:
        extract_prefixes(
            wheel,
            {
                "triton/backends/amd/include": tmp / "include",
                "triton/backends/amd/lib": tmp / "lib",
            },
        )
        for rel in ("include/hip/hip_runtime.h", "lib/ocml.bc", "lib/ockl.bc"):
            if not (tmp / rel).is_file():
                raise ToolchainError(f"{wheel.name} has no triton/backends/amd/{rel}")
