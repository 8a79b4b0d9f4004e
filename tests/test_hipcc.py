"""mori's hipcc-JIT kernels, built from the manifest and served to mori with no compiler in the pod.

The oracles are mori's own: its ``compile_genco`` (through ``tests/hipcc_shim.py``, a hipcc that
runs the toolchain's clang as ROCm 7.2.4's hipcc would), its Python's list of sources and of the
kernel names it asks for (read from its source), its loader (``mori.ops._jit_loader``,
``mori.jit.hip_driver.HipModule``) on the HIP double, and each code object's own metadata note.
``pytest -m parity -k hipcc`` selects the byte, symbol and load proofs. The smoke manifest builds the small
sources for both archs (and every NIC variant of shmem's); ``GEMMAR_AOT_TEST_HIPCC_STORE`` may
name a store built from ``manifests/dsv4-pro-hipcc.toml`` or ``mi300x-hipcc.toml`` (bench) for
the byte and symbol checks of every source.
"""

from __future__ import annotations

import ast
import json
import re
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gemmar_aot.builder.manifest import parse_manifest
from gemmar_aot.model.hipcc import ARCHS, NICS, SOURCES, HipccVariant
from gemmar_aot.model.lock import read_lock
from gemmar_aot.util.errors import ManifestError

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def _mori_pkg(profile: str = "default") -> Path:
    from test_profiles import _installed

    return _installed(profile).mori_pkg


def _smoke_hipcc(lock) -> dict[HipccVariant, object]:
    return {h.variant: h for h in lock.hipcc}


# ---------------------------------------------------------------- the manifest


def test_hipcc_entries_expand_and_every_unknown_name_is_refused_with_moris_list():
    m = parse_manifest('[manifest]\narch = "gfx942"\n\n[[hipcc]]\nsources = "all"\nnics = ["mlx5", "bnxt"]\n', "m.toml")
    (e,) = m.hipcc
    assert len(e.variants) == len(SOURCES) * 2 and {v.arch for v in e.variants} == {"gfx942"}
    with pytest.raises(ManifestError) as err:
        parse_manifest('[[hipcc]]\nsources = ["ep_intranode", "ep_v3"]\narchs = ["gfx1250", "gfx90a"]\n'
                       'nics = ["cx7"]\nprofiler = true\n', "m.toml")
    text = "\n".join(err.value.problems)
    assert 'sources = "ep_v3": mori\'s hipcc-JIT sources are ep_intranode, ep_internode' in text
    assert 'archs = "gfx1250": mori\'s gfx1250 kernels include amd_gfx1250_TDM.h' in text
    assert 'archs = "gfx90a": the archs built here (gfx942: MI300X/MI325X, gfx950: MI355X/MI350X)' in text
    assert 'nics = "cx7": mori\'s NIC variants are mlx5, bnxt, ionic, ionic-ccqe' in text
    assert "profiler = true: not built here" in text and all("m.toml: hipcc[0] (line 1)" in p
                                                             for p in err.value.problems)
    with pytest.raises(ManifestError, match="a gfx942 manifest holds \\[\\[hipcc\\]\\] entries"):
        parse_manifest('[manifest]\narch = "gfx942"\n\n[[tuple]]\ntransport = "gemm-only"\nm = 4096\nn = 7168\n'
                       'k = 2048\nworld = 8\nquant = "mxfp8"\n', "m.toml")


def test_hipcc_code_objects_count_in_the_manifest_bound(monkeypatch):
    from gemmar_aot.builder import manifest as mf

    every = "".join(f'[[hipcc]]\nsources = "all"\narchs = ["gfx942", "gfx950"]\nnics = ["{n}"]\n'
                    f'host_proxy = {"true" if p else "false"}\n' for n in NICS for p in (False, True))
    assert sum(len(e.variants) for e in parse_manifest(every, "m.toml").hipcc) == len(SOURCES) * 16
    assert len(SOURCES) * 16 <= mf.MAX_HIPCC_COMPILES  # every variant there is fits one manifest
    monkeypatch.setattr(mf, "MAX_HIPCC_COMPILES", 10)
    with pytest.raises(ManifestError, match=r"ask for 11 code objects \(sources x archs x NIC variants\), more "
                                            r"than the 10 one manifest may ask for"):
        parse_manifest('[[hipcc]]\nsources = "all"\n', "m.toml")


