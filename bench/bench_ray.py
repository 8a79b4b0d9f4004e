"""Benchmark: a cold build on a local Ray cluster against the local executor, same CPUs.

Starts a real Ray cluster on loopback (tests/raycluster.py: a head and one worker node,
``--cpus-per-node`` each, stopped by PID afterwards), then times cold builds of MANIFEST
into fresh stores, alternating:

ray    ``gemmar-aot build MANIFEST --executor ray --ray-address ...`` (the driver in a
       subprocess; compiles on the two nodes; the driver writes the store)
local  ``gemmar-aot build MANIFEST -j <total CPUs of the cluster>``

Both stores must end with identical lock files (same keys, same code objects). The
overhead is the Ray build's wall time minus the local one's; the load average is
recorded around every run because wall times on a shared machine depend on it.

    .venv/bin/python bench/bench_ray.py manifests/dsv4-pro-wo_b.toml \\
        --json-out bench/results/ray-dsv4-pro-wo_b-YYYY-MM-DD-<commit>.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from raycluster import LocalRayCluster  # noqa: E402  (the tests' real local cluster)


def _build(manifest: str, store: Path, extra: list[str], env: dict) -> dict:
    cmd = [sys.executable, "-m", "gemmar_aot", "build", manifest, "--store", str(store), "--json", "-q", *extra]
    load0 = os.getloadavg()
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}")
    s = json.loads(proc.stdout)
    return {
        "command": " ".join(["gemmar-aot", "build", Path(manifest).name, *extra]),
        "bench_wall_seconds": round(wall, 2),
        "build_wall_seconds": s["wall_seconds"],
        "compile_wall_seconds": s["compile_wall_seconds"],
        "compiled": s["compiled"],
        "failed": s["failed"],
        "jobs": s["jobs"],
        "spec_seconds": s["cpu_seconds"],
        "worker_cpu_seconds": s.get("worker_cpu_seconds"),
        # user+sys of the build command and the processes it waited for: for -j N its compile
        # workers too; for Ray the driver alone (the nodes' workers are not its children)
        "process_tree_cpu_seconds": round(kids1.ru_utime - kids0.ru_utime + kids1.ru_stime - kids0.ru_stime, 2),
        "executor": s.get("executor"),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "lock": Path(s["lock_file"]).read_bytes(),  # (named per toolchain profile)
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("manifest")
    ap.add_argument("--cpus-per-node", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1, help="(ray, local) pairs to run")
    ap.add_argument("--json-out")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gemmar-bench-ray-"))
    runs: list[dict] = []
    cluster = LocalRayCluster()
    try:
        t0 = time.perf_counter()
        cluster.start_head(num_cpus=args.cpus_per_node)
        t_head = time.perf_counter() - t0
        cluster.add_node("w1", num_cpus=args.cpus_per_node)
        cluster.wait_for_nodes(2)
        t_cluster = time.perf_counter() - t0
        cpus = 2 * args.cpus_per_node
        print(f"cluster up in {t_cluster:.1f} s (head {t_head:.1f} s) at {cluster.address}", file=sys.stderr)
        for i in range(args.repeat):
            order = [("ray", ["--executor", "ray", "--ray-address", cluster.address]), ("local", ["-j", str(cpus)])]
            if i % 2:
                order.reverse()
            for name, extra in order:
                r = _build(args.manifest, tmp / f"{name}-{i}", extra, cluster.env)
                r["executor_name"] = name
                runs.append(r)
                if args.json_out:  # after every run: a long benchmark interrupted keeps what it measured
                    Path(args.json_out).with_suffix(".partial.json").write_text(json.dumps(
                        [{k: v for k, v in x.items() if k != "lock"} for x in runs], indent=2) + "\n")
                print(f"{name}: {r['bench_wall_seconds']} s (load {r['loadavg_before'][0]} -> "
                      f"{r['loadavg_after'][0]})", file=sys.stderr)
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    locks = {r.pop("lock") for r in runs}
    if len(locks) != 1:
        sys.exit("the Ray and the local builds wrote different lock files")
    ray = [r["bench_wall_seconds"] for r in runs if r["executor_name"] == "ray"]
    local = [r["bench_wall_seconds"] for r in runs if r["executor_name"] == "local"]
    result = {
        "manifest": args.manifest,
        "cpus": cpus,
        "nodes": 2,
        "cluster_start_seconds": round(t_cluster, 2),
        "head_start_seconds": round(t_head, 2),
        "runs": runs,
        "ray_wall_seconds": ray,
        "local_wall_seconds": local,
        "overhead_seconds": [round(a - b, 2) for a, b in zip(ray, local)],
        "overhead_ratio": [round(a / b, 3) for a, b in zip(ray, local)],
        "identical_lock_files": True,
        "cpu_count": os.cpu_count(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
        Path(args.json_out).with_suffix(".partial.json").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
