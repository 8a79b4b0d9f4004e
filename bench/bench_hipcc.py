"""mori's hipcc-JIT kernels ahead of time against mori's own first-use JIT (issue 39).

Usage::

    python bench/bench_hipcc.py --store DIR [--archs gfx950,gfx942] [--sources all] [--nic-source ep_internode_v1]
                                [--json-out FILE]

Per arch and source, interleaved (the order alternates), one compile at a time:

* ``ours``: ``gemmar-aot build`` of a manifest holding that one ``[[hipcc]]`` code object (mlx5)
  into ``DIR`` (so ``DIR`` ends up holding every source of every arch): wall and CPU seconds of the
  whole command (Python, plan, keys, the clang process, the store);
* ``mori``: **the anchor**, what a pod pays on the first use of that family today: mori's own
  ``compile_genco`` (``tests/hipcc_oracle.py``) through a ``hipcc`` that runs the same clang
  (``tests/hipcc_shim.py``), in a process of its own: wall and CPU seconds; its bytes are checked
  equal to ours as they come.

Then, with ``--nic-source``, that source's other NIC variants (gfx950) the same way; a lock of
every code object built (``DIR/locks``, for ``GEMMAR_AOT_TEST_HIPCC_STORE``); a pod's time to
ready -- ``gemmar_aot.runtime.hipcc_server``'s ``compile_genco`` handing mori each code object (checked,
written to its file: cold; then again with the file there: warm), per arch on the HIP double --
beside mori's first-use compiles of the same sources; and the bytes: raw, stored (zstd) and in
an artifact wheel of each arch's manifest. Beside them, the speed reference of ``bench_runtime.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]
from _results import commit, emit  # noqa: E402

_POD = """
import json, sys, time
import torch  # loaded in every pod before mori asks (mori imports it): not the server's cost
from gemmar_aot.runtime.hipcc_server import HipccServer
from gemmar_aot.runtime.hip import HipDriver
srv = HipccServer({store!r}, driver=HipDriver(), directory={out!r})
t = {{}}
for name, d in {sources!r}:
    t0 = time.perf_counter()
    srv.path(name, d)
    t[name] = time.perf_counter() - t0