@pytest.mark.parametrize("profile", ["default", "nightly"])
def test_the_source_table_is_the_hip_sources_moris_python_names(profile):
    """The sources are the ``.hip`` files of mori's ``_jit-sources`` that its Python names (the op
    tables, compile_genco's calls, its precompile lists), each in the directory it is in; read
    from that mori's own files, not from our table."""
    pkg = _mori_pkg(profile)
    on_disk = {p.stem: p.parent.relative_to(pkg / "_jit-sources").as_posix()
               for p in (pkg / "_jit-sources" / "src").glob("*/kernels/*.hip")}
    named = {n.value for f in pkg.rglob("*.py") for n in ast.walk(ast.parse(f.read_text()))
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in on_disk}
    assert {s: on_disk[s] for s in named} == SOURCES
    assert set(on_disk) - named == {"ep_common"}  # included by the EP sources, never compiled alone


# ---------------------------------------------------------------- bytes: mori's own compile_genco


def _fake_rocm(tmp: Path, hipcc_program: Path = TESTS / "hipcc_shim.py") -> Path:
    """A ROCm directory holding only what mori's detect_build_config looks for: bin/hipcc (running
    ``hipcc_program``: the shim, or Debian's hipcc through tests/debian_hipcc.py), and llvm-link and
    opt (never run on the genco path)."""
    rocm = tmp / "rocm"
    (rocm / "bin").mkdir(parents=True)
    (rocm / "lib" / "llvm" / "bin").mkdir(parents=True)
    hipcc = rocm / "bin" / "hipcc"
    hipcc.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{hipcc_program}" "$@"\n')
    hipcc.chmod(0o755)
    for tool in ("llvm-link", "opt"):
        (rocm / "lib" / "llvm" / "bin" / tool).write_text("#!/bin/sh\nexit 1\n")
    return rocm


def moris_own_compile(variants: list[HipccVariant], tmp: Path, profile: str = "default") -> list[dict]:
    from gemmar_aot.toolchain import load_toolchain

    tc = load_toolchain(profile=profile)
    log = tmp / "shim.jsonl"
    env = {**os.environ, "GEMMAR_AOT_TOOLCHAIN": str(tc.root), "HIPCC_SHIM_LOG": str(log),
           "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(TESTS / "hipcc_oracle.py"), str(_fake_rocm(tmp)), str(tc.mori_dir),
                        str(tmp / "mori-cache"), json.dumps([{**v.to_json(), "dir": v.dir} for v in variants])],
                       capture_output=True, text=True, env=env, timeout=3600)
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout.splitlines()[-1])
    assert len(log.read_text().splitlines()) == len(variants)  # one hipcc run each: mori compiled them all
    return out


def _store_blob(store: Path, item) -> bytes:
    from gemmar_aot.store import Store

    return Store(store, readonly=True).load_blob(item.entry.blob.hash, item.entry.blob.size)


def _check_bytes(store: Path, lock, tmp: Path, profile: str = "default") -> int:
    items = _smoke_hipcc(lock)
    theirs = moris_own_compile(sorted(items), tmp, profile)
    import hashlib

    for t in theirs:
        v = HipccVariant(t["variant"]["source"], t["variant"]["arch"], t["variant"]["nic"], t["variant"]["host_proxy"])
        ours = _store_blob(store, items[v])
        assert hashlib.sha256(ours).hexdigest() == t["sha256"], v.describe()
        assert "/mori-cache/" in t["path"]  # mori's own cache, filled by its own compile
    return len(theirs)


