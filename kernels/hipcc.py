"""hipcc: the kernels mori compiles with hipcc at first use (EP v1, collectives, shmem, IO).

mori's ``compile_genco(name, source_dir)`` (``mori/jit/core.py``) compiles one ``.hip`` source of
``mori/_jit-sources`` into one code object with ``hipcc --genco``, for the pod's arch and NIC.
A spec here is one such code object: (source, arch, NIC variant, profiler, host proxy).

The build half drives mori's own command builder, ``mori.jit.core._hipcc_genco``, under the
spec's variant -- the NIC as ``MORI_DEVICE_NIC`` sets it, CCQE as mori's firmware probe would
answer, the host proxy as ``MORI_ENABLE_HOST_PROXY``, never the build host's NIC, MPI or debug
settings -- and takes the hipcc command it would run. That command is then run as hipcc runs it
(:func:`clang_argv`: ROCm 7.2.4's ``hipBin_amd.h``: ``--offload-arch`` first, ``--genco`` ->
``--cuda-device-only``, ``-x hip`` before the source, ``-O3`` only without an ``-O``), by zig's
clang 22 pointed at Debian's HIP 7.2.4 SDK (``gemmar_aot.toolchain.rocm_sdk`` installs it;
:func:`install_args` is how clang finds it, as a ROCm install's clang does by its layout), with two
normalisations and nothing else: every path of mori's tree is relative to a staging directory
(``mori/...``; so ``__FILE__`` and friends name no host), and ``-cuid`` is fixed by the source's
name (clang otherwise hashes the command line, output path included, into a symbol).

Each compile runs in a process of its own (``python -m gemmar_aot_kernels.hipcc``): mori's
package is imported bare there (its ``__init__`` loads ROCm), never in the build's process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gemmar_aot.model.hipcc import NICS, SDK_REL, HipccVariant
from gemmar_aot.model.spec import KernelSpec

RECIPE = "hipcc"
#: Where a compile's staging directory links the SDK, clang's resource dir and mori's ``_jit-sources``:
#: the names clang sees (so no absolute path reaches a code object).
STAGE_SDK, STAGE_RESOURCE, STAGE_MORI = "rocm", "clang", "mori"
#: mori's environment knobs the build sets from the spec and clears otherwise.
MORI_ENV = ("MORI_DEVICE_NIC", "MORI_ENABLE_HOST_PROXY", "ENABLE_PROFILER", "MORI_DEBUG_INFO", "MORI_GPU_ARCHS",
            "MORI_DISABLE_IONIC_CCQE")


def spec(v: HipccVariant) -> KernelSpec:
    """The spec of one code object (``kind`` is mori's source name; rank 0: a code object serves every rank)."""
    return KernelSpec.make(RECIPE, v.source, 0, {**v.to_json(), "dir": v.dir, "profiler": False})


def variant_of(spec: KernelSpec) -> HipccVariant:
    p = spec.param_dict()
    return HipccVariant(p["source"], p["arch"], p["nic"], p["host_proxy"])


def install_args() -> list[str]:
    """What makes zig's clang 22 the clang of a ROCm install, relative to a compile's staging
    directory: the target, the resource dir, the HIP and ROCm paths and device libraries, where
    ``lld`` is. ``--no-gpu-bundle-output``: zig ships no ``clang-offload-bundler``, so the output
    is the one device code object such a bundle would hold, which ``hipModuleLoad`` loads as it is."""
    return ["--driver-mode=g++", "--target=x86_64-linux-gnu", "-resource-dir", STAGE_RESOURCE,
            f"--rocm-path={STAGE_SDK}", f"--hip-path={STAGE_SDK}", f"--rocm-device-lib-path={STAGE_SDK}/amdgcn/bitcode",
            "-B", f"{STAGE_SDK}/bin", "--no-gpu-bundle-output"]


def build_group(spec: KernelSpec) -> str | None:
    return None


def cuid(spec_params: dict) -> str:
    """The fixed compilation-unit id of a source (clang hashes it into ``__hip_cuid_<hash>``)."""
    return f"mori_{spec_params['source']}"


# ---------------------------------------------------------------- build half (its own process)


def hipcc_argv(params: dict, mori_dir: Path) -> tuple[list[str], str]:
    """(the hipcc command mori's ``_hipcc_genco`` runs for this variant, mori's source root).
    Imports mori's JIT driver (bare: no native library) into this process."""
    for k in MORI_ENV:
        os.environ.pop(k, None)
    env_nic, ccqe = NICS[params["nic"]]
    os.environ["MORI_DEVICE_NIC"] = env_nic
    if params["host_proxy"]:
        os.environ["MORI_ENABLE_HOST_PROXY"] = "1"
    core = _mori_jit_core(mori_dir)
    captured: list[list[str]] = []

    class _Capture:  # mori's subprocess, as its _hipcc_genco sees it: record the command, run nothing
        STDOUT = subprocess.STDOUT

        @staticmethod
        def check_call(cmd, **_kw):
            captured.append([str(c) for c in cmd])

    core.subprocess = _Capture
    core.is_ccqe_enabled = lambda: ccqe  # the variant, never the build host's firmware probe
    core.find_mpi_include = lambda: None  # a host's mpi.h; no device source includes it
    root = core.get_mori_source_root()
    cfg = core.BuildConfig(arch=params["arch"], rocm_path="/opt/rocm", hipcc="hipcc", llvm_link="", opt="")
    core._hipcc_genco(cfg, root / params["dir"] / f"{params['source']}.hip", core._collect_include_dirs(root),
                      Path("/out.hsaco"))
    if len(captured) != 1:
        raise RuntimeError(f"mori's _hipcc_genco ran {len(captured)} commands, expected one hipcc --genco")
    return captured[0], str(root)


def _mori_jit_core(mori_dir: Path):
    """``mori.jit.core`` from ``mori_dir``, with ``mori`` a bare package (its ``__init__`` loads ROCm's
    libraries; the JIT driver is pure Python)."""
    import importlib
    import importlib.machinery
    import types

    if "mori" in sys.modules:
        raise RuntimeError("mori is already imported in this process: a hipcc compile runs in a process of its own")
    pkg = Path(mori_dir) / "mori"
    mod = types.ModuleType("mori")
    spec_ = importlib.machinery.ModuleSpec("mori", None, is_package=True)
    spec_.submodule_search_locations = [str(pkg)]
    mod.__spec__, mod.__path__, mod.__package__ = spec_, [str(pkg)], "mori"
    sys.modules["mori"] = mod
    return importlib.import_module("mori.jit.core")


def clang_argv(hipcc: list[str], mori_root: str, out: str) -> list[str]:
    """What hipcc (ROCm 7.2.4, AMD platform) hands clang for ``hipcc``'s arguments, every path of
    ``mori_root`` made relative to the staging directory and the output renamed ``out``."""
    args = hipcc[1:]
    archs = [a for a in args if a.startswith("--offload-arch=")]
    explicit_x = "-x" in args
    rest: list[str] = []
    it = iter(args)
    for a in it:
        if a.startswith("--offload-arch="):
            continue
        if a == "-o":
            rest += ["-o", out]
            next(it)
            continue
        if "--genco" in a:
            a = "--cuda-device-only"
        elif not explicit_x and a.endswith((".hip", ".cu", ".cuh")):
            rest += ["-x", "hip"]
        rest.append(_relative(a, mori_root))
    o3 = [] if any(a.startswith("-O") for a in args) else ["-O3"]
    return archs + o3 + rest


def _relative(arg: str, mori_root: str) -> str:
    for prefix in ("-I", ""):
        if arg.startswith(prefix + mori_root) and arg[len(prefix) + len(mori_root):][:1] in ("", "/"):
            return prefix + STAGE_MORI + arg[len(prefix) + len(mori_root):]
    return arg


def compile_object(params: dict, toolchain_root: Path, mori_dir: Path, out: Path) -> list[str]:
    """Compile the spec's code object into ``out``; returns the clang command (relative paths)."""
    hipcc, root = hipcc_argv(params, mori_dir)
    with tempfile.TemporaryDirectory(prefix="gemmar-hipcc-") as td:
        stage = Path(td)
        for name, target in ((STAGE_MORI, root), (STAGE_SDK, Path(toolchain_root) / SDK_REL),
                             (STAGE_RESOURCE, Path(toolchain_root) / "clang-resource")):
            (stage / name).symlink_to(target)
        argv = install_args() + clang_argv(hipcc, root, "out.hsaco") + [f"-cuid={cuid(params)}"]
        zig = Path(toolchain_root) / "rocm" / "llvm" / "bin" / "zig"
        p = subprocess.run([str(zig), "clang", *argv], cwd=stage, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items()
                                if k not in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")} | {"LC_ALL": "C"})
        if p.returncode != 0:
            raise RuntimeError(f"clang failed (exit {p.returncode}) for {params['source']} {params['arch']} "
                               f"{params['nic']}:\n$ clang {' '.join(argv)}\n{(p.stdout + p.stderr)[-4000:]}")
        os.replace(stage / "out.hsaco", out)
    return argv


def main(argv: list[str]) -> int:
    """``python -m gemmar_aot_kernels.hipcc SPEC_JSON TOOLCHAIN_ROOT MORI_DIR OUT``: compile one spec
    into OUT; print the clang command as JSON."""
    params = json.loads(argv[0])["params"]
    print(json.dumps(compile_object(params, Path(argv[1]), Path(argv[2]), Path(argv[3]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
