"""Parsing a manifest too large to build: how fast it is refused, against a checkout that made
every workload first (A/B, fresh processes, interleaved).

Usage::

    python bench/bench_manifest.py [OTHER_CHECKOUT ...] [--rounds 3] [--json-out FILE]

The manifest: 1,000 gemm-only tuples, each ``m = {start = 64, stop = 65536, step = 64}`` (1,024
M values), ~130 KB of TOML asking for a million distinct workloads. Each arm parses it in a
fresh interpreter that imports ``gemmar_aot`` from its checkout (this one, and each
OTHER_CHECKOUT), and reports the CPU seconds and the peak resident memory of that process.
The anchor beside it: the same process parsing ``manifests/dsv4-pro-wo_b.toml`` (the
reference manifest, 424 kernels), which every build does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import ROOT, commit, emit  # noqa: E402

WORKER = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
import gemmar_aot
from gemmar_aot.util.errors import ManifestError
if os.path.isdir(os.path.join(sys.argv[1], "gemmar_aot", "build")):
    from gemmar_aot.builder.manifest import load_manifest, parse_manifest
else:  # an OTHER_CHECKOUT from before the build side became a package (issue 21)
    from gemmar_aot.manifest import load_manifest, parse_manifest
assert gemmar_aot.__file__.startswith(sys.argv[1]), gemmar_aot.__file__
lines = []
for i in range(1000):
    lines += ["[[tuple]]", 'transport = "gemm-only"', 'quant = "mxfp8"', f"n = {1024 + 256 * (i % 40)}", f"k = {256 + 256 * (i // 40)}",
              "world = 8", "m = { start = 64, stop = 65536, step = 64 }", ""]
text = "\n".join(lines)
t = time.process_time()
load_manifest(sys.argv[2])
ref = time.process_time() - t
t = time.process_time()
try:
    parse_manifest(text, "big.toml")
    refused = False
except ManifestError as exc:
    refused = "distinct workloads" in str(exc)
big = time.process_time() - t
print(json.dumps({"reference_cpu_s": ref, "big_cpu_s": big, "refused": refused, "bytes": len(text),
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("others", nargs="*", type=Path, help="other checkouts to measure beside this one")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    arms = [ROOT, *(p.resolve() for p in a.others)]
    runs: dict[str, list[dict]] = {str(p): [] for p in arms}
    for _ in range(a.rounds):
        for p in arms:
            out = subprocess.run([sys.executable, "-c", WORKER, str(p), str(ROOT / "manifests" / "dsv4-pro-wo_b.toml")],
                                 capture_output=True, text=True, check=True, cwd="/")
            runs[str(p)].append(json.loads(out.stdout))
    res = {"commit": commit(), "rounds": a.rounds, "arms": {
        p: {"big_cpu_s_median": round(statistics.median(r["big_cpu_s"] for r in rs), 4),
            "reference_cpu_s_median": round(statistics.median(r["reference_cpu_s"] for r in rs), 4),
            "max_rss_mb_median": round(statistics.median(r["max_rss_mb"] for r in rs), 1),
            "refused": all(r["refused"] for r in rs), "manifest_bytes": rs[0]["bytes"]}
        for p, rs in runs.items()}}
    return emit(res, a.json_out)


if __name__ == "__main__":
    sys.exit(main())
