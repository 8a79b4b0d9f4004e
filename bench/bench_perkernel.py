"""Per-kernel CPU, before/after a compile-worker change, same specs, same bytes.

Runs the worker module of git revision REV (``gemmar_aot/compiler/worker.py`` as it was
there) and the current one in fresh processes, alternating (old, new, old, new...), on the
same reference specs in build order (GEMMs, then whole phase groups), and reports CPU
seconds per kernel kind (process CPU time, not wall: it holds up better on a shared
machine) and a digest over every code object, which must be equal.

    .venv/bin/python bench/bench_perkernel.py --old-rev fe5edc2 --gemms 4 --groups 6 --rounds 2 \\
        --json-out bench/results/perkernel-dsv4-pro-wo_b-YYYY-MM-DD-<commit>.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(which: str, old_dir: str, manifest: str, n_gemms: int, n_groups: int) -> dict:
    c0 = time.process_time()
    sys.path.insert(0, old_dir)
    worker = importlib.import_module("old_worker" if which == "old" else "gemmar_aot.compiler.worker")
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan
    from gemmar_aot_kernels import recipe_module

    worker.init(None, False)
    init_cpu = time.process_time() - c0
    plan = make_plan(load_manifest(manifest))
    gemms = [s for s in plan.specs if s.kind == "gemm"][:n_gemms]
    groups: dict[str, list] = defaultdict(list)
    for s in plan.specs:
        if s.kind != "gemm":
            groups[recipe_module(s.recipe).build_group(s) or s.spec_id].append(s)
    phases = [s for g in [g for g in groups.values() if len(g) > 1][:n_groups] for s in g]
    cpu: dict[str, list[float]] = defaultdict(list)
    digests = {}
    for s in gemms + phases:
        c = time.process_time()
        digests[s.spec_id] = hashlib.sha256(worker.compile_kernel(s).code).hexdigest()
        cpu[s.kind].append(time.process_time() - c)
    return {"which": which, "init_cpu": round(init_cpu, 3),
            "by_kind": {k: {"n": len(v), "mean": round(sum(v) / len(v), 4)} for k, v in cpu.items()},
            "digest": hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-rev", required=True)
    ap.add_argument("--manifest", default="manifests/dsv4-pro-wo_b.toml")
    ap.add_argument("--gemms", type=int, default=4)
    ap.add_argument("--groups", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.one[0], a.one[1], a.manifest, a.gemms, a.groups)))
        return
    with tempfile.TemporaryDirectory() as old_dir:
        src = subprocess.run(["git", "show", f"{a.old_rev}:gemmar_aot/compiler/worker.py"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        Path(old_dir, "old_worker.py").write_text(src)
        runs = []
        for _ in range(a.rounds):
            for which in ("old", "new"):
                load = Path("/proc/loadavg").read_text().split()[:3]
                p = subprocess.run([sys.executable, __file__, "--old-rev", a.old_rev, "--manifest", a.manifest,
                                    "--gemms", str(a.gemms), "--groups", str(a.groups), "--one", which, old_dir],
                                   capture_output=True, text=True, cwd=ROOT)
                if p.returncode:
                    sys.exit(p.stderr[-3000:])
                r = json.loads(p.stdout.strip().splitlines()[-1])
                r["loadavg"] = load
                runs.append(r)
                print(json.dumps(r), flush=True)
    digests = {r["digest"] for r in runs}
    summary = {}
    for which in ("old", "new"):
        rs = [r for r in runs if r["which"] == which]
        summary[which] = {k: round(sum(r["by_kind"][k]["mean"] for r in rs) / len(rs), 4) for k in rs[0]["by_kind"]}
    print("same bytes:", len(digests) == 1, json.dumps(summary))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"runs": runs, "mean": summary, "same_bytes": len(digests) == 1},
                                               indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