@pytest.mark.parity
@pytest.mark.compile
def test_hipcc_bytes_equal_moris_own_compile_genco_for_both_archs_and_every_nic(smoke_store, smoke_lock, tmp_path):
    """Every hipcc code object of the smoke manifest -- five sources for gfx950 and gfx942, and shmem's
    four NIC variants -- byte for byte what mori's compile_genco makes through a hipcc that runs the
    same clang (normalised: relative paths, -cuid)."""
    lock = smoke_lock
    assert {(v.arch, v.nic) for v in _smoke_hipcc(lock)} >= {("gfx950", "mlx5"), ("gfx942", "mlx5")} | {
        ("gfx950", n) for n in NICS}
    assert _check_bytes(smoke_store, lock, tmp_path) == len(lock.hipcc) == 13
    # the NIC variants of shmem are four different code objects
    shmem = {v.nic: h.entry.blob.hash for v, h in _smoke_hipcc(lock).items()
             if v.source == "shmem_kernels" and v.arch == "gfx950"}
    assert len(set(shmem.values())) == 4


@pytest.mark.parity
@pytest.mark.compile
def test_hipcc_bytes_under_the_nightly_profile_equal_the_nightly_moris_own(tmp_path):
    """The nightly profile builds from the nightly mori's sources and JIT driver: a small source of
    it, byte for byte what that mori's own compile_genco makes."""
    from gemmar_aot.builder.pipeline import run_build

    _mori_pkg("nightly")  # skips when the nightly profile is not installed
    m = tmp_path / "n.toml"
    m.write_text('[manifest]\nname = "n"\n\n[[hipcc]]\nsources = ["ep_local_expert_count", "shmem_kernels"]\n'
                 'archs = ["gfx950", "gfx942"]\n')
    s = run_build(m, store=tmp_path / "store", jobs=2, progress=False, toolchain_profile="nightly")
    assert s["failed"] == 0 and s["compiled"] == 4
    lock = read_lock(tmp_path / "store" / "locks" / "n.nightly.lock.json")
    assert _check_bytes(tmp_path / "store", lock, tmp_path / "mori", profile="nightly") == 4


@pytest.mark.parity
@pytest.mark.compile
def test_hipcc_bytes_of_every_source_equal_moris_own(tmp_path):
    """Every source (both archs; every NIC variant of ep_internode_v1), from a store built in bench:
    set GEMMAR_AOT_TEST_HIPCC_STORE to a store holding dsv4-pro-hipcc (and mi300x-hipcc, and the
    NIC variants) -- about 25 minutes of compiles on 2 cores, not in CI."""
    store = os.environ.get("GEMMAR_AOT_TEST_HIPCC_STORE")
    if not store:
        pytest.skip("GEMMAR_AOT_TEST_HIPCC_STORE is not set (bench/bench_hipcc.py builds and checks every source)")
    locks = [read_lock(p) for p in sorted((Path(store) / "locks").glob("*.lock.json"))]
    seen, total = set(), 0
    for lock in locks:  # each variant once, from the first lock that holds it
        items = [h for h in lock.hipcc if h.variant not in seen]
        seen.update(h.variant for h in items)
        if items:
            total += _check_bytes(Path(store), replace(lock, hipcc=tuple(items)), tmp_path / lock.manifest.name)
    assert total >= len(SOURCES)


# ---------------------------------------------------------------- symbols: what mori's Python asks for


def names_mori_asks_for(pkg: Path, arch: str) -> dict[str, set[str]]:
    """source -> the kernel names mori's Python looks up in its code object, read from its source:
    every string and f-string handed to ``get_function`` or named in its op modules, with the dtype
    suffixes its ``_DTYPE_SUFFIX`` gives (fp8: OCP on gfx950, FNUZ on gfx942)."""
    sfx = ["f32", "bf16", "fp8_ocp" if arch == "gfx950" else "fp8_fnuz"]
    out: dict[str, set[str]] = {}
    for rel, source, pattern in (("ops/dispatch_combine.py", "ep", "Ep"), ("ops/local_expert_count.py",
                                 "ep_local_expert_count", "LocalExpertCount")):
        tree = ast.parse((pkg / rel).read_text())
        # an f-string's literal head ("EpCombineAll_" of f"EpCombineAll_{sfx}") is a prefix, not a name
        heads = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        # and a name handed to _cpp_dispatch_combine_factory is a C++ class of mori's bindings, not a kernel
        heads |= {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                  and n.func.id.endswith("_factory") for a in n.args}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(pattern) \
                    and node.value.isidentifier() and id(node) not in heads:
                out.setdefault(source, set()).add(node.value)
            elif isinstance(node, ast.JoinedStr):
                parts = [v.value if isinstance(v, ast.Constant) else None for v in node.values]
                if parts and isinstance(parts[0], str) and parts[0].startswith(pattern) and parts[-1] is None \
                        and len(parts) == 2:
                    out.setdefault(source, set()).update(parts[0] + s for s in sfx)
    return out


