"""``make gpu-report``: the GPU tier and the PR's mode comparison on an MI355X node, as one report.

Usage::

    python bench/gpu_report.py [--out gpu-report] [--artifacts STORE] [--skip-bench]

1. Runs the GPU tier (``pytest -m gpu``: self-test, relL2 against a float64 reference, bitwise
   equality with mori's JIT op, CUDA-graph replay, ``on_miss="pad"`` against mori, every mode;
   and mori's EP dispatch/combine v2 on 8 GPUs, tests/test_gpu_ep.py: the round trip against a
   torch reference, bitwise against mori's op, in a CUDA graph) and records each test's outcome
   and, for a skip, its reason.
2. Unless ``--skip-bench`` or the tier cannot run here, builds ``manifests/dsv4-pro-wo_b-modes.toml``
   (into ``--artifacts``, default ``artifacts-modes/``) and runs ``bench/bench_modes.py``: the
   PR's five modes at [16384, 7168] K=2048 on 8 ranks, its published numbers beside ours.
3. Writes ``OUT/gpu-report.json`` and ``OUT/gpu-report.md``. Exit code 1 when a test failed,
   0 otherwise (a machine without GPUs gets a report that says so, and why).

``.github/workflows/gpu.yml`` runs this on a self-hosted gfx950 runner.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES_MANIFEST = ROOT / "manifests" / "dsv4-pro-wo_b-modes.toml"


def run_tier(out: Path) -> list[dict]:
    junit = out / "junit-gpu.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", f"--junitxml={junit}", "-p",
                    "no:cacheprovider"], cwd=ROOT, check=False)
    tests = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        status, detail = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status, detail = "failed", (child.get("message") or "")[:2000]
            elif child.tag == "skipped":
                status, detail = "skipped", child.get("message") or ""
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "status": status, "detail": detail,
                      "seconds": float(case.get("time") or 0)})
    return tests


def run_bench(out: Path, artifacts: Path) -> dict | None:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_modes import skip_reason

    why = skip_reason()
    if why:
        return {"skipped": why}
    b = subprocess.run([sys.executable, "-m", "gemmar_aot", "build", str(MODES_MANIFEST), "--store", str(artifacts),
                        "-q"], cwd=ROOT, check=False)
    if b.returncode != 0:
        return {"failed": f"building {MODES_MANIFEST.name} failed (exit {b.returncode})"}
    res = out / "modes.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_modes.py"), "--artifacts", str(artifacts),
                        "--json", str(res)], cwd=ROOT, check=False)
    if r.returncode != 0 or not res.is_file():
        return {"failed": f"bench_modes.py exited {r.returncode}"}
    return json.loads(res.read_text())


def markdown(report: dict) -> str:
    lines = [f"# gemmar-aot GPU report ({report['when']}, commit {report['commit']})", "",
             f"Host: {report['host']}. GPU tier: {report['summary']}.", "", "| test | result | detail |",
             "|---|---|---|"]
    for t in report["tests"]:
        lines.append(f"| `{t['test']}` | {t['status']} | {t['detail'].splitlines()[0] if t['detail'] else ''} |")
    bench = report.get("bench")
    lines += ["", "## The PR's mode comparison ([16384, 7168] K=2048, blockscale, 8 ranks)", ""]
    if not bench or "skipped" in bench or "failed" in bench:
        lines.append(f"Not run: {(bench or {}).get('skipped') or (bench or {}).get('failed') or '--skip-bench'}.")
    else:
        published = bench.get("published_us", {})
        rel = bench.get("rel_l2_vs_split_lsa", {})
        lines += ["| mode | PR (us) | ours (us, slowest rank) | ours / PR | relL2 vs split-lsa |",
                  "|---|---:|---:|---:|---:|"]
        for mode, us in bench["us"].items():
            pub = published.get(mode)
            lines.append(f"| {mode} | {pub} | {us:.1f} | {us / pub:.3f} | "
                         + (f"{rel[mode]:.2e}" if mode in rel else "") + " |")
        lines += ["", "| Mxfp8GemvOp M | mori published (us) | ours (us) |", "|---:|---:|---:|"]
        for m, us in sorted(bench.get("gemv_us", {}).items(), key=lambda kv: int(kv[0])):
            pg = bench.get("published_gemv_us", {})  # int keys in memory, str keys read back from JSON
            lines.append(f"| {m} | {pg.get(m, pg.get(str(m), ''))} | {us:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "gpu-report")
    ap.add_argument("--artifacts", type=Path, default=ROOT / "artifacts-modes")
    ap.add_argument("--skip-bench", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    tests = run_tier(a.out)
    counts = {s: sum(1 for t in tests if t["status"] == s) for s in ("passed", "failed", "skipped")}
    ran = counts["passed"] + counts["failed"]
    bench = None if a.skip_bench or not ran else run_bench(a.out, a.artifacts)
    reasons = sorted({t["detail"] for t in tests if t["status"] == "skipped"})
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=ROOT).stdout.strip(),
        "host": os.uname().nodename, "counts": counts, "tests": tests, "bench": bench,
        "summary": (f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
                    + (f" ({'; '.join(reasons)})" if reasons and not ran else "")),
    }
    (a.out / "gpu-report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (a.out / "gpu-report.md").write_text(markdown(report))
    print(f"gpu report: {report['summary']} -> {a.out / 'gpu-report.md'}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
