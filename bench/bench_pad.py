"""What ``on_miss="pad"`` adds to a call (issue 20), on the CPU with the benchmark driver.

Usage::

    python bench/bench_pad.py [--store artifacts] [--calls 200] [--repeat 7] [--json-out FILE]

Rank 0 of the reference manifest (built for M 4096..16384), one op with ``on_miss="pad"``,
alternating per round: a call at M=4096 (a bucket: the anchor), a call at M=3072 and at
M=1024 (no kernels: served at 4096, A and its scale zero-extended into the op's buffers).
Reported: the best per-call microseconds of each over the rounds, and the padded calls'
extra cost. Here the operands are CPU tensors, so the extension is a CPU memcpy of the A rows
(3072 x 2048 bytes) and their scales; on a GPU it is four small device copies queued on the
stream, not measured here.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _results import commit, emit  # noqa: E402
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=ROOT / "artifacts")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()

    import torch
    from bench_runtime import M_MAX, WORLD, BenchDriver, K, N, python_speed_ms
    from fakes import FakeCommunicator

    from gemmar_aot.runtime import GemmAllReduceOp

    speed = python_speed_ms()
    op = GemmAllReduceOp(FakeCommunicator(0, WORLD, lazy=True), n=N, k=K, m_max=M_MAX, artifacts=a.store,
                         driver=BenchDriver(parse=False), self_test=False, on_miss="pad")

    def operands(m):
        return (torch.zeros(m, K, dtype=torch.float8_e4m3fn), torch.zeros(N, K, dtype=torch.float8_e4m3fn),
                torch.ones(K // 128, m), torch.ones(N // 128, K // 128))

    arms = {"bucket_4096": operands(4096), "padded_3072": operands(3072), "padded_1024": operands(1024)}
    best = {k: float("inf") for k in arms}
    for ops in arms.values():
        for _ in range(50):
            op(*ops)
    for _ in range(a.repeat):
        for name, ops in arms.items():
            t = time.perf_counter()
            for _ in range(a.calls):
                op(*ops)
            best[name] = min(best[name], (time.perf_counter() - t) / a.calls * 1e6)
    stats = op.stats()
    op.close()
    out = {"per_call_us": {k: round(v, 2) for k, v in best.items()},
           "pad_extra_us": {k: round(v - best["bucket_4096"], 2) for k, v in best.items() if k != "bucket_4096"},
           "padded_rows_total": stats["padded_rows"], "python_speed_ms": speed,
           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "commit": commit()}
    return emit(out, a.json_out)


if __name__ == "__main__":
    raise SystemExit(main())