@pytest.mark.parity
@pytest.mark.compile
def test_hipcc_code_objects_define_every_kernel_moris_python_asks_for(smoke_store, smoke_lock):
    """LocalExpertCountKernel (mori's local_expert_count.py) in ep_local_expert_count for both archs; each
    lock item's symbols are its code object's own note's kernels, for its arch."""
    from gemmar_aot.model.codeobject import parse_code_object

    from gemmar_aot.toolchain import load_toolchain

    pkg, root = _mori_pkg(), str(load_toolchain().root).encode()
    for v, h in _smoke_hipcc(smoke_lock).items():
        data = _store_blob(smoke_store, h)
        co = parse_code_object(data)
        assert co.arch == v.arch and tuple(k.name for k in co.kernels) == h.entry.symbols, v.describe()
        assert root not in data and str(pkg).encode() not in data and b"/tmp/" not in data  # no absolute path
        if v.source == "ep_local_expert_count":
            assert names_mori_asks_for(pkg, v.arch)["ep_local_expert_count"] <= set(h.entry.symbols)
    store = os.environ.get("GEMMAR_AOT_TEST_HIPCC_STORE")
    if store:  # every EP name dispatch_combine.py asks for is in one of the EP v1 code objects of its arch
        have: dict[str, set[str]] = {}
        for lock in (read_lock(p) for p in (Path(store) / "locks").glob("*.lock.json")):
            for h in lock.hipcc:
                if h.variant.source.startswith("ep_") and h.variant.source != "ep_local_expert_count":
                    have.setdefault(h.variant.arch, set()).update(h.entry.symbols)
        assert set(have) == set(ARCHS), sorted(have)
        for arch, symbols in have.items():
            missing = names_mori_asks_for(pkg, arch)["ep"] - symbols
            assert not {n for n in missing if "fp4" not in n}, (arch, sorted(missing)[:10])


# ---------------------------------------------------------------- load: mori's own loader, no hipcc


#: A pod's process as mori's loader sees it, its native extensions aside: mori's package bare, its
#: pybind module a test double (``shmem_module_init`` recorded), no hipcc, no ROCM_PATH; mori's
#: JIT served from ``{store}``.
_BARE_MORI_POD = """
import ctypes, json, os, shutil, sys, types, importlib, importlib.machinery
from pathlib import Path
pkg = Path({pkg!r})
for name, d in (("mori", pkg), ("mori.ops", pkg / "ops")):
    m = types.ModuleType(name)
    s = importlib.machinery.ModuleSpec(name, None, is_package=True)
    s.submodule_search_locations = [str(d)]
    m.__spec__, m.__path__ = s, [str(d)]
    sys.modules[name] = m
inits = []
sys.modules["libmori_pybinds"] = types.SimpleNamespace(shmem_module_init=inits.append)  # test double
assert shutil.which("hipcc") is None and "ROCM_PATH" not in os.environ
from gemmar_aot.runtime import hipcc_server
hipcc_server.install(artifacts={store!r}, miss_report={report!r})
"""

