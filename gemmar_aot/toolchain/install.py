"""``python -m gemmar_aot.toolchain setup``: install the build toolchain, idempotently.

Each step has cheap *inputs* (pins, versions, digests of earlier steps) and an
*output* whose digest is recomputed on every run. A step is skipped when its
stamp (``<root>/stamps/<step>.json``) records the same inputs and the output
still has the recorded digest; otherwise it is redone. ``toolchain.json`` is
written last.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gemmar_aot.util.errors import ToolchainError
from . import ccobc, clangres, debian_rocm, devicelibs, hip_standin, rocm_sdk
from gemmar_aot.model.device_abi import device_abi_digest
from gemmar_aot.util.atomic_write import atomic_write_bytes, atomic_write_text
from gemmar_aot.util.filedigest import sha256_file, sha256_hex, tree_digest
from .fetch import fetch_deb, fetch_wheel
from .fingerprint import (
    SCHEMA,
    dist_version,
    finalize,
    flydsl_opt_level,
    flydsl_package_digest,
    mori_ep_sources_digest,
    mori_sources_digest,
    python_version,
    write_fingerprint,
)
from .fsutil import file_lock
from .linker import bundled_zig, install_ld_lld, wrapper_text
from .paths import Layout, toolchain_root
from .pins import (
    CODE_OBJECT_VERSION,
    LIBCLANG_COMMON,
    TARGET_ARCH,
    TORCH_VERSION,
    TRITON,
    ZIGLANG_VERSION,
)
from .profiles import resolve_profiles
from .tools import canonical_python, clang_version, lld_identity, zig_include_dir

#: Environment variable: use this bitcode (e.g. built by hipcc on a ROCm host) instead of building one.
CCO_BC_ENV = "MORI_CCO_BC"

Log = Callable[[str], None]


@dataclass(frozen=True)
class Step:
    name: str
    what: str  # one line for the progress output
    inputs: dict  # JSON values only; any change forces a redo
    output: Callable[[], str | None]  # digest of the current output, None when absent
    run: Callable[[], object]


#: Steps whose output belongs to one profile (stamped in the profile's directory).
PROFILE_STEPS = frozenset({"mori", "cco-bitcode"})


def _stamp_path(layout: Layout, name: str) -> Path:
    return (layout.profile_stamps if name in PROFILE_STEPS else layout.stamps) / f"{name}.json"


def _read_stamp(layout: Layout, name: str) -> dict | None:
    try:
        return json.loads(_stamp_path(layout, name).read_text())
    except (FileNotFoundError, ValueError):
        return None


def run_step(layout: Layout, step: Step, log: Log) -> str:
    """Skip or (re)do one step; return the digest of its output."""
    t0 = time.monotonic()
    stamp = _read_stamp(layout, step.name)
    reason = "not installed"
    if stamp is not None:
        if stamp.get("inputs") != json.loads(json.dumps(step.inputs)):
            reason = "inputs changed"
        else:
            current = step.output()
            if current is not None and current == stamp.get("output"):
                log(f"  {step.name:<15} ok     {time.monotonic() - t0:6.2f}s  {step.what} [{current[:12]}]")
                return current
            reason = "output missing" if current is None else "output changed"
    _stamp_path(layout, step.name).unlink(missing_ok=True)
    log(f"  {step.name:<15} ...    {step.what} ({reason})")
    step.run()
    current = step.output()
    if current is None:
        raise ToolchainError(f"setup step {step.name!r} finished but its output is missing")
    _stamp_path(layout, step.name).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        _stamp_path(layout, step.name),
        json.dumps({"step": step.name, "inputs": step.inputs, "output": current}, indent=1, sort_keys=True) + "\n",
        mode=0o644,
    )
    log(f"  {step.name:<15} done   {time.monotonic() - t0:6.2f}s  {step.what} [{current[:12]}]")
    return current


def _tree_or_none(d: Path, marker: str) -> str | None:
    return tree_digest(d) if (d / marker).is_file() else None


def _file_or_none(p: Path) -> str | None:
    return sha256_file(p) if p.is_file() else None


# ---------------------------------------------------------------- preflight


def preflight(layout: Layout) -> None:
    """Validate the Python environment and the settings before touching anything."""
    problems = []
    if sys.version_info < (3, 10):
        problems.append(f"Python {python_version()} is too old (needs >= 3.10)")
    flydsl = layout.profile.flydsl_version
    for dist, want in (("flydsl", flydsl), ("torch", TORCH_VERSION), ("ziglang", ZIGLANG_VERSION)):
        have = dist_version(dist)
        if have is None:
            problems.append(f"{dist}=={want} is not installed in {sys.executable}")
        elif have.split("+")[0] != want:
            problems.append(f"{dist} {have} is installed in {sys.executable}, the pin is {want}")
    if problems:
        raise ToolchainError(
            "the build environment is not ready:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\n  fix: run `make setup` (it creates .venv and runs `pip install -e '.[build,test]'`)"
        )
    flydsl_opt_level()  # validates FLYDSL_COMPILE_OPT_LEVEL
    env_bc = _env_bitcode(layout)
    if env_bc:
        _check_bitcode_file(Path(env_bc))


#: LLVM bitcode starts with 'BC' 0xC0DE (raw) or 0x0B17C0DE (wrapper).
_BITCODE_MAGICS = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")


def _check_bitcode_file(p: Path) -> None:
    fix = f"\n  fix: point {CCO_BC_ENV} at a libmori_cco_device.bc built for gfx950 (code object v6), or unset it"
    if not p.is_file():
        raise ToolchainError(f"{CCO_BC_ENV}={p} does not exist{fix}")
    with open(p, "rb") as f:
        head = f.read(4)
    if head not in _BITCODE_MAGICS:
        raise ToolchainError(f"{CCO_BC_ENV}={p} is not LLVM bitcode (starts with {head!r}){fix}")


# ---------------------------------------------------------------- setup


def setup(root: Path | None = None, log: Log = print, profiles: str | None = None) -> dict[str, dict]:
    """Install (or verify) the toolchain under ``root`` for ``profiles`` (a name, a
    comma-separated list or ``all``; default ``$GEMMAR_AOT_TOOLCHAIN_PROFILE`` or
    ``default``). The shared pieces are installed once. Returns {profile: fingerprint}."""
    chosen = resolve_profiles(profiles)
    base = Path(root).resolve() if root else toolchain_root()
    layouts = [Layout(base, p) for p in chosen]
    for layout in layouts:
        preflight(layout)
    base.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    log(f"toolchain: {base} (profiles: {', '.join(p.name for p in chosen)})")
    out = {}
    with file_lock(layouts[0].lock):
        shared = _setup_shared(layouts[0], log)
        for layout in layouts:
            out[layout.profile.name] = _setup_profile(layout, shared, log)
    log(f"toolchain: ready in {time.monotonic() - t_start:.2f}s; "
        + ", ".join(f"{name} {fp['digest'][:16]}" for name, fp in out.items()))
    return out


def _setup_shared(layout: Layout, log: Log) -> dict:
    """What every profile uses: HIP headers, clang resource dir, device libraries, ld.lld."""
    hip = run_step(
        layout,
        Step(
            name="hip",
            what=f"HIP headers + ockl/ocml from triton {TRITON.version} -> hip/",
            inputs={"wheel": TRITON.filename, "sha256": TRITON.sha256},
            output=lambda: _tree_or_none(layout.hip_dir, "include/hip/hip_runtime.h"),
            run=lambda: _install_hip(layout),
        ),
        log,
    )

    zig_include = zig_include_dir()
    clang = clang_version()
    resource = run_step(
        layout,
        Step(
            name="clang-resource",
            what=f"clang resource dir: ziglang {ZIGLANG_VERSION} + {LIBCLANG_COMMON.package} wrappers",
            inputs={
                "deb": LIBCLANG_COMMON.filename,
                "sha256": LIBCLANG_COMMON.sha256,
                "zig_include": tree_digest(zig_include),
                "take": list(clangres.WRAPPER_GLOBS),
                "patches": clangres.describe_patches(),
            },
            output=lambda: _tree_or_none(layout.resource_dir, "include/__clang_hip_runtime_wrapper.h"),
            run=lambda: clangres.install_resource_dir(
                layout, fetch_deb(LIBCLANG_COMMON, layout.downloads), zig_include
            ),
        ),
        log,
    )

    devlibs = run_step(
        layout,
        Step(
            name="devicelibs",
            what=f"device libraries for {TARGET_ARCH} (ocml, ockl, oclc controls)",
            inputs={"hip": hip, "clang": clang, "controls": devicelibs.describe()},
            output=lambda: _tree_or_none(layout.devicelib_dir, "ocml.bc"),
            run=lambda: devicelibs.install_devicelibs(layout),
        ),
        log,
    )

    python = canonical_python()  # the venv's python: ziglang lives in the venv
    run_step(
        layout,
        Step(
            name="ld.lld",
            what="rocm/llvm/bin/ld.lld -> zig ld.lld",
            inputs={"python": python, "ziglang": ZIGLANG_VERSION},
            output=lambda: _wrapper_digest(layout),
            run=lambda: install_ld_lld(layout.ld_lld),
        ),
        log,
    )
    run_step(
        layout,
        Step(
            name="rocm-sdk",
            what="HIP 7.2.4 SDK for mori's hipcc kernels (Debian: " + ", ".join(d.describe() for d in rocm_sdk.DEBS) + ")",
            inputs={"debs": [[d.package, d.version, d.sha256, [list(t) for t in d.take]] for d in rocm_sdk.DEBS],
                    "lld": rocm_sdk.lld_wrapper_text()},
            output=lambda: None if rocm_sdk.problems(layout.root) else tree_digest(rocm_sdk.sdk_dir(layout.root)),
            run=lambda: rocm_sdk.install(layout.root, layout.downloads),
        ),
        log,
    )
    _hip_standin_step(layout, log)
    _debian_rocm_step(layout, log)
    return {"hip": hip, "resource": resource, "devlibs": devlibs, "clang": clang,
            "linker": lld_identity([str(layout.ld_lld)]), "hipcc": rocm_sdk.fingerprint(layout.root)}


def _hip_standin_step(layout: Layout, log: Log) -> None:
    run_step(
        layout,
        Step(
            name="hip-standin",
            what=f"{hip_standin.REL}/{hip_standin.SONAME}: the stand-in HIP runtime mori's JIT v2 libraries load",
            inputs={"sources": hip_standin.source_digest(), "ziglang": ZIGLANG_VERSION},
            output=lambda: hip_standin.installed_digest(layout.root),
            run=lambda: hip_standin.install(layout.root),
        ),
        log,
    )


def _debian_rocm_step(layout: Layout, log: Log) -> None:
    """Debian's own ROCm 7.2.4 compiler (hipcc, clang 22) in a root-like tree: the oracle mori's
    hipcc kernels are compared with. Not an input of any kernel: it stays out of toolchain.json."""
    debs = debian_rocm.DEBS
    run_step(
        layout,
        Step(
            name=debian_rocm.STEP,
            what=f"Debian's ROCm compiler (oracle): hipcc {debs[0].version}, clang-22 {debs[1].version}; "
                 f"{len(debs)} packages, {debian_rocm.download_size() / 1e6:.0f} MB -> {debian_rocm.TREE_REL}/",
            inputs={"debs": [[d.package, d.version, d.sha256] for d in debs], "tree": debian_rocm.TREE_RECIPE},
            output=lambda: debian_rocm.output_digest(layout.root),
            run=lambda: debian_rocm.install(layout.root, layout.downloads),
        ),
        log,
    )


def _setup_profile(layout: Layout, shared: dict, log: Log) -> dict:
    """One profile's steps (mori's sources, its cco bitcode) and its ``toolchain.json``."""
    prof = layout.profile
    log(f" profile {prof.describe()}" + (f" ({layout.profile_rel}/)" if layout.profile_rel else ""))
    mori = run_step(
        layout,
        Step(
            name="mori",
            what=f"{prof.mori.project} {prof.mori.version} sources -> {layout.mori_rel}/mori",
            inputs={"wheel": prof.mori.filename, "sha256": prof.mori.sha256},
            output=lambda: _tree_or_none(layout.mori_dir, "mori/ops/gemm_ar/op.py"),
            run=lambda: _install_mori(layout),
        ),
        log,
    )
    cco_record = _cco_step(layout, log, mori=mori, hip=shared["hip"], resource=shared["resource"],
                           devlibs=shared["devlibs"], clang=shared["clang"])
    t0 = time.monotonic()
    identity = shared["linker"]
    fp = finalize(
        {
            "schema": SCHEMA,
            "profile": prof.name,
            "target": {"arch": TARGET_ARCH, "code_object_version": CODE_OBJECT_VERSION},
            "python": python_version(),
            "flydsl": {
                "version": dist_version("flydsl"),
                "package_digest": flydsl_package_digest(layout.stamps / "flydsl-digest.json"),
            },
            "flydsl_opt_level": flydsl_opt_level(),
            "torch": {"version": dist_version("torch")},
            "mori": {
                "distribution": prof.mori.project,
                "version": prof.mori.version,
                "wheel": prof.mori.filename,
                "wheel_sha256": prof.mori.sha256,
                "sources_digest": mori_sources_digest(layout.mori_dir),
                "ep_sources_digest": mori_ep_sources_digest(layout.mori_dir),
                "device_abi_digest": device_abi_digest(layout.mori_dir),
            },
            "cco_bitcode": cco_record,
            "linker": {"identity": identity, "via": f"ziglang {ZIGLANG_VERSION}"},
            # mori's hipcc-JIT kernels (gemmar_aot_kernels.hipcc): the SDK, clang, the host headers
            "hipcc": {**shared["hipcc"], "mori": rocm_sdk.mori_jit_digests(layout.mori_dir)},
            # mori's JIT v2 kernels (gemmar_aot_kernels.jitv2): the same compiler, mori's v2 trees
            "jitv2": {"mori": rocm_sdk.mori_jitv2_digests(layout.mori_dir)},
        }
    )
    wrote = write_fingerprint(layout.toolchain_json, fp)
    log(
        f"  {'toolchain.json':<15} {'done' if wrote else 'ok':<6} {time.monotonic() - t0:6.2f}s  "
        f"{prof.name}: FlyDSL {fp['flydsl']['version']}, {prof.mori.project} {prof.mori.version}, "
        f"{identity} [{fp['digest'][:12]}]"
    )
    return fp


def _install_mori(layout: Layout) -> None:
    from .unpack import install_mori

    install_mori(layout, fetch_wheel(layout.profile.mori, layout.downloads))


def _install_hip(layout: Layout) -> None:
    from .unpack import install_hip

    wheel = fetch_wheel(TRITON, layout.downloads)
    install_hip(layout, wheel)
    wheel.unlink()  # 248 MB; its digest stays in the stamp and the pin


def _wrapper_digest(layout: Layout) -> str | None:
    p = layout.ld_lld
    if not (p.is_file() and os.access(p, os.X_OK)) or p.read_text() != wrapper_text():
        return None
    zig = bundled_zig(p)
    if not (zig.is_file() and os.access(zig, os.X_OK)):
        return None
    return f"{sha256_file(p)}+zig:{zig.stat().st_size}"


def _cco_step(layout: Layout, log: Log, *, mori: str, hip: str, resource: str, devlibs: str, clang: str) -> dict:
    """The cco bitcode: built here, or taken from $MORI_CCO_BC. Returns its fingerprint record."""
    env_bc = _env_bitcode(layout)
    if env_bc:
        src = Path(env_bc)
        _check_bitcode_file(src)
        record = {"source": f"env:{CCO_BC_ENV}", "build": None}
        inputs = {**record, "sha256": sha256_file(src)}
        what = f"cco bitcode copied from ${CCO_BC_ENV}"

        def run() -> None:
            _install_env_bitcode(src, layout.cco_bc, inputs["sha256"])

    else:
        build = {
            "compiler": clang,
            "cwd": "<toolchain root>",
            "flags": ccobc.clang_args(layout),
            "headers": {
                "hip": f"triton {TRITON.version} ({TRITON.filename} sha256 {TRITON.sha256})",
                "clang_wrappers": f"{LIBCLANG_COMMON.package} {LIBCLANG_COMMON.version} (sha256 {LIBCLANG_COMMON.sha256})",
                "clang_builtins": f"ziglang {ZIGLANG_VERSION}",
                "patches": clangres.describe_patches(),
                "host": ccobc.host_header_pins(),
            },
            "device_libs": list(devicelibs.LINKED),
        }
        record = {"source": "built", "build": build}
        # The digests of the earlier steps' outputs are inputs too: any change there rebuilds.
        inputs = {**record, "mori": mori, "hip": hip, "resource": resource, "devicelibs": devlibs}
        what = f"cco bitcode: {clang}, {ccobc.SOURCE_NAME} of {layout.profile.mori.project} {layout.profile.mori.version}, built twice"

        def run() -> None:
            _build_reproducibly(layout)

    digest = run_step(
        layout,
        Step(name="cco-bitcode", what=what, inputs=inputs, output=lambda: _file_or_none(layout.cco_bc), run=run),
        log,
    )
    return {**record, "sha256": digest}


def _env_bitcode(layout: Layout) -> str:
    """$MORI_CCO_BC, unless it points at the toolchain's own bitcode (a shell that
    exported compile_env()): that is not a request to replace it."""
    env_bc = os.environ.get(CCO_BC_ENV, "").strip()
    if env_bc and Path(env_bc).resolve() == layout.cco_bc.resolve():
        return ""
    return env_bc


def _install_env_bitcode(src: Path, dest: Path, expected: str) -> None:
    data = Path(src).read_bytes()
    if sha256_hex(data) != expected:
        raise ToolchainError(f"${CCO_BC_ENV} ({src}) changed while it was being copied")
    atomic_write_bytes(dest, data, mode=0o644)


def _build_reproducibly(layout: Layout) -> None:
    """Build the bitcode, then build it again into a scratch file: the two must be equal."""
    first = ccobc.build_cco_bitcode(layout, layout.cco_bc)
    scratch = layout.cco_bc.with_name(f".{layout.cco_bc.name}.repro")
    try:
        second = ccobc.build_cco_bitcode(layout, scratch)
    finally:
        scratch.unlink(missing_ok=True)
    if first != second:
        layout.cco_bc.unlink(missing_ok=True)
        raise ToolchainError(
            f"the cco bitcode is not reproducible: two builds gave sha256 {first} and {second}\n"
            "  fix: report this; as a workaround set MORI_CCO_BC to a bitcode built elsewhere"
        )
