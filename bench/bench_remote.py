"""Benchmark: a fresh clone building from a warm remote cache (nginx on loopback).

1. Seed: a real nginx (Debian's, WebDAV PUT; ``tests/nginx_server.py``) on 127.0.0.1 is
   filled by ``gemmar-aot build MANIFEST --remote URL`` from ``--seed-store`` (a store
   that already holds the manifest's kernels; compiled first if it does not).
2. Fresh clone: ``git clone`` of this checkout into a temporary directory (no
   ``artifacts/``), then ``gemmar-aot build MANIFEST --json`` run from the clone with
   only ``GEMMAR_AOT_REMOTE`` pointing at nginx -- the CLI a CI job would run, in a new
   interpreter (start-up and imports included). Repeated ``--runs`` times, each from
   an empty store. Reported: wall time, compiles (must be 0), remote hits, requests and
   bytes moved (HTTP bodies, both directions).
3. Anchors side by side: the same command with the store already warm locally (no
   remote), and the cold local build time from bench/HISTORY.md section 1.

    .venv/bin/python bench/bench_remote.py manifests/dsv4-pro-wo_b.toml --seed-store /tmp/ref-store \
        --json-out bench/results/remote-dsv4-pro-wo_b-YYYY-MM-DD-<commit>.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from nginx_server import Nginx  # noqa: E402


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build(cwd: Path, manifest: str, store: Path, env: dict, *extra: str) -> tuple[float, dict]:
    """Run one build; (wall seconds, summary with ``cpu_seconds_process`` added: the
    process's user+system CPU, which a busy machine inflates far less than wall time)."""
    cmd = [sys.executable, "-m", "gemmar_aot", "build", manifest, "--store", str(store), "--json", "-q", *extra]
    c0 = _child_cpu()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"build failed ({p.returncode}): {p.stderr[-3000:]}")
    summary = json.loads(p.stdout)
    summary["cpu_seconds_process"] = round(_child_cpu() - c0, 3)
    return wall, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifest")
    ap.add_argument("--seed-store", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMMAR_AOT_REMOTE")}
    env.pop("GEMMAR_AOT_STORE", None)
    # The clone is a fresh checkout of the code, not of the machine: it uses this checkout's
    # installed toolchain (no `make setup` inside the timed part; the toolchain is not compiled).
    env.setdefault("GEMMAR_AOT_TOOLCHAIN", str(ROOT / ".toolchain"))
    work = Path(tempfile.mkdtemp(prefix="gemmar-bench-remote-"))
    load_before = os.getloadavg()
    server = Nginx(work / "nginx").start()
    try:
        _, seed = build(ROOT, args.manifest, args.seed_store, env, "--remote", server.url)
        print(f"seeded {server.url}: {seed['uploads']} uploaded, {seed['compiled']} compiled", file=sys.stderr)

        clone = work / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        renv = {**env, "GEMMAR_AOT_REMOTE": server.url}
        runs = []
        for i in range(args.runs):
            store = work / f"fresh-{i}"
            wall, s = build(clone, args.manifest, store, renv)
            r = s["remote"]
            runs.append({"wall_seconds": round(wall, 3), "build_wall_seconds": s["wall_seconds"],
                         "cpu_seconds": s["cpu_seconds_process"],
                         "compiled": s["compiled"], "remote_hits": s["remote_hits"],
                         "distinct_specs": s["distinct_specs"], "requests": r["requests"],
                         "bytes_down": r["bytes_down"], "bytes_up": r["bytes_up"], "errors": r["errors"],
                         "lock_identical_to_seed": Path(s["lock_file"]).read_bytes()
                         == Path(seed["lock_file"]).read_bytes()})
            print(f"run {i + 1}: {wall:.2f} s ({s['cpu_seconds_process']:.2f} s CPU), {s['compiled']} compiled, "
                  f"{s['remote_hits']} remote hits, "
                  f"{r['requests']} requests, {r['bytes_down']:,d} bytes down, {r['bytes_up']:,d} up",
                  file=sys.stderr)
        warm, warm_cpu = [], []
        for _ in range(args.runs):
            wall, s = build(clone, args.manifest, store, env)  # the last fresh store, now warm locally
            assert s["compiled"] == 0
            warm.append(round(wall, 3))
            warm_cpu.append(s["cpu_seconds_process"])
        print(f"local warm: {', '.join(f'{w:.2f}' for w in warm)} s", file=sys.stderr)
        result = {
            "manifest": args.manifest,
            "cpus": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "remote_fresh_clone": runs,
            "remote_fresh_clone_median_seconds": statistics.median(r["wall_seconds"] for r in runs),
            "local_warm_seconds": warm,
            "local_warm_cpu_seconds": warm_cpu,
            "seed": {"uploads": seed["uploads"], "bytes_up": seed["remote"]["bytes_up"]},
        }
        print(json.dumps(result, indent=2))
        if args.json_out:
            args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
