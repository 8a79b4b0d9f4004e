"""Build mori's cco device bitcode (``libmori_cco_device.bc``) without ROCm.

Every gemm_ar kernel calls the cco device functions, linked from this bitcode.
mori normally builds it with hipcc at first use; here it is built once at setup
with zig's clang 22 from mori's ``_jit-sources``, triton's HIP headers and
device libraries, and Debian's clang wrapper headers.

clang runs with the toolchain root as working directory and only relative
paths, so nothing about the checkout location reaches the bitcode
(``source_filename`` and ``__FILE__`` are relative); with the fixed ``-cuid``
the bitcode is byte-reproducible.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from gemmar_aot.util.errors import ToolchainError
from gemmar_aot.util.filedigest import sha256_file
from .paths import Layout
from .pins import CCO_CUID, CODE_OBJECT_VERSION, TARGET_ARCH
from .tools import run, zig_tool

#: The wrapper source, relative to the directory that holds ``mori/``.
SOURCE_IN_MORI = "mori/_jit-sources/src/cco/device/cco_device_wrapper.cpp"
SOURCE_NAME = SOURCE_IN_MORI.rsplit("/", 1)[-1]

#: Host packages whose headers the build reads (libstdc++ for <type_traits>, glibc).
HOST_HEADER_PACKAGES = ("libstdc++-*-dev", "libc6-dev")


def clang_args(layout: Layout) -> list[str]:
    """The clang arguments (after ``clang``) for ``layout``'s profile, relative to the
    toolchain root. Deterministic, free of absolute paths: recorded verbatim in the
    fingerprint. The same recipe for every profile: only the mori sources differ."""
    j = f"{layout.mori_rel}/mori/_jit-sources"
    return [
        "--target=x86_64-linux-gnu",
        "-x",
        "hip",
        "--cuda-device-only",
        "-emit-llvm",
        "-c",
        f"--offload-arch={TARGET_ARCH}",
        "-fgpu-rdc",
        f"-mcode-object-version={CODE_OBJECT_VERSION}",
        "-std=c++17",
        "-O2",
        "-D__HIP_PLATFORM_AMD__",
        "-DHIP_ENABLE_WARP_SYNC_BUILTINS",
        "-DBUILD_CCO_SDMA=1",
        "-include",
        "type_traits",
        "-include",
        "cstdint",
        f"-cuid={CCO_CUID}",
        "-resource-dir",
        Layout.RESOURCE_REL,
        f"--rocm-path={Layout.HIP_REL}",
        f"--hip-path={Layout.HIP_REL}",
        f"--rocm-device-lib-path={Layout.DEVICELIB_REL}",
        f"-I{j}",
        f"-I{j}/include",
        f"-I{j}/src",
        f"-I{j}/3rdparty/spdlog/include",
        f"-I{j}/3rdparty/msgpack-c/include",
        f"{layout.mori_rel}/{SOURCE_IN_MORI}",
    ]


def host_header_pins() -> list[str]:
    """Installed versions of the host header packages, e.g. ``libc6-dev 2.36-9+deb12u14``."""
    if shutil.which("dpkg-query") is None:
        return ["unknown (no dpkg-query)"]
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Package} ${Version}\n", *HOST_HEADER_PACKAGES],
        capture_output=True,
        text=True,
        check=False,
    )
    pins = sorted(
        " ".join(line.split()[1:3]) for line in proc.stdout.splitlines() if line.startswith("ii ")
    )
    return pins


def check_inputs(lay: Layout) -> None:
    """Validate the inputs exist before running clang; name what is missing."""
    need = [
        lay.mori_dir / SOURCE_IN_MORI,
        lay.resource_dir / "include" / "__clang_hip_runtime_wrapper.h",
        lay.hip_dir / "include" / "hip" / "hip_runtime.h",
        lay.devicelib_dir / "ocml.bc",
    ]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise ToolchainError(
            "cannot build the cco bitcode, inputs are missing:\n"
            + "\n".join(f"  {m}" for m in missing)
            + "\n  fix: run `make setup` (or `python -m gemmar_aot.toolchain setup`)"
        )


def build_cco_bitcode(layout: Layout, out: Path) -> str:
    """Compile ``layout``'s profile's bitcode into ``out``; return its sha256."""
    root = layout.root.resolve()
    layout = Layout(root, layout.profile)
    check_inputs(layout)
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".cco-", dir=out.parent) as td:
        tmp = Path(td) / out.name
        run(
            zig_tool("clang") + clang_args(layout) + ["-o", str(tmp)],
            cwd=root,
            what=f"clang: build libmori_cco_device.bc ({layout.profile.describe()})",
            fix="the toolchain's headers or mori's sources may be damaged: delete .toolchain and run `make setup`; "
            "on a ROCm host you can instead set MORI_CCO_BC=/path/to/libmori_cco_device.bc",
        )
        if not tmp.is_file() or tmp.stat().st_size == 0:
            raise ToolchainError(f"clang produced no bitcode at {tmp}")
        digest = sha256_file(tmp)
        tmp.replace(out)
    return digest
