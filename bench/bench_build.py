"""Benchmark: ``gemmar-aot build`` against FlyDSL's default compile path.

ours      ``gemmar-aot build MANIFEST`` in a subprocess (wall time, worker start-up
          and imports included), parallel workers, source locations off, each
          distinct spec compiled once.
baseline  what every serving process does today, one kernel at a time in one
          process with FlyDSL's defaults (source locations on): per M and rank,
          mori's own builder calls exactly as ``GemmAllReduceOp._compiled`` makes
          them, then each launcher traced once (GEMM, the fused_order tail and
          the self-test's scatter). No deduplication: that is the point.

    .venv/bin/python bench/bench_build.py manifests/dsv4-pro-wo_b.toml --jobs 2 \
        --json-out bench/results/build-dsv4-pro-wo_b-YYYY-MM-DD-<commit>.json

``--baseline-limit N`` times only the first N (M, rank) pairs and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_ours(manifest: str, jobs: int | None) -> dict:
    out = tempfile.mkdtemp(prefix="gemmar-bench-")
    cmd = [sys.executable, "-m", "gemmar_aot", "build", manifest, "--out", out, "--json", "-q"]
    if jobs:
        cmd += ["-j", str(jobs)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"gemmar-aot build failed ({proc.returncode}):\n{proc.stderr[-4000:]}\n{proc.stdout[-4000:]}")
    summary = json.loads(proc.stdout)
    summary["bench_wall_seconds"] = round(wall, 2)
    return summary


def baseline_worker(manifest: str, limit: int | None) -> dict:
    """Runs inside a fresh process: FlyDSL defaults, mori's builders, one at a time."""
    import torch  # noqa: F401  (FlyDSL imports it anyway; keep it out of the timings)

    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan
    from gemmar_aot.toolchain import compile_env, import_mori_device, load_toolchain

    tc = load_toolchain()
    os.environ.update(compile_env(tc))
    import_mori_device(tc)
    import flydsl.expr as fx
    from mori.ops.gemm_ar.kernels_fused import compile_fused_gemm_scatter
    from mori.ops.gemm_ar.kernels_sdma import build_sdma_phases
    from mori.ops.gemm_ar.op import _build_cfg

    from gemmar_aot_kernels._common import gemm_placeholders

    plan = make_plan(load_manifest(manifest))
    times: dict[str, list[float]] = {}
    pairs = 0
    t_all = time.perf_counter()
    for t in plan.tuples:
        w = t.workload
        if w.transport != "fused-sdma":
            continue
        for rank in range(w.world):
            if limit is not None and pairs >= limit:
                break
            pairs += 1
            cfg = _build_cfg(world_size=w.world, m_pad=w.m, n=w.n, block_m=w.block_m,
                             gather_dtype=w.gather_dtype, gather_transport=w.gather_transport,
                             counter_capacity=8, shape_slots=t.layout.max_shapes,
                             shape_index=t.layout.slot, capacity_m=t.layout.m_max)
            gemm = compile_fused_gemm_scatter(
                cfg, rank, K=w.k, BLOCK_M=w.block_m, BLOCK_N=w.block_n, b_preshuffled=True,
                fuse=True, transport="sdma", quant=w.quant, sdma_queues=w.sdma_queues,
                swap_ab=True, permlane=True, lane_transpose=True)
            parts = build_sdma_phases(cfg, rank, queues=w.sdma_queues)
            s = time.perf_counter()
            gemm(*gemm_placeholders(m=w.m, n=w.n, k=w.k, quant=w.quant), stream=fx.Stream(None))
            times.setdefault("gemm", []).append(time.perf_counter() - s)
            for name in dict.fromkeys(parts["fused_order"] + parts["order"]):
                s = time.perf_counter()
                parts[name](0, 0, stream=fx.Stream(None))
                times.setdefault(name, []).append(time.perf_counter() - s)
    total = time.perf_counter() - t_all
    return {
        "pairs": pairs,
        "kernels": sum(len(v) for v in times.values()),
        "seconds": round(total, 2),
        "by_kind": {k: {"count": len(v), "mean_seconds": round(sum(v) / len(v), 3)} for k, v in times.items()},
    }


def run_baseline(manifest: str, limit: int | None) -> dict:
    cmd = [sys.executable, __file__, manifest, "--baseline-worker"]
    if limit is not None:
        cmd += ["--baseline-limit", str(limit)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"baseline failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["bench_wall_seconds"] = round(time.perf_counter() - t0, 2)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifest")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--baseline-limit", type=int, default=None,
                    help="time only the first N (M, rank) pairs of the baseline")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--baseline-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    if a.baseline_worker:
        print(json.dumps(baseline_worker(a.manifest, a.baseline_limit)))
        return
    ours = run_ours(a.manifest, a.jobs)
    result = {"manifest": a.manifest, "machine": {"cpus": os.cpu_count()}, "ours": ours}
    print(f"ours: {ours['compiled']} kernels in {ours['bench_wall_seconds']} s wall "
          f"({ours['jobs']} workers)", flush=True)
    if not a.skip_baseline:
        base = run_baseline(a.manifest, a.baseline_limit)
        result["baseline"] = base
        scope = "whole manifest" if a.baseline_limit is None else f"first {base['pairs']} (M, rank) pairs"
        print(f"baseline ({scope}): {base['kernels']} kernels in {base['bench_wall_seconds']} s", flush=True)
        if a.baseline_limit is None:
            result["speedup"] = round(base["bench_wall_seconds"] / ours["bench_wall_seconds"], 1)
            print(f"speedup: {result['speedup']}x")
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json_out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