_POD = _BARE_MORI_POD + textwrap.dedent("""
    from mori.ops import _jit_loader
    from mori.ops.local_expert_count import launch_local_expert_count
    import mori.jit.core
    cfg = types.SimpleNamespace(rank=0, num_experts_per_rank=4, num_experts_per_token=2, warp_num_per_block=4,
                                block_num=2)
    idx, total, count = (ctypes.c_int32 * 64)(), ctypes.c_int32(8), (ctypes.c_int32 * 4)()
    launch_local_expert_count(cfg, ctypes.addressof(idx), ctypes.addressof(total), ctypes.addressof(count))
    shmem = _jit_loader.load_hip_module("shmem_kernels") if _jit_loader.ensure_compiled("shmem_kernels") is None else None
    out = {{"paths": dict(_jit_loader._compiled_hsaco), "inits": len(inits),
           "compile_genco": mori.jit.core.compile_genco.__module__}}
    try:
        _jit_loader.ensure_compiled("ep_intranode")
    except Exception as e:
        out["missing"] = [type(e).__name__, str(e)]
    print(json.dumps(out))
""")


@pytest.mark.parity
@pytest.mark.parametrize("arch", ARCHS)
def test_moris_own_loader_loads_the_prebuilt_code_objects_with_no_hipcc(smoke_store, hipstub_lib, tmp_path, arch):
    """mori's local expert count op and its shmem module, through mori's own _jit_loader and HipModule
    on the HIP double (the GPU's arch as the double reports it), in a process with no hipcc and no
    ROCM_PATH: each code object is our verified one, loaded from a file, launched, and nothing was
    compiled. A source the artifacts lack raises ArtifactMissingError (never mori's warning)."""
    report = tmp_path / "misses.jsonl"
    code = _POD.format(pkg=str(_mori_pkg()), store=str(smoke_store), report=str(report))
    env = {k: v for k, v in os.environ.items() if k not in ("ROCM_PATH", "HIP_PATH", "MORI_GPU_ARCHS")}
    env.update(LD_LIBRARY_PATH=str(hipstub_lib.parent), HIPSTUB_ARCH=arch, MORI_DEVICE_NIC="mlx5",
               GEMMAR_AOT_HSACO_DIR=str(tmp_path / "hsaco"), PATH="/usr/bin:/bin",
               PYTHONPATH=os.pathsep.join((str(ROOT), str(TESTS))))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    lock = read_lock(Path(smoke_store) / "locks" / "smoke.lock.json")
    items = _smoke_hipcc(lock)
    for name in ("ep_local_expert_count", "shmem_kernels"):
        digest = items[HipccVariant(name, arch, "mlx5")].entry.blob.hash
        assert out["paths"][name] == str(tmp_path / "hsaco" / f"{digest}.hsaco")
    assert out["inits"] == 1 and out["compile_genco"] == "gemmar_aot.runtime.hipcc_server"  # shmem_module_init, served
    assert out["missing"][0] == "ArtifactMissingError" and f'sources = ["ep_intranode"]\narchs = ["{arch}"]' in \
        out["missing"][1]
    line = json.loads(report.read_text().splitlines()[0])
    assert line["hipcc"] == {"source": "ep_intranode", "arch": arch, "nic": "mlx5", "host_proxy": False}


_EP_POD = _BARE_MORI_POD + textwrap.dedent("""
    from mori.ops import _jit_loader
    found, paths = {{}}, {{}}
    for src in {sources!r}:
        _jit_loader.ensure_compiled(src)          # what EpDispatchCombineOp.__init__ calls first
        mod = _jit_loader.load_hip_module(src)    # then HipModule + shmem_module_init, as the op does
        paths[src] = _jit_loader._compiled_hsaco[src]
        for n in {names!r}:
            try:
                mod.get_function(n)               # the op's _get_func: hipModuleGetFunction
                found.setdefault(n, []).append(src)
            except RuntimeError:
                pass
    print(json.dumps({{"paths": paths, "found": found, "inits": len(inits)}}))
""")