print(json.dumps(t))
"""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, float, float]:
    c0, t0 = _children_cpu(), time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return p, time.perf_counter() - t0, _children_cpu() - c0


def manifest_text(name: str, arch: str, entries: list[tuple[list[str], list[str]]]) -> str:
    body = "".join(f"[[hipcc]]\nsources = {json.dumps(s)}\narchs = [\"{arch}\"]\nnics = {json.dumps(n)}\n\n"
                   for s, n in entries)
    return f'[manifest]\nname = "{name}"\narch = "{arch}"\n\n{body}'


def ours(tmp: Path, store: Path, arch: str, source: str, nic: str) -> dict:
    m = tmp / f"one-{arch}-{source}-{nic}.toml"
    m.write_text(manifest_text(f"one-{arch}-{source}-{nic}", arch, [([source], [nic])]))
    p, wall, cpu = _timed([sys.executable, "-m", "gemmar_aot", "build", str(m), "--store", str(store), "-j", "1",
                           "--json", "-q"], cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"build failed: {p.stdout[-1000:]}{p.stderr[-2000:]}")
    s = json.loads(p.stdout)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "compiled": s["compiled"]}


def mori(tmp: Path, variant) -> dict:
    from test_hipcc import _fake_rocm

    from gemmar_aot.toolchain import load_toolchain

    work = Path(tempfile.mkdtemp(prefix="mori-", dir=tmp))
    tc = load_toolchain()
    env = {**os.environ, "GEMMAR_AOT_TOOLCHAIN": str(tc.root), "PYTHONPATH": str(ROOT)}
    p, wall, cpu = _timed([sys.executable, str(ROOT / "tests" / "hipcc_oracle.py"), str(_fake_rocm(work)),
                           str(tc.mori_dir), str(work / "cache"), json.dumps([{**variant.to_json(), "dir": variant.dir}])],
                          env=env)
    if p.returncode != 0:
        raise SystemExit(f"mori's compile_genco failed: {p.stderr[-2000:]}")
    (got,) = json.loads(p.stdout.splitlines()[-1])
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "sha256": got["sha256"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--archs", default="gfx950,gfx942")
    ap.add_argument("--sources", default="all")
    ap.add_argument("--nic-source", default="ep_internode_v1")
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()

    from bench_runtime import python_speed_ms

    from gemmar_aot.model.hipcc import NICS, SOURCES, HipccVariant
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.store import Store

    sources = list(SOURCES) if a.sources == "all" else a.sources.split(",")
    archs = a.archs.split(",")
    speed_before = python_speed_ms()
    result: dict = {"archs": archs, "sources": sources, "nic_source": a.nic_source, "compiles": []}
    st = a.store
    with tempfile.TemporaryDirectory(prefix="bench-hipcc-") as tmp:
        tmp = Path(tmp)
        todo = [(arch, s, "mlx5") for arch in archs for s in sources]
        todo += [("gfx950", a.nic_source, n) for n in NICS if n != "mlx5"] if a.nic_source else []
        for i, (arch, src, nic) in enumerate(todo):
            v = HipccVariant(src, arch, nic)
            if i % 2:  # interleaved: the order alternates
                m_run, o_run = mori(tmp, v), ours(tmp, st, arch, src, nic)
            else:
                o_run, m_run = ours(tmp, st, arch, src, nic), mori(tmp, v)
            (h,) = read_lock(st / "locks" / f"one-{arch}-{src}-{nic}.lock.json").hipcc
            digest = h.entry.blob.hash
            m_run["bytes_equal"] = m_run.pop("sha256") == digest
            blob = Store(st, readonly=True).blob_path(digest)
            result["compiles"].append({**v.to_json(), "ours": o_run, "mori": m_run, "raw_bytes": h.entry.blob.size,
                                       "stored_bytes": blob.stat().st_size, "sha256": digest})
            print(json.dumps(result["compiles"][-1]), file=sys.stderr, flush=True)
        # every arch's manifest: the lock the byte test reads, the wheel's bytes
        result["wheels"], result["ready"] = {}, {}
        for arch in archs:
            m = tmp / f"all-{arch}.toml"
            m.write_text(manifest_text(f"bench-hipcc-{arch}", arch, [(sources, ["mlx5"])]))
            p = subprocess.run([sys.executable, "-m", "gemmar_aot", "wheel", str(m), "--store", str(st), "--out",
                                str(tmp / f"dist-{arch}"), "--json"], capture_output=True, text=True, cwd=ROOT)
            if p.returncode != 0:
                raise SystemExit(f"wheel failed: {p.stderr[-2000:]}")
            result["wheels"][arch] = next((tmp / f"dist-{arch}").glob("*.whl")).stat().st_size
            result["ready"][arch] = pod_ready(tmp, st, arch, sources)
        if a.nic_source:
            m = tmp / "nics.toml"
            m.write_text(manifest_text("bench-hipcc-nics", "gfx950", [([a.nic_source], list(NICS))]))
            subprocess.run([sys.executable, "-m", "gemmar_aot", "build", str(m), "--store", str(st), "-q"], check=True,
                           capture_output=True, cwd=ROOT)
    result["python_speed_ms"] = {"before": speed_before, "after": python_speed_ms()}
    result["totals"] = summarise(result)
    result["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result["commit"] = commit()
    return emit(result, a.json_out)


def summarise(result: dict) -> dict:
    """Per arch (its mlx5 objects) and per NIC variant: the sums BENCHMARKS.md's rows read."""
    out: dict = {"bytes_equal": sum(c["mori"]["bytes_equal"] for c in result["compiles"]),
                 "compiles": len(result["compiles"])}
    for arch in result["archs"]:
        cs = [c for c in result["compiles"] if c["arch"] == arch and c["nic"] == "mlx5"]
        out[arch] = {"sources": len(cs), "ours_cpu_s": round(sum(c["ours"]["cpu_s"] for c in cs), 2),
                     "mori_cpu_s": round(sum(c["mori"]["cpu_s"] for c in cs), 2),
                     "raw_bytes": sum(c["raw_bytes"] for c in cs), "stored_bytes": sum(c["stored_bytes"] for c in cs),
                     "wheel_bytes": result["wheels"][arch], "ready_cold_s": result["ready"][arch]["cold"]["total_s"],
                     "ready_warm_s": result["ready"][arch]["warm"]["total_s"]}
    nics = [c for c in result["compiles"] if c["arch"] == "gfx950" and c["source"] == result.get("nic_source")]
    if nics:
        out["nic_variants"] = {c["nic"]: {"raw_bytes": c["raw_bytes"], "stored_bytes": c["stored_bytes"],
                                          "ours_cpu_s": c["ours"]["cpu_s"], "mori_cpu_s": c["mori"]["cpu_s"]}
                               for c in nics}
    return out


def pod_ready(tmp: Path, store: Path, arch: str, sources: list[str]) -> dict:
    """A pod's time to hand mori every code object of ``arch``: cold (checked, written) and warm (the
    file there, its bytes hashed), on the HIP double of that arch, mori's JIT driver bare."""
    from hipstub import build as hipstub_build

    from gemmar_aot.model.hipcc import SOURCES
    from gemmar_aot.toolchain import load_toolchain

    lib = hipstub_build(tmp / "hipstub")
    out = tmp / f"hsaco-{arch}"
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "HIPSTUB_ARCH": arch, "MORI_DEVICE_NIC": "mlx5",
           "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "tests")))}
    env.pop("MORI_GPU_ARCHS", None)  # the arch as the GPU reports it, through HIP
    prelude = ("import sys, types, importlib.machinery\n"
               f"pkg = {str(load_toolchain().mori_dir / 'mori')!r}\n"
               "m = types.ModuleType('mori'); s = importlib.machinery.ModuleSpec('mori', None, is_package=True)\n"
               "s.submodule_search_locations = [pkg]; m.__spec__, m.__path__ = s, [pkg]; sys.modules['mori'] = m\n")
    code = prelude + _POD.format(store=str(store), out=str(out), sources=[(s, SOURCES[s]) for s in sources])
    runs = {}
    for what in ("cold", "warm"):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise SystemExit(f"pod failed: {p.stderr[-2000:]}")
        runs[what] = json.loads(p.stdout.splitlines()[-1])
    return {w: {"total_s": round(sum(t.values()), 4), "per_source_s": {k: round(x, 4) for k, x in t.items()}}
            for w, t in runs.items()}


if __name__ == "__main__":
    raise SystemExit(main())
