"""Anchors on FlyDSL 0.5.0: mori's own path cold, and a serving process on a warm disk cache.

FlyDSL 0.5.0 compiles with defaults faster than 0.4.2 and disk-caches these kernels,
but a serving process still traces every kernel on every start. This measures, for one
rank of a manifest, in fresh processes of a separate FlyDSL 0.5.0 environment:

cold   mori's builder calls exactly as ``GemmAllReduceOp._compiled`` makes them, FlyDSL
       defaults (source locations on, its disk cache on, pointed at an empty directory),
       compile-only: every kernel a rank's op needs (per M: the GEMM, the fused_order
       tail and the self-test's phases), one at a time;
warm   the same calls in a new process against the now-populated cache: what a pod
       restart costs with FlyDSL 0.5.0 (it re-traces every kernel to find its cache key).

Both report wall time and the process's CPU time (user+sys), plus the load average, since
wall time on a shared machine is noisy. Compare with our runtime's startup to ready for
the same rank (``bench/bench_runtime.py``), which loads prebuilt code objects.

The FlyDSL 0.5.0 environment is a throwaway venv outside the repository (it must not
touch .venv, whose pins the action keys record):

    python3 -m venv /work/notes/venv-flydsl050
    /work/notes/venv-flydsl050/bin/pip install flydsl==0.5.0 torch==2.13.0 numpy==2.4.6

    .venv/bin/python bench/bench_flydsl050.py manifests/dsv4-pro-wo_b.toml --rank 0 \\
        --venv /work/notes/venv-flydsl050 --json-out bench/results/flydsl050-dsv4-pro-wo_b-YYYY-MM-DD-<commit>.json

The mori sources, cco bitcode and ld.lld come from this checkout's toolchain (the same
ones our build uses); only FlyDSL (and what it pulls in) differs.
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


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def plan_calls(manifest: str, rank: int) -> dict:
    """What the anchor process needs, computed with our (0.4.2) environment: the builder
    arguments per M for ``rank`` and the compile environment."""
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan
    from gemmar_aot.toolchain import compile_env, load_toolchain

    tc = load_toolchain()
    env = compile_env(tc)
    env.pop("FLYDSL_RUNTIME_ENABLE_CACHE")  # FlyDSL's defaults: its disk cache is on
    env.pop("FLYDSL_COMPILE_OPT_LEVEL")
    calls = []
    for t in make_plan(load_manifest(manifest)).tuples:
        w = t.workload
        if w.transport != "fused-sdma" or rank >= w.world:
            continue
        calls.append({"world": w.world, "m": w.m, "n": w.n, "k": w.k, "block_m": w.block_m,
                      "block_n": w.block_n, "gather_dtype": w.gather_dtype,
                      "gather_transport": w.gather_transport, "quant": w.quant,
                      "sdma_queues": w.sdma_queues, "slots": t.layout.max_shapes,
                      "slot": t.layout.slot, "m_max": t.layout.m_max})
    return {"env": env, "mori_dir": str(tc.mori_dir), "rank": rank, "calls": calls}


def anchor_process(spec: dict) -> dict:
    """Runs in the FlyDSL 0.5.0 venv: mori's builder calls for one rank, one at a time."""
    t0, c0 = time.perf_counter(), time.process_time()
    import types

    import torch

    os.environ.update(spec["env"])
    sys.path.insert(0, str(ROOT))
    from gemmar_aot.toolchain.mori_import import import_mori_device

    import_mori_device(types.SimpleNamespace(mori_dir=spec["mori_dir"]))
    import flydsl
    import flydsl.expr as fx
    from mori.ops.gemm_ar.kernels_fused import compile_fused_gemm_scatter
    from mori.ops.gemm_ar.kernels_sdma import build_sdma_phases
    from mori.ops.gemm_ar.op import _build_cfg

    t_imp, c_imp = time.perf_counter(), time.process_time()
    rank = spec["rank"]
    kinds: dict[str, list[float]] = {}
    for a in spec["calls"]:
        cfg = _build_cfg(world_size=a["world"], m_pad=a["m"], n=a["n"], block_m=a["block_m"],
                         gather_dtype=a["gather_dtype"], gather_transport=a["gather_transport"],
                         counter_capacity=8, shape_slots=a["slots"], shape_index=a["slot"],
                         capacity_m=a["m_max"])
        gemm = compile_fused_gemm_scatter(
            cfg, rank, K=a["k"], BLOCK_M=a["block_m"], BLOCK_N=a["block_n"], b_preshuffled=True,
            fuse=True, transport="sdma", quant=a["quant"], sdma_queues=a["sdma_queues"],
            swap_ab=True, permlane=True, lane_transpose=True)
        parts = build_sdma_phases(cfg, rank, queues=a["sdma_queues"])
        m, n, k = a["m"], a["n"], a["k"]
        if a["quant"] == "mxfp8":
            sa = torch.empty(m * k // 128, dtype=torch.int32)
            sb = torch.empty((n // 32) * (k // 32), dtype=torch.int32)
        else:
            sa = torch.empty(m * (k // 128), dtype=torch.float32)
            sb = torch.empty((n // 128) * (k // 128), dtype=torch.float32)
        args = (torch.empty(m * k, dtype=torch.int8), torch.empty(n * k, dtype=torch.int8),
                torch.empty(m * n, dtype=torch.bfloat16), sa, sb, m, n, 0, 0)
        s = time.perf_counter()
        gemm(*args, stream=fx.Stream(None))
        kinds.setdefault("gemm", []).append(time.perf_counter() - s)
        for name in dict.fromkeys(parts["fused_order"] + parts["order"]):
            s = time.perf_counter()
            parts[name](0, 0, stream=fx.Stream(None))
            kinds.setdefault(name, []).append(time.perf_counter() - s)
    t1, c1 = time.perf_counter(), time.process_time()
    return {
        "flydsl": flydsl.__version__,
        "kernels": sum(len(v) for v in kinds.values()),
        "import_wall_seconds": round(t_imp - t0, 3),
        "import_cpu_seconds": round(c_imp - c0, 3),
        "kernels_wall_seconds": round(t1 - t_imp, 3),
        "kernels_cpu_seconds": round(c1 - c_imp, 3),
        "process_wall_seconds": round(t1 - t0, 3),
        "process_cpu_seconds": round(c1 - c0, 3),
        "by_kind": {k: {"count": len(v), "mean_seconds": round(sum(v) / len(v), 4)} for k, v in kinds.items()},
    }


def run_anchor(python: str, spec: dict, cache_dir: str) -> dict:
    spec = dict(spec, env=dict(spec["env"], FLYDSL_RUNTIME_CACHE_DIR=cache_dir))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLYDSL_", "MORI_", "PYTHONPATH"))}
    load = _loadavg()
    t0 = time.perf_counter()
    proc = subprocess.run([python, __file__, "--anchor-process"], input=json.dumps(spec), capture_output=True,
                          text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"anchor process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res.update(bench_wall_seconds=round(wall, 2), loadavg_before=load, loadavg_after=_loadavg(),
               cache_files=sum(1 for p in Path(cache_dir).rglob("*") if p.is_file()))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifest", nargs="?")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--venv", default="/work/notes/venv-flydsl050",
                    help="the FlyDSL 0.5.0 virtual environment (see the module docstring to create it)")
    ap.add_argument("--anchor-process", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    if a.anchor_process:
        print(json.dumps(anchor_process(json.loads(sys.stdin.read()))))
        return
    python = str(Path(a.venv) / "bin" / "python")
    if not Path(python).exists():
        sys.exit(f"no FlyDSL 0.5.0 venv at {a.venv}: create it as the module docstring says")
    spec = plan_calls(a.manifest, a.rank)
    with tempfile.TemporaryDirectory(prefix="flydsl050-cache-") as cache:
        cold = run_anchor(python, spec, cache)
        print(f"cold (FlyDSL {cold['flydsl']}, rank {a.rank}): {cold['kernels']} kernels, "
              f"{cold['process_wall_seconds']} s wall / {cold['process_cpu_seconds']} s CPU, "
              f"load {cold['loadavg_before']}", flush=True)
        warm = run_anchor(python, spec, cache)
        print(f"warm cache: {warm['process_wall_seconds']} s wall / {warm['process_cpu_seconds']} s CPU "
              f"(kernels {warm['kernels_wall_seconds']} s / {warm['kernels_cpu_seconds']} s CPU), "
              f"load {warm['loadavg_before']}", flush=True)
    result = {"manifest": a.manifest, "rank": a.rank, "machine": {"cpus": os.cpu_count()},
              "cold": cold, "warm": warm}
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json_out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
