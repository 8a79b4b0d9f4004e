"""The ROCm device-library directory clang's HIP driver links from.

ocml.bc / ockl.bc come from the triton wheel. ROCm's ``oclc_*`` control
libraries are each a constant or two that select a code path in ocml/ockl; they
are generated here from LLVM IR text with the same clang. clang only accepts a
device-library directory that holds both the ``_on`` and ``_off`` variant of
each boolean control, plus ``hip.bc`` and ``opencl.bc`` (empty here); for gfx950
it links the ``_on``/``_off`` variants listed in ``LINKED``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .fsutil import staging_dir
from .paths import Layout
from .pins import TARGET_ARCH
from .tools import run, zig_tool

# (symbol, LLVM type, value); every global is ``linkonce_odr hidden addrspace(4) constant``.
_ISA = {"gfx950": 9500}  # major*1000 + minor*100 + stepping

CONTROL_LIBS: dict[str, tuple[tuple[str, str, int], ...]] = {
    f"oclc_isa_version_{TARGET_ARCH[3:]}": (("__oclc_ISA_version", "i32", _ISA[TARGET_ARCH]),),
    "oclc_abi_version_600": (("__oclc_ABI_version", "i32", 600),),
    # ockl reads both: the wave size as a flag and as log2.
    "oclc_wavefrontsize64_on": (("__oclc_wavefrontsize64", "i8", 1), ("__oclc_wavefrontsize_log2", "i32", 6)),
    "oclc_wavefrontsize64_off": (("__oclc_wavefrontsize64", "i8", 0), ("__oclc_wavefrontsize_log2", "i32", 5)),
    "oclc_daz_opt_on": (("__oclc_daz_opt", "i8", 1),),
    "oclc_daz_opt_off": (("__oclc_daz_opt", "i8", 0),),
    "oclc_finite_only_on": (("__oclc_finite_only_opt", "i8", 1),),
    "oclc_finite_only_off": (("__oclc_finite_only_opt", "i8", 0),),
    "oclc_unsafe_math_on": (("__oclc_unsafe_math_opt", "i8", 1),),
    "oclc_unsafe_math_off": (("__oclc_unsafe_math_opt", "i8", 0),),
    "oclc_correctly_rounded_sqrt_on": (("__oclc_correctly_rounded_sqrt32", "i8", 1),),
    "oclc_correctly_rounded_sqrt_off": (("__oclc_correctly_rounded_sqrt32", "i8", 0),),
    "hip": (),
    "opencl": (),
}

#: What clang links for the cco build (seen with ``-###``); for the record.
LINKED = (
    "ocml",
    "ockl",
    "oclc_unsafe_math_off",
    "oclc_finite_only_off",
    "oclc_correctly_rounded_sqrt_on",
    "oclc_wavefrontsize64_on",
    f"oclc_isa_version_{TARGET_ARCH[3:]}",
    "oclc_abi_version_600",
)

_ALIGN = {"i8": 1, "i32": 4}


def control_ll(name: str) -> str:
    """LLVM IR text of one control library (fixed source_filename: reproducible)."""
    lines = [f'source_filename = "{name}"', 'target triple = "amdgcn-amd-amdhsa"']
    for sym, ty, value in CONTROL_LIBS[name]:
        lines.append(f"@{sym} = linkonce_odr hidden addrspace(4) constant {ty} {value}, align {_ALIGN[ty]}")
    return "\n".join(lines) + "\n"


def describe() -> dict[str, str]:
    """The control libraries, as recorded in the stamp and fingerprint."""
    return {name: "; ".join(f"{s}={v}" for s, _t, v in syms) for name, syms in CONTROL_LIBS.items()}


def install_devicelibs(layout: Layout) -> None:
    with staging_dir(layout.devicelib_dir) as tmp, tempfile.TemporaryDirectory(prefix=".ll-", dir=layout.root) as td:
        for lib in ("ocml.bc", "ockl.bc"):
            shutil.copyfile(layout.hip_dir / "lib" / lib, tmp / lib)
        for name in CONTROL_LIBS:
            ll = Path(td) / f"{name}.ll"
            ll.write_text(control_ll(name))
            run(
                zig_tool("clang")
                + ["--target=amdgcn-amd-amdhsa", "-nogpulib", "-c", "-emit-llvm", "-x", "ir", ll.name, "-o", str(tmp / f"{name}.bc")],
                cwd=Path(td),
                what=f"clang: generate {name}.bc",
            )
