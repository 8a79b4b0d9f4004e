"""Startup of one rank, measured the same way for any gemmar-aot checkout (for A/B comparisons).

Usage::

    python bench/bench_startup_ab.py CHECKOUT LOCK [--repeat N]

imports ``gemmar_aot`` (and the bench's driver and the test doubles) from CHECKOUT, then
measures ``load_artifacts(LOCK)`` (the lock read and indexed) and constructing
``GemmAllReduceOp`` for rank 0 of the reference manifest up to ready, as
``bench_runtime.py`` does. Reports process-CPU and wall minima (and the wall median) and
the load average: run it for the two checkouts one after the other, on a busy machine
more than once, and compare the CPU minima. For an old checkout, give it a lock its own
``gemmar-aot build`` wrote (its lock schema), e.g. from ``git worktree add /tmp/old REV``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("lock", type=Path)
    ap.add_argument("--repeat", type=int, default=30)
    a = ap.parse_args()
    root = a.checkout.resolve()
    sys.path[:0] = [str(root), str(root / "bench"), str(root / "tests")]
    from bench_runtime import M_MAX, WORLD, BenchDriver, K, N
    from fakes import FakeCommunicator

    import gemmar_aot
    from gemmar_aot.runtime import GemmAllReduceOp, load_artifacts

    if not Path(gemmar_aot.__file__).resolve().is_relative_to(root):
        print(f"gemmar_aot was imported from {gemmar_aot.__file__}, not {root}", file=sys.stderr)
        return 2

    def construct():
        op = GemmAllReduceOp(FakeCommunicator(0, WORLD, lazy=True), n=N, k=K, m_max=M_MAX, artifacts=a.lock,
                             driver=BenchDriver(True), self_test=False)
        op.close()

    def measure(fn, n):
        cpu, wall = [], []
        for _ in range(n):
            t, c = time.perf_counter(), time.process_time()
            fn()
            cpu.append((time.process_time() - c) * 1e3)
            wall.append((time.perf_counter() - t) * 1e3)
        return {"cpu_min_ms": round(min(cpu), 2), "wall_min_ms": round(min(wall), 2),
                "wall_median_ms": round(sorted(wall)[n // 2], 2)}

    construct()  # imports, caches
    load = os.getloadavg()
    res = {"checkout": str(root), "lock_bytes": a.lock.stat().st_size,
           "lock_read_and_index": measure(lambda: load_artifacts(a.lock), 2 * a.repeat),
           "construct_to_ready": measure(construct, a.repeat)}
    res["load_average_before_after"] = [round(x, 2) for x in load + os.getloadavg()]
    print(json.dumps(res, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