def _ep_v1_store() -> tuple[Path, object] | None:
    """A store holding mori's EP v1 code objects: $GEMMAR_AOT_TEST_HIPCC_STORE (bench) or the
    default artifacts/ once ``make build`` has built manifests/dsv4-pro-hipcc.toml into it."""
    for store in (os.environ.get("GEMMAR_AOT_TEST_HIPCC_STORE"), str(ROOT / "artifacts")):
        if not store:
            continue
        for p in sorted((Path(store) / "locks").glob("*.lock.json")):
            lock = read_lock(p)
            if {h.variant.source for h in lock.hipcc} >= {"ep_intranode", "ep_internode_v1"}:
                return Path(store), lock
    return None


@pytest.mark.parity
def test_moris_ep_v1_kernels_load_through_moris_loader_with_no_hipcc(hipstub_lib, tmp_path):
    """mori's EP v1 op (EpDispatchCombineOp) gets its kernels through ``_jit_loader``: ensure_compiled,
    load_hip_module (HipModule, shmem_module_init), then get_function of each kernel name. Driven
    exactly so on the HIP double of the lock's arch, in a process with no hipcc and no ROCM_PATH,
    every EP v1 source of the lock loads from our verified file and every kernel name mori's
    dispatch_combine.py asks for on that arch is found in one of them (fp4 names aside: mori builds
    them only where its headers enable fp4). The op's native handle (libmori_pybinds) cannot load on
    this host: the hand-over is proven at the loader boundary, the launches on a GPU (-m gpu)."""
    got = _ep_v1_store()
    if got is None:
        pytest.skip("no store holds mori's EP v1 code objects: run `make build` (manifests/dsv4-pro-hipcc.toml "
                    "into artifacts/) or set GEMMAR_AOT_TEST_HIPCC_STORE")
    store, lock = got
    arch = lock.arch
    items = {h.variant.source: h for h in lock.hipcc
             if h.variant.arch == arch and h.variant.nic == "mlx5" and not h.variant.host_proxy}
    sources = sorted(s for s in items if s.startswith("ep_") and s != "ep_local_expert_count")
    names = sorted(n for n in names_mori_asks_for(_mori_pkg(), arch)["ep"] if "fp4" not in n)
    code = _EP_POD.format(pkg=str(_mori_pkg()), store=str(store), report=None, sources=sources, names=names)
    env = {k: v for k, v in os.environ.items() if k not in ("ROCM_PATH", "HIP_PATH", "MORI_GPU_ARCHS")}
    env.update(LD_LIBRARY_PATH=str(hipstub_lib.parent), HIPSTUB_ARCH=arch, MORI_DEVICE_NIC="mlx5",
               GEMMAR_AOT_HSACO_DIR=str(tmp_path / "hsaco"), PATH="/usr/bin:/bin",
               PYTHONPATH=os.pathsep.join((str(ROOT), str(TESTS))))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["paths"] == {s: str(tmp_path / "hsaco" / f"{items[s].entry.blob.hash}.hsaco") for s in sources}
    assert out["inits"] == len(sources) and len(sources) >= 2
    assert sorted(out["found"]) == names, sorted(set(names) - set(out["found"]))[:10]


def test_a_lock_serving_a_variant_with_another_variants_record_is_refused(smoke_store, smoke_lock, tmp_path):
    """An edited lock whose gfx942 item names the gfx950 kernel (key, blob and record of the other arch)
    is refused at the first request, naming what the record compiled."""
    import shutil

    from gemmar_aot.model.lock import write_lock
    from gemmar_aot.runtime import ArtifactMismatchError
    from gemmar_aot.runtime.hipcc_server import HipccServer

    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    items = _smoke_hipcc(smoke_lock)
    a, b = items[HipccVariant("cast_kernel", "gfx942", "mlx5")], items[HipccVariant("cast_kernel", "gfx950", "mlx5")]
    edited = replace(smoke_lock, hipcc=tuple(replace(h, entry=b.entry) if h is a else h for h in smoke_lock.hipcc))
    write_lock(store / "locks" / "smoke.lock.json", edited)

    class Gfx942:
        def device_arch(self, device):
            return "gfx942:sramecc+:xnack-"

    srv = HipccServer(store, driver=Gfx942(), directory=tmp_path / "hsaco")
    os.environ.pop("MORI_GPU_ARCHS", None)
    with pytest.raises(ArtifactMismatchError, match="the lock serves cast_kernel for gfx942, NIC mlx5 with a record "
                                                    "that compiled cast_kernel for gfx950"):
        srv._materialise(HipccVariant("cast_kernel", "gfx942", "mlx5"))
    assert not (tmp_path / "hsaco").exists()


