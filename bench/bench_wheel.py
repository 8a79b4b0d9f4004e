"""Measure artifact wheels: size of the reference manifest's wheel, and install-to-ready time.

Usage::

    python bench/bench_wheel.py                        # uses the dsv4-pro-wo_b store in artifacts/ (make build)
    python bench/bench_wheel.py --store DIR --repeat 5 --json

(a) **Size**: the wheel of ``manifests/dsv4-pro-wo_b.toml`` written from its existing lock
    (the store is only read; nothing is compiled), against the raw code-object bytes the
    lock names, the same blobs as the build store holds them, and the lock file. Also: the
    time to write the wheel (verify + re-encode every blob, train the dictionary, zip) and
    whether a second write to another directory is byte-identical.

(b) **Install to ready**, per repetition, in a fresh virtual environment (``python -m venv``;
    gemmar_aot, torch and the test fakes come from this checkout's .venv through a ``.pth``):
    ``pip install --no-deps --no-index WHEEL``, then one new interpreter that imports the
    runtime, discovers the installed wheel through its entry point (no path, no env var)
    and constructs ``GemmAllReduceOp`` for one rank (N 7168, K 2048, world 8, m_max 16384)
    with tests/fakes.py's ``FakeHipDriver`` until it is ready (every blob read from
    site-packages, zstd-decoded, sha256-verified, parsed, checked against its launch record
    and "loaded"). The communicator is host memory allocated lazily (the 700 MiB window is
    never touched). NOT measurable here: ``hipModuleLoadData`` and the GPU memset (no GPU);
    the fake driver's own code-object parse stands in for the module load, and the self-test
    is off (it needs the other ranks). The interpreter's ``import torch`` (which a serving
    process pays anyway) is reported separately from our own imports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import site
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "manifests" / "dsv4-pro-wo_b.toml"
LOCK_NAME = "dsv4-pro-wo_b.lock.json"
CANDIDATE_STORES = (ROOT / "artifacts",)  # or --store DIR

PROBE = r"""
import json, sys, time
t_start = time.perf_counter()
import torch
t_torch = time.perf_counter()
from fakes import FakeCommunicator, FakeHipDriver
from gemmar_aot.runtime import GemmAllReduceOp, load_artifacts
from gemmar_aot.model.lock import read_lock
t_import = time.perf_counter()

