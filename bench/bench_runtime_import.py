"""What ``import gemmar_aot.runtime`` costs a pod that has torch imported already (issue 33).

Usage::

    python bench/bench_runtime_import.py [--rounds 20] [--tree LABEL=DIR ...] [--json-out FILE]

Each round starts a fresh interpreter per tree and mode, in turn (interleaved), which imports
torch, then times ``import gemmar_aot.runtime`` (the issue's number), then ``from
gemmar_aot.runtime import GemmAllReduceOp`` on top (what a pod of the collective op pays in
all), and, in the same process right after, the speed reference: ``bench_runtime.python_speed_ms``'s
10^6-step pure-Python loop in a function (the best of 5). The number is the ratio of the two,
so it holds across hosts and load. The target: at most 1.5x the loop.

Two modes, because module bodies cost very different amounts with and without bytecode:

- ``installed``: as a pod runs a pip-installed wheel, whose modules pip byte-compiled at
  install: each tree gets its own bytecode cache (``sys.pycache_prefix``, set after torch is
  imported), filled by one untimed run first;
- ``source``: no bytecode at all (an empty cache, never written): every module of ours
  compiled from source on import -- what this host's environment does to every process
  (``PYTHONDONTWRITEBYTECODE=1`` is set here), and so what earlier rounds of this benchmark
  measured.

``--tree`` runs another checkout's package (a directory holding ``gemmar_aot`` and
``gemmar_aot_kernels``, e.g. a tree_copy of an older commit) beside this one; the default is
this checkout alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench")]
from _results import commit, emit  # noqa: E402

CHILD = r"""
import json, sys, time
import torch  # the pod has it already (its own bytecode, as installed)
# From here on, bytecode is looked up (and, installed, written) in this run's cache only.
sys.pycache_prefix, sys.dont_write_bytecode = sys.argv[1], sys.argv[2] == "source"
t = time.perf_counter(); c = time.process_time()
import gemmar_aot.runtime
imp, imp_cpu = time.perf_counter() - t, time.process_time() - c
t = time.perf_counter()
from gemmar_aot.runtime import GemmAllReduceOp  # what a pod imports to serve the collective op
op_imp = imp + time.perf_counter() - t
def loop():  # bench_runtime.python_speed_ms's reference: the loop in a function (locals, not globals)
    t = time.perf_counter(); n = 0
    for i in range(1_000_000):
        n += i
    return time.perf_counter() - t
best = min(loop() for _ in range(5))
ours = sorted(m for m in sys.modules if m.split(".")[0] == "gemmar_aot")
print(json.dumps({"import_ms": imp * 1e3, "import_cpu_ms": imp_cpu * 1e3, "op_import_ms": op_imp * 1e3,
                  "loop_ms": best * 1e3,
                  "modules": len(ours), "package": gemmar_aot.runtime.__file__}))
"""


MODES = ("installed", "source")


def one(tree: Path | None, mode: str, pycache: Path) -> dict:
    """One fresh interpreter's numbers for ``tree`` (None: this checkout) in ``mode``, its bytecode
    cache at ``pycache`` (``installed``: this tree's; ``source``: an empty one, never written)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) if tree is not None else ""
    p = subprocess.run([sys.executable, "-c", CHILD, str(pycache), mode], capture_output=True, text=True, env=env,
                       cwd=tree or ROOT)
    if p.returncode != 0:
        raise SystemExit(f"the child failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.splitlines()[-1])
    out["ratio"] = out["import_ms"] / out["loop_ms"]
    out["op_ratio"] = out["op_import_ms"] / out["loop_ms"]
    return out


def _summary(rs: list[dict]) -> dict:
    return {
        "ratio_median": round(statistics.median(r["ratio"] for r in rs), 3),
        "op_ratio_median": round(statistics.median(r["op_ratio"] for r in rs), 3),
        "op_import_ms_median": round(statistics.median(r["op_import_ms"] for r in rs), 2),
        "import_ms_median": round(statistics.median(r["import_ms"] for r in rs), 2),
        "import_cpu_ms_median": round(statistics.median(r["import_cpu_ms"] for r in rs), 2),
        "loop_ms_median": round(statistics.median(r["loop_ms"] for r in rs), 2),
        "modules": rs[-1]["modules"], "runs": rs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR")
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    trees: dict[str, Path | None] = {".": None}
    for spec in a.tree:
        label, _, d = spec.partition("=")
        trees[label] = Path(d)
    runs: dict[str, dict[str, list]] = {k: {m: [] for m in MODES} for k in trees}
    with tempfile.TemporaryDirectory(prefix="gemmar-import-bench-") as tmp:
        caches = {k: Path(tmp) / f"installed-{i}" for i, k in enumerate(trees)}
        empty = Path(tmp) / "empty"
        for label, tree in trees.items():  # pip byte-compiles a wheel as it installs it: untimed
            one(tree, "installed", caches[label])
        for _ in range(a.rounds):
            for label, tree in trees.items():
                for mode in MODES:
                    runs[label][mode].append(one(tree, mode, caches[label] if mode == "installed" else empty))
        assert not any(empty.rglob("*.pyc")), "the source mode wrote bytecode"
    result = {"rounds": a.rounds, "trees": {k: str(v) if v else str(ROOT) for k, v in trees.items()},
              "arms": {label: {mode: _summary(rs) for mode, rs in by_mode.items()} for label, by_mode in runs.items()}}
    result["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result["commit"] = commit()
    return emit(result, a.json_out)


if __name__ == "__main__":
    raise SystemExit(main())