@pytest.mark.parametrize("edit", ["empty", "renamed", "one_extra", "another_objects"])
def test_a_lock_item_whose_symbols_are_not_exactly_its_objects_kernels_is_refused(smoke_store, smoke_lock,
                                                                                   tmp_path, edit):
    """The symbols a lock item lists are its code object's kernels, the same set and never empty: an
    edited list -- emptied, a name changed, one too many, another object's -- is refused at the first
    request, naming the item, before mori sees a file."""
    import shutil

    from gemmar_aot.model.lock import write_lock
    from gemmar_aot.runtime import ArtifactMismatchError
    from gemmar_aot.runtime.hipcc_server import HipccServer

    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    items = _smoke_hipcc(smoke_lock)
    v = HipccVariant("shmem_kernels", "gfx950", "mlx5")
    own = items[v].entry.symbols
    other = items[HipccVariant("cast_kernel", "gfx950", "mlx5")].entry.symbols
    assert own and other and set(own).isdisjoint(other)
    symbols = {"empty": (), "renamed": (own[0] + "_v2", *own[1:]), "one_extra": (*own, *other),
               "another_objects": other}[edit]
    edited = replace(smoke_lock, hipcc=tuple(replace(h, entry=replace(h.entry, symbols=tuple(symbols)))
                                             if h.variant == v else h for h in smoke_lock.hipcc))
    write_lock(store / "locks" / "smoke.lock.json", edited)
    srv = HipccServer(store, directory=tmp_path / "hsaco")
    with pytest.raises(ArtifactMismatchError, match=re.escape(v.describe()) + r" and its code object defines \d+: "
                                                    r".*a lock item names exactly its code object's"):
        srv._materialise(v)
    assert not (tmp_path / "hsaco").exists()
    shutil.copy(smoke_store / "locks" / "smoke.lock.json", store / "locks" / "smoke.lock.json")
    assert Path(HipccServer(store, directory=tmp_path / "hsaco")._materialise(v)).is_file()  # the built lock passes


def test_suggest_turns_a_hipcc_miss_into_the_entry_that_builds_it(tmp_path):
    from gemmar_aot.cli import main

    report = tmp_path / "misses.jsonl"
    report.write_text(json.dumps({"schema": 1, "op": "mori.jit.core.compile_genco", "tuple": None,
                                  "hipcc": {"source": "ep_internode_v1", "arch": "gfx942", "nic": "ionic",
                                            "host_proxy": False}, "m": None, "served": None,
                                  "error": "ArtifactMissingError", "count": 1, "rank": None, "profile": "default",
                                  "locks": [], "time": "2026-12-05T00:00:00Z", "host": "h", "pid": 1}) + "\n")
    r = CliRunner().invoke(main, ["suggest", str(report), "--json"])
    assert r.exit_code == 0, r.output
    snippet = json.loads(r.stdout)["snippet"]
    assert '[[hipcc]]\nsources = ["ep_internode_v1"]\narchs = ["gfx942"]\nnics = ["ionic"]' in snippet
    assert parse_manifest('[manifest]\narch = "gfx942"\n' + snippet, "m.toml").hipcc[0].variants == (
        HipccVariant("ep_internode_v1", "gfx942", "ionic"),)


# ---------------------------------------------------------------- a pod that changes no code