arts = load_artifacts()  # installed entry points only
t_discover = time.perf_counter()
src = arts.sources[0]
drv = FakeHipDriver([read_lock(src.lock_path).check_parts()])
t_oracle = time.perf_counter()
op = GemmAllReduceOp(FakeCommunicator(int(sys.argv[1]), 8, lazy=True), n=7168, k=2048, m_max=16384, driver=drv, self_test=False)
t_ready = time.perf_counter()
print(json.dumps({
    "source": [str(src.lock_path), src.origin],
    "m_values": list(op.m_values),
    "modules_loaded": drv.counters["load_module"],
    "import_torch_ms": (t_torch - t_start) * 1e3,
    "import_runtime_and_fakes_ms": (t_import - t_torch) * 1e3,
    "discover_ms": (t_discover - t_import) * 1e3,
    "construct_to_ready_ms": (t_ready - t_oracle) * 1e3,
}))
"""


def find_store(explicit: Path | None) -> Path:
    for s in ([explicit] if explicit else list(CANDIDATE_STORES)):
        if s and (s / "locks" / LOCK_NAME).is_file():
            return s
    raise SystemExit(f"no store with locks/{LOCK_NAME} (tried {[str(s) for s in CANDIDATE_STORES]}); build it: "
                     f"gemmar-aot build {MANIFEST} [--store DIR]")


def _stats(xs: list[float]) -> dict:
    return {"min": round(min(xs), 1), "median": round(statistics.median(xs), 1), "max": round(max(xs), 1),
            "n": len(xs)}


def fresh_env(path: Path) -> tuple[Path, Path]:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    py = path / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()] or [sysconfig.get_path("purelib")]
    (purelib / "_gemmar_aot_dev.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in ours))
    return py, purelib


def bench_size(store: Path, work: Path) -> dict:
    from gemmar_aot.store import Store
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.package.wheel_layout import lock_sizes
    from gemmar_aot.package.wheel import wheel_from_lock

    lock_path = store / "locks" / LOCK_NAME
    lock = read_lock(lock_path).check_parts()
    t0 = time.perf_counter()
    s = wheel_from_lock(lock_path, store, MANIFEST, work / "dist")
    write_s = time.perf_counter() - t0
    again = wheel_from_lock(lock_path, store, MANIFEST, work / "dist2")
    st = Store(store, readonly=True)
    sizes = lock_sizes(lock)
    store_files = sum(st.blob_path(d).stat().st_size for d in sizes)
    parts = {"blobs": 0, "lock": 0, "BUILD_INFO.json": 0, "RECORD": 0, "other": 0}
    with zipfile.ZipFile(s["wheel"]) as zf:
        infos = zf.infolist()
        for zi in infos:
            n = zi.filename
            k = ("lock" if n.endswith(("/lock.json", "/lock.json.zst")) else  # zstd (or, before, deflated)
                 "blobs" if n.endswith((".zst", ".pack")) else
                 "BUILD_INFO.json" if n.endswith("/BUILD_INFO.json") else "RECORD" if n.endswith("/RECORD") else "other")
            parts[k] += zi.compress_size
    parts["zip_headers_and_directory"] = s["wheel_bytes"] - sum(parts.values())
    return {
        "wheel": s["wheel"],
        "zip_entries": len(infos),
        "wheel_bytes_by_part": parts,
        "distribution": s["distribution"],
        "version": s["version"],
        "kernels": s["kernels"],
        "code_objects": s["code_objects"],
        "raw_code_object_bytes": s["raw_bytes"],
        "wheel_bytes": s["wheel_bytes"],
        "blob_bytes_in_wheel": s["blob_bytes"],
        "dictionary_file_bytes": s["dictionary_file_bytes"],
        "same_blobs_in_build_store_bytes": store_files,
        "lock_bytes": lock_path.stat().st_size,
        "raw_over_wheel": round(s["raw_bytes"] / s["wheel_bytes"], 2),
        "write_seconds": round(write_s, 2),
        "second_write_byte_identical": Path(again["wheel"]).read_bytes() == Path(s["wheel"]).read_bytes(),
    }


def bench_install(wheel: Path, work: Path, repeat: int, rank: int) -> dict:
    venv_ms, pip_ms, probe_wall_ms, total_ms = [], [], [], []
    inner: dict[str, list[float]] = {}
    last = {}
    for i in range(repeat):
        env_dir = work / f"venv{i}"
        t0 = time.perf_counter()
        py, _purelib = fresh_env(env_dir)
        t1 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                        "--disable-pip-version-check", "--no-input", "-q", str(wheel)], check=True)
        t2 = time.perf_counter()
        probe = env_dir / "probe.py"
        probe.write_text(PROBE)
        env = {k: v for k, v in os.environ.items()
               if k not in ("GEMMAR_AOT_ARTIFACTS", "GEMMAR_AOT_STORE", "VIRTUAL_ENV", "PYTHONPATH")}
        env["PYTHONPATH"] = str(ROOT / "tests")  # the fakes
        out = subprocess.run([str(py), str(probe), str(rank)], check=False, capture_output=True, text=True,
                             env=env, cwd=env_dir)
        if out.returncode:
            raise SystemExit(f"the probe failed in {env_dir}:\n{out.stdout}{out.stderr}")
        t3 = time.perf_counter()
        last = json.loads(out.stdout.strip().splitlines()[-1])
        venv_ms.append((t1 - t0) * 1e3)
        pip_ms.append((t2 - t1) * 1e3)
        probe_wall_ms.append((t3 - t2) * 1e3)
        total_ms.append((t3 - t1) * 1e3)
        for k, v in last.items():
            if k.endswith("_ms"):
                inner.setdefault(k, []).append(v)
        shutil.rmtree(env_dir)
    return {
        "rank": rank,
        "source": last.get("source"),
        "m_values": last.get("m_values"),
        "modules_loaded": last.get("modules_loaded"),
        "create_venv_ms": _stats(venv_ms),
        "pip_install_ms": _stats(pip_ms),
        "new_interpreter_to_ready_ms": _stats(probe_wall_ms),
        **{k: _stats(v) for k, v in inner.items()},
        "install_to_ready_ms": _stats(total_ms),
        "not_measured": "hipModuleLoadData and the GPU memset (no GPU here; the fake driver's code-object parse "
                        "stands in for the module load), the self-test kernels (need the other ranks)",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=None, help="store holding locks/" + LOCK_NAME)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    store = find_store(args.store)
    with tempfile.TemporaryDirectory(prefix="gemmar-bench-wheel-") as tmp:
        work = Path(tmp)
        size = bench_size(store, work)
        install = bench_install(Path(size["wheel"]), work, args.repeat, args.rank)
    res = {"store": str(store), "manifest": str(MANIFEST.relative_to(ROOT)), "size": size, "install": install,
           "host": {"python": platform.python_version(), "machine": platform.machine(),
                    "cpus": os.cpu_count()}}
    if args.json:
        print(json.dumps(res, indent=2, sort_keys=True))
        return 0
    s, i = size, install
    mib = 2 ** 20
    print(f"{s['distribution']} {s['version']}: {s['kernels']} kernels, {s['code_objects']} code objects")
    print(f"  raw code objects        {s['raw_code_object_bytes']:>12,d} B  ({s['raw_code_object_bytes'] / mib:.2f} MiB)")
    print(f"  same blobs, build store {s['same_blobs_in_build_store_bytes']:>12,d} B")
    print(f"  blobs in the wheel      {s['blob_bytes_in_wheel']:>12,d} B  + dictionary {s['dictionary_file_bytes']:,d} B")
    print(f"  lock file (raw)         {s['lock_bytes']:>12,d} B")
    print(f"  wheel                   {s['wheel_bytes']:>12,d} B  ({s['wheel_bytes'] / mib:.2f} MiB; raw/wheel "
          f"{s['raw_over_wheel']}x)")
    print("  wheel bytes by part:    " + ", ".join(f"{k} {v:,d}" for k, v in s["wheel_bytes_by_part"].items())
          + f" ({s['zip_entries']} entries)")
    print(f"  written in {s['write_seconds']} s; second write byte-identical: {s['second_write_byte_identical']}")
    print(f"install to ready (rank {i['rank']}, {len(i['m_values'] or [])} M values, {i['modules_loaded']} modules; "
          f"median of {i['install_to_ready_ms']['n']}):")
    for k in ("pip_install_ms", "new_interpreter_to_ready_ms", "import_torch_ms", "import_runtime_and_fakes_ms",
              "discover_ms", "construct_to_ready_ms", "install_to_ready_ms"):
        print(f"  {k:<30} {i[k]['median']:>9.1f} ms  (min {i[k]['min']}, max {i[k]['max']})")
    print(f"  (fresh venv creation, not counted: {i['create_venv_ms']['median']:.0f} ms)")
    print(f"  not measured: {i['not_measured']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
