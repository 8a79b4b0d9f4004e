"""GPU tier: every runtime class beyond fused-sdma, on real MI355X devices.

Skipped unless torch sees 2 gfx950 GPUs and mori is installed (the skip reason is
test_gpu.py's). From the smoke artifacts (world 2, N 1024, K 256):

* ``GemmAllReduceOp(transport=...)`` for split-sdma, split-lsa and fused-lsa: the
  construction-time self-test passes, and relL2 against a float64 reference of
  ``sum_r dequant(A_r) @ dequant(B_r).T`` is <= 3e-3 at M 512 (the bf16 wire), and
  ``gemm_only`` gives this rank's own product;
* ``Mxfp8GemmOp`` (narrow and wide tile) and ``Mxfp8GemvOp`` (buckets 1 and 32) are
  bitwise equal to mori's own JIT-compiled ops on the same operands.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_ranks import run_cco_scenario

from test_gpu import SKIP_REASON, _operands, _quantize, _reference, _rel_l2

WORLD, N, K, M_MAX = 2, 1024, 256, 512
TIMEOUT_S = float(os.environ.get("GEMMAR_AOT_GPU_TIMEOUT", "600"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(SKIP_REASON is not None, reason=f"GPU tier skipped: {SKIP_REASON}"),
]


def _scenario_transports(comm, rank, world, artifacts):
    import torch

    from gemmar_aot.runtime import GemmAllReduceOp

    want = _reference(world, 512, K)
    for transport in ("split-sdma", "split-lsa", "fused-lsa"):
        with GemmAllReduceOp(comm, n=N, k=K, m_max=M_MAX, transport=transport, artifacts=artifacts) as op:
            for _ in range(2):  # twice: the counters and flags are monotonic, a second call must agree
                out = op(*_operands(rank, 512, K))
                torch.cuda.current_stream().synchronize()
                err = _rel_l2(out, want)
                assert err <= 3e-3, f"rank {rank} {transport}: relL2 {err:.3g} > 3e-3"
            if transport.startswith("split-"):
                mine = op.gemm_only(*_operands(rank, 512, K))
                torch.cuda.current_stream().synchronize()
                *_q, a_deq, b_deq = _quantize(rank, 512, K, "cpu")
                err = _rel_l2(mine, a_deq.double() @ b_deq.double().t())
                assert err <= 3e-3, f"rank {rank} {transport} gemm_only: relL2 {err:.3g} > 3e-3"
            comm.barrier()


def _mxfp8(m: int, k: int, dev, seed: int):
    """fp8 operands with unit ue8m0 scales (127): finite, so a bitwise comparison means something."""
    import torch
    from mori.ops.gemm_ar import preshuffle_b

    g = torch.Generator(device="cpu").manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 0.5).to(torch.float8_e4m3fn).to(dev)
    b = preshuffle_b((torch.randn(N, k, generator=g) * 0.5).to(torch.float8_e4m3fn)).to(dev)
    return a, b, torch.full((m, k // 32), 127, dtype=torch.uint8), torch.full((N // 32, k // 32), 127,
                                                                                dtype=torch.uint8)


def _scenario_standalone(comm, rank, world, artifacts):
    import torch
    from mori.ops.gemm_ar import Mxfp8GemmOp as MoriGemm
    from mori.ops.gemm_ar import Mxfp8GemvOp as MoriGemv
    from mori.ops.gemm_ar import preshuffle_a_scale

    from gemmar_aot.runtime import Mxfp8GemmOp, Mxfp8GemvOp

    dev = torch.device("cuda", rank)
    ours, theirs = Mxfp8GemmOp(n=N, k=K, artifacts=artifacts), MoriGemm(n=N, k=K)
    for m in (256, 9216):  # the narrow tile, then the wide one
        a, b, sa, sb = _mxfp8(m, K, dev, seed=m)
        a_scale = preshuffle_a_scale(sa).to(dev)
        b_scale = sb.t().contiguous().to(torch.int32).view(-1).to(dev)
        x, y = ours(a, b, a_scale, b_scale), theirs(a, b, a_scale, b_scale)
        torch.cuda.synchronize()
        assert torch.equal(x, y), f"Mxfp8GemmOp M={m}: differs from mori's in {int((x != y).sum())} elements"
    ours.close()
    ours, theirs = Mxfp8GemvOp(n=N, k=K, artifacts=artifacts), MoriGemv(n=N, k=K)
    for m in (1, 17, 32):
        x_fp8, w, xs, ws = _mxfp8(m, K, dev, seed=100 + m)
        xs, ws = xs.to(dev), ws.to(dev)
        x, y = ours(x_fp8, w, xs, ws), theirs(x_fp8, w, xs, ws)
        torch.cuda.synchronize()
        assert torch.equal(x, y), f"Mxfp8GemvOp M={m}: differs from mori's in {int((x != y).sum())} elements"
    ours.close()


SCENARIOS = {"transports": _scenario_transports, "standalone": _scenario_standalone}


def _run(scenario: str, artifacts: str, tmp_path: Path) -> None:
    from gemmar_aot.runtime import window_bytes_for

    run_cco_scenario("test_gpu_runtime_modes", scenario, (WORLD, artifacts), tmp_path, world=WORLD, timeout=TIMEOUT_S,
                     vmm=3 * window_bytes_for(WORLD, m_max=M_MAX, n=N) + (256 << 20), env={"MORI_ENABLE_SDMA": os.environ.get("MORI_ENABLE_SDMA", "1")})


def test_split_and_fused_lsa_transports_against_a_reference(gpu_artifacts, tmp_path):
    _run("transports", gpu_artifacts, tmp_path)


def test_mxfp8_gemm_and_gemv_bitwise_equal_to_mori(gpu_artifacts, tmp_path):
    _run("standalone", gpu_artifacts, tmp_path)
