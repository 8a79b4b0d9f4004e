"""jitv2: the kernels mori's JIT v2 (``libmori_jit.so``) compiles at op construction (EP v2, HIP backend).

A spec is one plan's translation unit for an arch and NIC variant, as mori's own code made it at
plan time (``gemmar_aot_kernels.jitv2_plans``): the plan, its request (the fields mori's backend
passed to the plan), the rendered source text, the hipcc flags mori used and the kernel's entry
symbol. Rank is not in it: one translation unit serves every rank.

The build half drives mori's own libraries (``libmori_jit.so`` + ``libmori_ops_v2.so``, loaded
against the toolchain's stand-in HIP runtime, ``gemmar_aot.toolchain.hip_standin``): the plan is
created from its request under the spec's arch and NIC (``MORI_JIT_ARCH``, ``MORI_DEVICE_NIC``,
``MORI_DEVICE_IONIC_CCQE``), mori renders, keys and calls ``$MORI_JIT_HIPCC`` -- a hipcc of ours
(:func:`hipcc_main`) that answers ``--version`` with ``HIPCC_IDENTITY`` and runs the command as
ROCm 7.2.4's hipcc would, on zig's clang 22 and the pinned HIP SDK (``gemmar_aot_kernels.hipcc``'s
``clang_argv``), with the hipcc recipe's two normalisations: paths relative to a staging directory
(the translation unit is staged as ``kernel.hip``), a fixed ``-cuid``. mori publishes the entry;
the code object is read from it, after checking mori rendered the spec's text with the spec's flags.

Each compile runs in a process of its own (mori's package imported bare there, never in the build).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gemmar_aot.model.hipcc import NICS, SDK_REL
from gemmar_aot.model.jitv2 import HIPCC_IDENTITY, cache_tag
from gemmar_aot.model.spec import KernelSpec

from . import hipcc as hipcc_recipe

RECIPE = "jitv2"
#: The environment a JIT v2 process sets (and clears) for mori: nothing of the build host's reaches it.
MORI_ENV = ("MORI_JIT_ARCH", "MORI_DEVICE_NIC", "MORI_DEVICE_IONIC_CCQE", "MORI_JIT_CACHE_DIR", "MORI_JIT_HIPCC",
            "MORI_JIT_EXTRA_FLAGS", "MORI_SOURCE_ROOT", "MORI_V2_LIB_DIR", "MORI_WAVE_SIZE", "MORI_GPU_ARCHS",
            "MORI_V2_KERNEL_BACKEND", "MORI_EP_DISP_GEOM", "MORI_EP_COMB_GEOM", "MORI_EP_TOKOFF_EXT",
            "MORI_JIT_KEEP_FAILED", "MORI_JIT_VERBOSE", "ROCM_PATH")
#: How our hipcc (:func:`hipcc_main`) is told what to do, by the process that points mori at it.
HIPCC_MODE_ENV = "GEMMAR_AOT_JITV2_HIPCC"  # "capture:" or "compile:<toolchain root>"
#: The name a translation unit is staged under (so ``__FILE__`` names no host path).
STAGED_TU = "kernel.hip"


def spec(unit: dict) -> KernelSpec:
    """The spec of one translation unit (``unit``: arch, nic, plan, request, text, flags, entry)."""
    return KernelSpec.make(RECIPE, unit["plan"], 0, {k: unit[k] for k in
                                                   ("arch", "nic", "plan", "request", "text", "flags", "entry")})


def build_group(spec: KernelSpec) -> str | None:
    return None


# ---------------------------------------------------------------- mori's JIT v2, in this process


def mori_v2(mori_dir: Path, standin: Path, arch: str, nic: str, cache: Path, hipcc: Path):
    """``mori.jit.v2.plan_api`` with mori's EP plans registered, in this process, for ``arch`` and NIC
    variant ``nic``: the stand-in HIP runtime loaded first (mori's libraries bind to it by soname),
    ``mori`` and ``mori.ops`` bare packages (their ``__init__`` loads ROCm), mori's knobs set from the
    arguments and every other one cleared, wave 64 (gfx942 and gfx950)."""
    if "mori" in sys.modules:
        raise RuntimeError("mori is already imported in this process: a JIT v2 step runs in a process of its own")
    for k in MORI_ENV:
        os.environ.pop(k, None)
    env_nic, ccqe = NICS[nic]
    os.environ.update({"MORI_JIT_ARCH": arch, "MORI_DEVICE_NIC": env_nic, "MORI_DEVICE_IONIC_CCQE": "1" if ccqe else "0",
                       "MORI_JIT_CACHE_DIR": str(cache), "MORI_JIT_HIPCC": str(hipcc), "MORI_WAVE_SIZE": "64"})
    ctypes.CDLL(str(standin), mode=ctypes.RTLD_GLOBAL)
    pkg = Path(mori_dir) / "mori"
    _bare("mori", pkg)
    _bare("mori.ops", pkg / "ops")
    import importlib

    plan_api = importlib.import_module("mori.jit.v2.plan_api")
    plan_api.load_library("libmori_ops_v2.so")
    return plan_api


def _bare(name: str, path: Path) -> None:
    import importlib.machinery
    import types

    mod = types.ModuleType(name)
    spec_ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec_.submodule_search_locations = [str(path)]
    mod.__spec__, mod.__path__, mod.__package__ = spec_, [str(path)], name
    sys.modules[name] = mod
    if "." in name:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, mod)


def write_hipcc(path: Path, mode: str) -> Path:
    """An executable at ``path`` that mori runs as its hipcc: :func:`hipcc_main` in ``mode``."""
    path.write_text(f"#!/bin/sh\n{HIPCC_MODE_ENV}='{mode}' exec '{sys.executable}' -m gemmar_aot_kernels.jitv2 "
                    f"hipcc \"$@\"\n")
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------- our hipcc (what mori runs)


def hipcc_main(argv: list[str]) -> int:
    """mori's ``$MORI_JIT_HIPCC``: ``--version`` answers :data:`HIPCC_IDENTITY`; a compile writes its
    command beside its output (``hipcc.json``: mori publishes it with the entry) and is captured (an
    ELF placeholder written: plan time) or run (build time)."""
    if argv == ["--version"]:
        print(HIPCC_IDENTITY)
        return 0
    mode, _, arg = os.environ.get(HIPCC_MODE_ENV, "").partition(":")
    out = argv[argv.index("-o") + 1]
    tu = next(a for a in argv if a.endswith(".hip"))
    (Path(out).parent / "hipcc.json").write_text(json.dumps(argv))  # published with the entry
    if mode == "capture":
        Path(out).write_bytes(b"\x7fELF placeholder: gemmar-aot plans, compiles nothing\n")
        return 0
    if mode == "compile":
        return _compile_tu(argv, tu, out, Path(arg))
    sys.stderr.write(f"gemmar-aot's JIT v2 hipcc: ${HIPCC_MODE_ENV} is {os.environ.get(HIPCC_MODE_ENV)!r}, "
                     f"expected capture: or compile:<toolchain root>\n")
    return 2


def _compile_tu(argv: list[str], tu: str, out: str, toolchain_root: Path) -> int:
    """Run mori's command as ROCm 7.2.4's hipcc would, on the toolchain's clang, in a staging
    directory beside the output: mori's source root as ``mori``, the TU as ``kernel.hip``."""
    root = _source_root(argv)
    stage = Path(out).parent / ".stage"
    stage.mkdir()
    try:
        for name, target in ((hipcc_recipe.STAGE_MORI, root), (hipcc_recipe.STAGE_SDK, toolchain_root / SDK_REL),
                             (hipcc_recipe.STAGE_RESOURCE, toolchain_root / "clang-resource")):
            (stage / name).symlink_to(target)
        shutil.copyfile(tu, stage / STAGED_TU)
        hipcc = [STAGED_TU if a == tu else a for a in argv]
        args = hipcc_recipe.install_args() + hipcc_recipe.clang_argv(["hipcc", *hipcc], root, "out.hsaco") + \
            [f"-cuid={hipcc_recipe.cuid({'source': Path(STAGED_TU).stem})}"]
        zig = toolchain_root / "rocm" / "llvm" / "bin" / "zig"
        p = subprocess.run([str(zig), "clang", *args], cwd=stage, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items()
                                if k not in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")} | {"LC_ALL": "C"})
        if p.returncode != 0:
            sys.stderr.write(f"$ clang {' '.join(args)}\n{p.stdout}{p.stderr}")
            return p.returncode
        os.replace(stage / "out.hsaco", out)
        (Path(out).parent / "command.json").write_text(json.dumps(["clang", *args]))
        return 0
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _source_root(argv: list[str]) -> str:
    """mori's source root: the directory of mori's first ``-I`` (``_jit-sources``)."""
    for i, a in enumerate(argv):
        if a == "-I" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("-I") and len(a) > 2:
            return a[2:]
    raise RuntimeError(f"mori's hipcc command names no -I (its source root): {argv}")


def hipcc_flags(argv: list[str]) -> list[str]:
    """The flags of mori's hipcc command: everything before its first ``-I`` (what mori keys)."""
    flags = []
    for a in argv:
        if a.startswith("-I"):
            break
        flags.append(a)
    return flags


# ---------------------------------------------------------------- the build half (its own process)


def compile_object(params: dict, toolchain_root: Path, mori_dir: Path, out: Path) -> dict:
    """Compile the spec's code object into ``out`` through mori's own plan creation; returns the
    clang command (relative paths) and mori's cache entry (relative to its cache root)."""
    work = Path(out).parent
    cache = work / "mori-jit"
    hipcc = write_hipcc(work / "hipcc", f"compile:{toolchain_root}")
    plan_api = mori_v2(mori_dir, Path(toolchain_root) / "hip-standin" / "libamdhip64.so.7", params["arch"],
                       params["nic"], cache, hipcc)
    plan = plan_api.make_plan(params["plan"])(**params["request"])
    entry_dir = Path(plan.info["cacheDir"])
    rel = entry_dir.relative_to(cache).as_posix()
    text = (entry_dir / "kernel.hip").read_text()
    if text != params["text"]:
        raise RuntimeError(f"mori rendered another translation unit for {params['plan']} than the plan recorded: "
                           f"the toolchain's mori is not the one the plan was made with; plan again")
    flags = hipcc_flags(json.loads((entry_dir / "hipcc.json").read_text()))
    if flags != params["flags"]:
        raise RuntimeError(f"mori ran hipcc for {params['plan']} with {flags}, the plan recorded {params['flags']}: "
                           f"the toolchain's mori is not the one the plan was made with; plan again")
    command = json.loads((entry_dir / "command.json").read_text())
    if not rel.startswith(cache_tag(params["arch"], params["nic"]) + "/"):
        raise RuntimeError(f"mori published {rel}, not under {cache_tag(params['arch'], params['nic'])}/")
    os.replace(entry_dir / "kernel.hsaco", out)
    return {"command": command, "cache_entry": rel}


def main(argv: list[str]) -> int:
    """``python -m gemmar_aot_kernels.jitv2 SPEC_JSON TOOLCHAIN_ROOT MORI_DIR OUT``: compile one spec
    into OUT; print the clang command and mori's cache entry as JSON. ``... hipcc ARGS``: our hipcc."""
    if argv[:1] == ["hipcc"]:
        return hipcc_main(argv[1:])
    params = json.loads(argv[0])["params"]
    print(json.dumps(compile_object(params, Path(argv[1]), Path(argv[2]), Path(argv[3]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
