"""A TEST DOUBLE of ROCm's ``hipcc``: what mori's own ``compile_genco`` runs in the byte-parity tests.

It is written from ROCm 7.2.4's ``hipBin_amd.h`` (how hipcc builds clang's command for the AMD
platform), independently of ``gemmar_aot_kernels.hipcc``:

* the compiler is clang++ (zig's clang 22 in g++ driver mode here, the toolchain's clang);
* hipcc's own flags come first: each ``--offload-arch=`` (taken out of the user's arguments),
  then ``-O3`` unless the user gave an ``-O``;
* then the user's arguments in their order, ``--genco`` replaced by ``--cuda-device-only`` and
  ``-x hip`` inserted before each ``.hip``/``.cu`` input when the user gave no ``-x``;
* ``$HIPCC_COMPILE_FLAGS_APPEND`` last.

Where clang is installed (its resource dir, the HIP SDK, the device libraries, ``lld``) is
:data:`INSTALL`, written out here from ROCm's install layout (what its clang finds by itself),
never taken from the build under test.
Two normalisations, and only these: every path under mori's ``_jit-sources`` becomes relative to
a staging directory (``mori/...``; a translation unit mori's JIT v2 rendered outside that tree is
copied there as ``kernel.hip``), the output is written there and copied to the ``-o`` path; and
``-cuid=mori_<source stem>`` is added (clang otherwise hashes the absolute command line into a
symbol). ``--version`` answers :data:`VERSION`. Usage: ``ROCM_PATH/bin/hipcc`` is a shell line running this file with the toolchain root
in ``$GEMMAR_AOT_TOOLCHAIN``; each call's clang command is appended to ``$HIPCC_SHIM_LOG``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MARK = "/_jit-sources"
#: ROCm's clang as installed, relative to the staging directory: the HIP SDK at ``rocm``, the
#: compiler's resource dir at ``clang``; zig ships no offload bundler, so the output is the bare
#: device code object a bundle would hold.
INSTALL = ["--driver-mode=g++", "--target=x86_64-linux-gnu", "-resource-dir", "clang", "--rocm-path=rocm",
           "--hip-path=rocm", "--rocm-device-lib-path=rocm/amdgcn/bitcode", "-B", "rocm/bin",
           "--no-gpu-bundle-output"]


def hipcc_to_clang(args: list[str]) -> list[str]:
    offload = [a for a in args if a.startswith("--offload-arch=")]
    gave_x = "-x" in args
    gave_o = any(a.startswith("-O") for a in args)
    tool_args: list[str] = []
    for a in args:
        if a.startswith("--offload-arch="):
            continue
        if "--genco" in a:
            tool_args.append("--cuda-device-only")
            continue
        if not gave_x and a.endswith((".hip", ".cu", ".cuh")):
            tool_args.extend(["-x", "hip"])
        tool_args.append(a)
    append = os.environ.get("HIPCC_COMPILE_FLAGS_APPEND", "").split()
    return offload + ([] if gave_o else ["-O3"]) + tool_args + append


#: What ``--version`` answers (mori's JIT v2 keys its cache by the first line; no byte depends on it).
VERSION = "HIP version: 7.2.53211 (gemmar-aot's tests: a hipcc test double on zig clang 22)"


def main(argv: list[str]) -> int:
    if argv == ["--version"]:
        print(VERSION)
        return 0
    root = Path(os.environ["GEMMAR_AOT_TOOLCHAIN"])
    clang_args = hipcc_to_clang(argv)
    source = next(a for a in clang_args if a.endswith(".hip"))
    staged = None
    if MARK in source:  # a source of mori's tree (compile_genco)
        mori_root = source[: source.index(MARK) + len(MARK)]
    else:  # a translation unit mori's JIT v2 rendered into its cache: mori's tree is its -I root
        inc = next(a for a in clang_args if MARK in a)
        inc = inc[2:] if inc.startswith("-I") else inc
        mori_root = inc[: inc.index(MARK) + len(MARK)]
        staged = source
        clang_args = ["kernel.hip" if a == source else a for a in clang_args]
        source = "kernel.hip"
    out_at = clang_args.index("-o") + 1
    dest = clang_args[out_at]
    clang_args[out_at] = "out.hsaco"
    rel = ["mori" + a[len(mori_root):] if a.startswith(mori_root) else
           ("-Imori" + a[2 + len(mori_root):] if a.startswith("-I" + mori_root) else a) for a in clang_args]
    rel.append(f"-cuid=mori_{Path(source).stem}")
    with tempfile.TemporaryDirectory(prefix="hipcc-shim-") as td:
        stage = Path(td)
        (stage / "mori").symlink_to(mori_root)
        (stage / "rocm").symlink_to(root / "rocm-sdk")
        (stage / "clang").symlink_to(root / "clang-resource")
        if staged is not None:
            shutil.copyfile(staged, stage / "kernel.hip")
        cmd = [str(root / "rocm" / "llvm" / "bin" / "zig"), "clang", *INSTALL, *rel]
        p = subprocess.run(cmd, cwd=stage, capture_output=True, text=True)
        if p.returncode != 0:
            sys.stderr.write(p.stdout + p.stderr)
            return p.returncode
        shutil.copyfile(stage / "out.hsaco", dest)
    log = os.environ.get("HIPCC_SHIM_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"hipcc": argv, "clang": cmd[1:]}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