_SERVER = textwrap.dedent("""
    import ctypes, json, sys, types, site
    site.addsitedir({pth_dir!r})
    sys.modules["libmori_pybinds"] = types.SimpleNamespace(shmem_module_init=lambda m: None)  # test double
    from mori.ops.local_expert_count import launch_local_expert_count   # what a server runs, unchanged
    from mori.ops import _jit_loader
    cfg = types.SimpleNamespace(rank=0, num_experts_per_rank=4, num_experts_per_token=2, warp_num_per_block=4,
                                block_num=2)
    idx, total, count = (ctypes.c_int32 * 64)(), ctypes.c_int32(8), (ctypes.c_int32 * 4)()
    launch_local_expert_count(cfg, ctypes.addressof(idx), ctypes.addressof(total), ctypes.addressof(count))
    import mori.jit.core
    print(json.dumps({{"path": _jit_loader._compiled_hsaco["ep_local_expert_count"],
                      "served_by": mori.jit.core.compile_genco.__module__}}))
""")


def test_a_server_running_moris_jit_kernels_gets_the_prebuilt_ones_when_opted_in(smoke_store, hipstub_lib, tmp_path):
    """``gemmar-aot mori-patch install`` and GEMMAR_AOT_PATCH_MORI=1: mori's own local expert count op,
    imported as a server imports it, runs the prebuilt code object (mori's compile_genco and
    ensure_compiled are served; the bound code object is logged); without the variable, mori's JIT
    runs and, with no hipcc in the pod, the op fails."""
    import shutil

    from test_profiles import _fake_installed_mori

    mori_pkg = _mori_pkg()
    site_dir = tmp_path / "site"
    _fake_installed_mori(site_dir, "amd-mori", "1.2.4", mori_pkg.parent, importable=True)
    (site_dir / "mori" / "ops").mkdir(parents=True, exist_ok=True)
    (site_dir / "mori" / "ops" / "__init__.py").write_text("")
    for rel in ("ops/_jit_loader.py", "ops/local_expert_count.py"):
        shutil.copy2(mori_pkg / rel, site_dir / "mori" / rel)
    shutil.copytree(mori_pkg / "jit", site_dir / "mori" / "jit")  # mori's JIT driver, as installed
    pth_dir = tmp_path / "pth"
    pth_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GEMMAR_AOT_", "ROCM_PATH", "MORI_"))}
    env.update(PYTHONPATH=os.pathsep.join((str(site_dir), str(ROOT))), LD_LIBRARY_PATH=str(hipstub_lib.parent),
               MORI_DEVICE_NIC="mlx5", GEMMAR_AOT_HSACO_DIR=str(tmp_path / "hsaco"), PATH="/usr/bin:/bin",
               MORI_JIT_CACHE_DIR=str(tmp_path / "mori-jit"), MORI_GPU_ARCHS="gfx950")  # what mori's JIT reads
    inst = subprocess.run([sys.executable, "-m", "gemmar_aot", "mori-patch", "install", "--site-dir", str(pth_dir)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert inst.returncode == 0, inst.stderr
    code = _SERVER.format(pth_dir=str(pth_dir))
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                        env={**env, "GEMMAR_AOT_PATCH_MORI": "1", "GEMMAR_AOT_ARTIFACTS": str(smoke_store)})
    assert on.returncode == 0, on.stderr[-3000:]
    out = json.loads(on.stdout.splitlines()[-1])
    lock = read_lock(Path(smoke_store) / "locks" / "smoke.lock.json")
    digest = _smoke_hipcc(lock)[HipccVariant("ep_local_expert_count", "gfx950", "mlx5")].entry.blob.hash
    assert out == {"path": str(tmp_path / "hsaco" / f"{digest}.hsaco"), "served_by": "gemmar_aot.mori_patch"}
    told = [ln for ln in on.stderr.splitlines() if "gemmar-aot serves mori.jit.core.compile_genco" in ln]
    assert len(told) == 1 and "src/ops/kernels/ep_local_expert_count.hip -> prebuilt" in told[0], on.stderr
    assert not (tmp_path / "mori-jit").exists() or not any((tmp_path / "mori-jit").rglob("*.hsaco"))
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env=env)
    assert off.returncode != 0 and "hipcc not found" in off.stderr and "not compiled" in off.stderr
