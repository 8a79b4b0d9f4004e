"""EP dispatch/combine v2 ahead of time against mori's own first-call compiles (issue 32).

Usage::

    python bench/bench_ep_build.py [--manifest manifests/dsv4-pro-ep.toml] [--rounds 2] [--json-out FILE]

Per round, interleaved, per ``[[ep]]`` entry of the manifest:

* ``ours``: ``gemmar-aot build`` of a manifest holding that entry alone, into an empty store,
  ``-j 2`` (every rank's kernels): wall and CPU seconds (the process and its workers), kernels;
* ``mori``: what mori's own op compiles on its first calls, **the anchor**: mori's
  ``EpDispatchCombineOpFlyDSL`` constructed for one rank (``tests/ep_oracle.py``'s test doubles)
  and every kernel it makes (replay's included) compiled through FlyDSL's own path, one
  process per rank, all ranks in turn: CPU seconds per rank and for the world, whole
  processes (start, imports, the host window) and the compiles alone (the stalls a pod takes
  on the first call of each bucket; ours serves them with none).

Also the bytes the entries add to an artifact wheel (``gemmar-aot wheel`` of the manifest).
Beside them, the speed reference of ``bench_runtime.py``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]
from _results import commit, emit  # noqa: E402


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def ours(manifest: Path, store: Path) -> dict:
    c0, t0 = _children_cpu(), time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "build", str(manifest), "--store", str(store), "-j", "2",
                        "--json", "-q"], capture_output=True, text=True, cwd=ROOT)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if p.returncode != 0:
        raise SystemExit(f"build failed: {p.stderr[-2000:]}")
    s = json.loads(p.stdout)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "compiled": s["compiled"], "failed": s["failed"]}


def mori(fields: dict) -> dict:
    c0, t0 = _children_cpu(), time.perf_counter()
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "ep_oracle.py"),
                        json.dumps({"configs": [fields], "compile": True})], capture_output=True, text=True, cwd=ROOT)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if p.returncode != 0:
        raise SystemExit(f"mori's path failed: {p.stderr[-2000:]}")
    (out,) = json.loads(p.stdout)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "kernels": len(out["kernels"]),
            "compile_cpu_s": round(sum(k["compile_cpu_s"] for k in out["kernels"]), 3),
            "compile_cpu_s_per_kernel": sorted(round(k["compile_cpu_s"], 3) for k in out["kernels"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", type=Path, default=ROOT / "manifests" / "dsv4-pro-ep.toml")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()

    from bench_runtime import python_speed_ms
    from test_ep import mori_fields

    from gemmar_aot.builder.manifest import load_manifest

    text = a.manifest.read_text()
    head, *entries = text.split("[[ep]]")
    configs = [e.config for e in load_manifest(a.manifest).eps]
    speed_before = python_speed_ms()
    result: dict = {"manifest": str(a.manifest), "rounds": a.rounds, "entries": []}
    with tempfile.TemporaryDirectory(prefix="bench-ep-") as tmp:
        tmp = Path(tmp)
        runs = {i: {"ours": [], "mori_world": [], "mori_rank": []} for i in range(len(entries))}
        for r in range(a.rounds):
            for i, (body, c) in enumerate(zip(entries, configs)):
                m = tmp / f"entry{i}.toml"
                m.write_text(head + "[[ep]]" + body)
                runs[i]["ours"].append(ours(m, tmp / f"store-{r}-{i}"))
                per_rank = [mori(mori_fields(c, rank)) for rank in range(c.world)]
                runs[i]["mori_rank"].append(per_rank)
                runs[i]["mori_world"].append({"cpu_s": round(sum(x["cpu_s"] for x in per_rank), 3),
                                              "compile_cpu_s": round(sum(x["compile_cpu_s"] for x in per_rank), 3),
                                              "wall_s": round(sum(x["wall_s"] for x in per_rank), 3),
                                              "kernels": sum(x["kernels"] for x in per_rank)})
        for i, c in enumerate(configs):
            rs = runs[i]
            result["entries"].append({
                "config": c.to_json(),
                "ours": {"cpu_s_median": statistics.median(x["cpu_s"] for x in rs["ours"]),
                         "wall_s_median": statistics.median(x["wall_s"] for x in rs["ours"]),
                         "compiled": rs["ours"][-1]["compiled"], "runs": rs["ours"]},
                "mori_world": {"cpu_s_median": statistics.median(x["cpu_s"] for x in rs["mori_world"]),
                               "wall_s_median": statistics.median(x["wall_s"] for x in rs["mori_world"]),
                               "kernels": rs["mori_world"][-1]["kernels"], "runs": rs["mori_world"]},
                "mori_rank0_cpu_s_median": statistics.median(x[0]["cpu_s"] for x in rs["mori_rank"]),
                "mori_world_compile_cpu_s_median": statistics.median(x["compile_cpu_s"] for x in rs["mori_world"]),
                "mori_rank0_compile_cpu_s_median": statistics.median(x[0]["compile_cpu_s"] for x in rs["mori_rank"]),
                "mori_rank0_compile_cpu_s_per_kernel": rs["mori_rank"][-1][0]["compile_cpu_s_per_kernel"],
            })
        p = subprocess.run([sys.executable, "-m", "gemmar_aot", "wheel", str(a.manifest), "--store",
                            str(tmp / "wheel-store"), "--out", str(tmp / "dist"), "-j", "2", "--json"],
                           capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0:
            raise SystemExit(f"wheel failed: {p.stderr[-2000:]}")
        whl = next((tmp / "dist").glob("*.whl"))
        result["wheel_bytes"] = whl.stat().st_size
    result["python_speed_ms"] = {"before": speed_before, "after": python_speed_ms()}
    result["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result["commit"] = commit()
    return emit(result, a.json_out)


if __name__ == "__main__":
    raise SystemExit(main())
