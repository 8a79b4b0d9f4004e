"""The PR's mode comparison, reproduced from gemmar-aot artifacts only (needs 8 MI355X GPUs).

ROCm/mori #662 measured DeepSeek-V4-Pro's wo_b, [16384, 7168] K=2048 blockscale on 8
ranks, five ways. This runs the same five from ``manifests/dsv4-pro-wo_b-modes.toml``'s
artifacts, through our runtime only -- no mori kernel code is imported, only
``mori.cco``'s communicator -- and prints the PR's published numbers beside ours:

* fused-sdma, split-sdma, split-lsa, fused-lsa: ``GemmAllReduceOp(transport=...)``;
* gemm-only: the split modes' unfused GEMM alone (``GemmAllReduceOp.gemm_only``), which is
  what the PR's blockscale gemm-only row times;
* gemv: ``Mxfp8GemvOp`` at each M bucket of V4.1-Flash's wo_b (5120 x 2048), beside
  mori's published cold timings (weights rotated past the caches, as a decode step reads
  them).

Timing, per mode: ``--warmup`` calls, then ``--iters`` calls between two HIP events on
the current stream; the mean per call, and the maximum over ranks (the slowest rank sets
the layer's time). Every op runs its construction-time self-test; the four all-reduce
modes' outputs must agree (relL2 against split-lsa's, reported), since they compute the
same sum. B is not preshuffled (no mori import): every mode reads the same bytes, which
is all the timing and the agreement need.

    python bench/bench_modes.py --artifacts STORE_OR_LOCK [--warmup 10 --iters 50] [--json OUT]

``tests/test_gpu_modes.py`` runs it in the ``-m gpu`` tier; elsewhere it skips with its reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "manifests" / "dsv4-pro-wo_b-modes.toml"
WORLD, M, N, K = 8, 16384, 7168, 2048
GEMV_N, GEMV_K = 5120, 2048
ALL_REDUCE_MODES = ("fused-sdma", "split-sdma", "split-lsa", "fused-lsa")
#: The PR's published numbers at this shape, blockscale, 8x MI355X (us): its "Results at
#: [16384, 7168] K=2048 ... median of 31" table.
PUBLISHED_US = {"fused-sdma": 1146.2, "split-sdma": 1465.5, "split-lsa": 1469.9, "fused-lsa": 1699.6,
                "gemm-only": 388.5}
#: mori's published Mxfp8GemvOp timings at wo_b 5120 x 2048, cold, MI355X (us; gemv.py's table).
PUBLISHED_GEMV_US = {1: 3.93, 2: 3.99, 4: 4.17, 8: 4.27, 16: 4.94, 32: 6.32}
#: Relative L2 the four all-reduce modes may differ by (different summation orders, bf16 output).
AGREE_REL_L2 = 1e-2
#: Cold gemv: rotate this many bytes of weight copies (past the 256 MiB MALL).
GEMV_ROTATE_BYTES = 768 << 20


def skip_reason(world: int = WORLD) -> str | None:
    """Why this machine cannot run the benchmark (the PR's TP8), or None: the GPU tier's check
    (tests/gpu_ranks.py)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from gpu_ranks import skip_reason as gpu_skip_reason

    return gpu_skip_reason(world, ("mori", "mori.cco"))


# ---------------------------------------------------------------------------
# per rank
# ---------------------------------------------------------------------------


def _blockscale_operands(rank: int, device):
    """Random fp8 A [M, K] and B [N, K] with their fp32 block scales; deterministic per rank."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(1000 + rank)
    kb = K // 128
    a = (torch.randn(M, K, generator=g) * 0.5).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K, generator=g) * 0.5).to(torch.float8_e4m3fn)
    a_scale = torch.rand(kb, M, generator=g) * 1e-2 + 1e-3
    b_scale = torch.rand(N // 128, kb, generator=g) * 1e-2 + 1e-3
    return tuple(t.to(device) for t in (a, b, a_scale, b_scale))


def _mean_us(fn, comm, warmup: int, iters: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    comm.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def _rel_l2(got, want) -> float:
    d = (got.float() - want.float()).norm()
    return float(d / want.float().norm().clamp_min(1e-30))


def _gemv_us(rank: int, artifacts: str, warmup: int, iters: int) -> dict[int, float]:
    """Cold timing per bucket: every call reads a different weight copy."""
    import torch

    from gemmar_aot.runtime import Mxfp8GemvOp

    dev = torch.device("cuda", rank)
    kb = GEMV_K // 32
    copies = max(2, GEMV_ROTATE_BYTES // (GEMV_N * GEMV_K))
    ws = [torch.randint(0, 255, (GEMV_N, GEMV_K), dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
          for _ in range(copies)]
    w_scale = torch.full((GEMV_N // 32, kb), 127, dtype=torch.uint8, device=dev)
    out_us = {}
    with Mxfp8GemvOp(n=GEMV_N, k=GEMV_K, artifacts=artifacts) as op:
        for m in op.buckets:
            x = torch.randn(m, GEMV_K, device=dev).to(torch.float8_e4m3fn)
            x_scale = torch.full((m, kb), 127, dtype=torch.uint8, device=dev)
            out = torch.empty(m, GEMV_N, dtype=torch.bfloat16, device=dev)
            i = [0]

            def call():
                i[0] = (i[0] + 1) % copies
                op(x, ws[i[0]], x_scale, w_scale, out=out)

            for _ in range(warmup):
                call()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                call()
            end.record()
            end.synchronize()
            out_us[m] = start.elapsed_time(end) * 1000.0 / iters
    return out_us


def _rank_main(rank: int, world: int, uid: bytes, artifacts: str, out_dir: str, warmup: int, iters: int) -> None:
    os.environ.setdefault("MORI_ENABLE_SDMA", "1")
    import torch

    torch.cuda.set_device(rank)
    from mori.cco import Communicator, UniqueId

    from gemmar_aot.runtime import GemmAllReduceOp, window_bytes_for

    status = Path(out_dir) / f"rank{rank}.json"
    try:
        result: dict = {"rank": rank, "us": {}, "rel_l2_vs_split_lsa": {}, "gemv_us": {}}
        ops = _blockscale_operands(rank, torch.device("cuda", rank))
        vmm = 2 * window_bytes_for(world, m_max=M, n=N) + (256 << 20)
        outs = {}
        with Communicator.init(world, rank, UniqueId.from_bytes(uid), per_rank_vmm=vmm) as comm:
            for mode in ALL_REDUCE_MODES:  # one op (one window) at a time; self_test at construction
                with GemmAllReduceOp(comm, n=N, k=K, m_max=M, transport=mode, artifacts=artifacts) as op:
                    result["us"][mode] = _mean_us(lambda: op(*ops), comm, warmup, iters)
                    outs[mode] = op(*ops).clone()
                    if mode == "split-lsa":
                        result["us"]["gemm-only"] = _mean_us(lambda: op.gemm_only(*ops), comm, warmup, iters)
                    torch.cuda.synchronize()
                    comm.barrier()
            for mode in ALL_REDUCE_MODES:
                result["rel_l2_vs_split_lsa"][mode] = _rel_l2(outs[mode], outs["split-lsa"])
            result["gemv_us"] = _gemv_us(rank, artifacts, warmup, iters)
            torch.cuda.synchronize()
        status.write_text(json.dumps(result))
    except BaseException:
        status.write_text(json.dumps({"rank": rank, "error": traceback.format_exc()}))
        raise


# ---------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------


def run(artifacts: str, *, world: int = WORLD, warmup: int = 10, iters: int = 50, timeout_s: float = 1800,
        out_dir: Path) -> dict:
    """Run every rank; returns the maxima over ranks and the per-rank records."""
    import torch.multiprocessing as mp
    from mori.cco import Communicator

    uid = bytes(Communicator.get_unique_id())
    ctx = mp.start_processes(_rank_main, args=(world, uid, str(artifacts), str(out_dir), warmup, iters),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks still running after {timeout_s:.0f}s (a hung SDMA submit?)")
    finally:
        for p in ctx.processes:  # only the processes this run started
            if p.is_alive():
                p.terminate()
    ranks = [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world)]
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        raise RuntimeError("rank failed:\n" + errors[0])
    modes = list(ALL_REDUCE_MODES) + ["gemm-only"]
    return {
        "shape": {"m": M, "n": N, "k": K, "world": world, "quant": "blockscale"},
        "warmup": warmup, "iters": iters,
        "us": {mode: max(r["us"][mode] for r in ranks) for mode in modes},
        "rel_l2_vs_split_lsa": {mode: max(r["rel_l2_vs_split_lsa"][mode] for r in ranks)
                                for mode in ALL_REDUCE_MODES},
        "gemv_us": {int(m): max(r["gemv_us"][m] for r in ranks) for m in ranks[0]["gemv_us"]},
        "published_us": PUBLISHED_US, "published_gemv_us": PUBLISHED_GEMV_US,
        "ranks": ranks,
    }


def format_table(res: dict) -> str:
    s = res["shape"]
    lines = [f"DSV4-Pro wo_b [{s['m']}, {s['n']}] K={s['k']} {s['quant']}, {s['world']} ranks: mean of "
             f"{res['iters']} calls after {res['warmup']} warm-up, max over ranks",
             f"  {'mode':<11} {'gemmar-aot':>11} {'PR':>9} {'ratio':>7}  relL2 vs split-lsa"]
    for mode, us in res["us"].items():
        pub = PUBLISHED_US[mode]
        rel = res["rel_l2_vs_split_lsa"].get(mode)
        lines.append(f"  {mode:<11} {us:9.1f}us {pub:7.1f}us {us / pub:7.3f}  "
                     + ("" if rel is None else f"{rel:.2e}"))
    fused, split = res["us"]["fused-sdma"], res["us"]["split-sdma"]
    lines.append(f"  fused-sdma vs split-sdma: {100 * (1 - fused / split):.1f}% faster "
                 f"(PR: {100 * (1 - PUBLISHED_US['fused-sdma'] / PUBLISHED_US['split-sdma']):.1f}%)")
    lines.append(f"Mxfp8GemvOp at wo_b {GEMV_N} x {GEMV_K}, cold (weights rotated), mean of {res['iters']} calls")
    for m, us in sorted(res["gemv_us"].items()):
        pub = PUBLISHED_GEMV_US.get(m)
        lines.append(f"  M={m:<3} {us:7.2f}us" + (f"   mori published {pub:.2f}us" if pub else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", required=True, help="store or lock holding dsv4-pro-wo_b-modes' artifacts "
                                                       f"(gemmar-aot build {MANIFEST.relative_to(ROOT)})")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    why = skip_reason()
    if why:
        print(f"bench_modes: cannot run here: {why}", file=sys.stderr)
        return 2
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-modes-") as tmp:
        res = run(args.artifacts, warmup=args.warmup, iters=args.iters, timeout_s=args.timeout, out_dir=Path(tmp))
    print(format_table(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
