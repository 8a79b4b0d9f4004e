"""GPU tier: the runtime on real MI355X (gfx950) devices with mori's communicator.

Skipped unless torch sees at least WORLD gfx950 GPUs and mori is installed. Each
test starts WORLD processes (one per GPU), builds a mori ``Communicator`` and our
``GemmAllReduceOp`` from the smoke artifacts (world 2, N 1024, K 256/512, M
256/512 in one m_max-512 window), and checks:

* the startup self-test passes (the all-reduce moves bytes);
* relL2 against a float32 torch reference of ``sum_r dequant(A_r) @ dequant(B_r).T``
  is <= 3e-3 on the bf16 wire;
* the output is bitwise equal to mori's own JIT-compiled op on the same operands;
* HIP graphs captured per M replay correctly in any order (each M has its own
  counter set, so 256 -> 512 -> 256 -> 512 replays are independent).

Artifacts: ``$GEMMAR_AOT_GPU_ARTIFACTS`` (a store or lock) if set, else the smoke
store that ``conftest.smoke_build`` compiles. Every multi-process run has a
timeout: a wedged SDMA submit lock hangs rather than fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_ranks import run_cco_scenario, skip_reason

WORLD = 2
N = 1024
M_MAX = 512
TIMEOUT_S = float(os.environ.get("GEMMAR_AOT_GPU_TIMEOUT", "600"))


SKIP_REASON = skip_reason(WORLD, ("mori", "mori.cco", "mori.ops.gemm_ar"))
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(SKIP_REASON is not None, reason=f"GPU tier skipped: {SKIP_REASON}"),
]


# ---------------------------------------------------------------------------
# data: deterministic per rank, so every rank can rebuild every rank's operands
# ---------------------------------------------------------------------------


def _quantize(rank: int, m: int, k: int, device):
    """(a_fp8 [M,K], a_scale [K/128, M], b_fp8 [N,K], b_scale [N/128, K/128], a_deq, b_deq) for ``rank``."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(1000 * rank + 7 * m + k)
    x = torch.randn(m, k, generator=g) * 0.5
    w = torch.randn(N, k, generator=g) * 0.05
    kb = k // 128
    fmax = torch.finfo(torch.float8_e4m3fn).max
    xa = x.view(m, kb, 128)
    sa = (xa.abs().amax(-1) / fmax).clamp_min(1e-12)  # [M, kb]
    qa = (xa / sa[..., None]).to(torch.float8_e4m3fn)
    wb = w.view(N // 128, 128, kb, 128)
    sb = (wb.abs().amax(dim=(1, 3)) / fmax).clamp_min(1e-12)  # [N/128, kb]
    qb = (wb / sb[:, None, :, None]).to(torch.float8_e4m3fn)
    a_deq = (qa.float() * sa[..., None]).view(m, k)
    b_deq = (qb.float() * sb[:, None, :, None]).view(N, k)
    return (qa.view(m, k).to(device), sa.t().contiguous().to(device), qb.view(N, k).to(device),
            sb.contiguous().to(device), a_deq, b_deq)


def _reference(world: int, m: int, k: int):
    import torch

    out = torch.zeros(m, N, dtype=torch.float64)
    for r in range(world):
        *_q, a_deq, b_deq = _quantize(r, m, k, "cpu")
        out += (a_deq.double() @ b_deq.double().t())
    return out


def _operands(rank: int, m: int, k: int):
    import torch
    from mori.ops.gemm_ar import preshuffle_b

    dev = torch.device("cuda", rank)
    a, a_scale, b, b_scale, _ad, _bd = _quantize(rank, m, k, dev)
    return a, preshuffle_b(b), a_scale, b_scale


def _rel_l2(got, want) -> float:
    return float((got.double().cpu() - want).norm() / want.norm())


# ---------------------------------------------------------------------------
# scenarios, run in every rank's process
# ---------------------------------------------------------------------------


def _make_op(comm, k: int, artifacts: str, **kw):
    from gemmar_aot.runtime import GemmAllReduceOp

    return GemmAllReduceOp(comm, n=N, k=k, m_max=M_MAX, artifacts=artifacts, **kw)


def _scenario_self_test(comm, rank, world, artifacts):
    with _make_op(comm, 256, artifacts) as op:  # self_test=True runs at construction
        op.self_test(256)
        op.self_test(512)


def _scenario_rel_l2(comm, rank, world, artifacts):
    import torch

    for k in (256, 512):
        with _make_op(comm, k, artifacts) as op:
            for m in (256, 512, 256):
                out = op(*_operands(rank, m, k))
                torch.cuda.current_stream().synchronize()
                err = _rel_l2(out, _reference(world, m, k))
                assert err <= 3e-3, f"rank {rank} M={m} K={k}: relL2 {err:.3g} > 3e-3"


def _scenario_bitwise_vs_mori(comm, rank, world, artifacts):
    import torch
    from mori.ops.gemm_ar import GemmAllReduceOp as MoriOp

    k = 256
    with _make_op(comm, k, artifacts) as ours, MoriOp(comm, n=N, k=k, m_max=M_MAX) as theirs:
        for m in (256, 512):
            ops = _operands(rank, m, k)
            a = ours(*ops).clone()
            torch.cuda.current_stream().synchronize()
            b = theirs(*ops).clone()
            torch.cuda.current_stream().synchronize()
            assert torch.equal(a, b), (f"rank {rank} M={m}: differs from mori's JIT op in "
                                       f"{int((a != b).sum())} elements")


def _scenario_graph_replay(comm, rank, world, artifacts):
    import torch

    k = 256
    with _make_op(comm, k, artifacts) as op:
        inputs = {m: _operands(rank, m, k) for m in (256, 512)}
        want = {}
        for m in (256, 512):  # warm each M before capture, and keep its eager result
            want[m] = op(*inputs[m]).clone()
        torch.cuda.synchronize()
        graphs = {}
        for m in (256, 512):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = op(*inputs[m])
            graphs[m] = (g, out)
        torch.cuda.synchronize()
        for m in (256, 512, 256, 512, 512, 256):
            g, out = graphs[m]
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want[m]), f"rank {rank}: graph replay at M={m} differs from eager"


def _scenario_pad_vs_mori(comm, rank, world, artifacts):
    """on_miss="pad" at M=256 from artifacts whose M=256 kernels are taken away (served at 512)
    equals mori's JIT op at M=256, eagerly and replayed from a CUDA graph."""
    import torch
    from mori.ops.gemm_ar import GemmAllReduceOp as MoriOp

    from gemmar_aot.model.lock_codec import encode_lock_doc
    from lock_docs import decode_lock_doc
    from gemmar_aot.model.lock import Lock

    k = 256
    lock_path = next(Path(artifacts, "locks").glob("*.lock.json"))
    doc = decode_lock_doc(lock_path.read_bytes())
    keep = [i for i, t in enumerate(doc["tuples"]) if t["m"] != 256]
    renum = {old: new for new, old in enumerate(keep)}
    doc["tuples"] = [doc["tuples"][i] for i in keep]
    for p in doc["parts"]:
        p["launches"] = [[renum[x[0]], x[1], x[2]] for x in p["launches"] if x[0] in renum]
    lock = Lock.from_bytes(encode_lock_doc(doc), "<lock without M=256>")
    with _make_op(comm, k, (lock, artifacts), on_miss="pad") as ours, \
            MoriOp(comm, n=N, k=k, m_max=M_MAX) as theirs:
        assert 256 not in ours.m_values and 512 in ours.m_values
        ops = _operands(rank, 256, k)
        a = ours(*ops).clone()
        torch.cuda.current_stream().synchronize()
        b = theirs(*ops).clone()
        torch.cuda.current_stream().synchronize()
        assert torch.equal(a, b), f"rank {rank}: pad at M=256 differs from mori in {int((a != b).sum())} elements"
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = ours(*ops)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, b), f"rank {rank}: pad replayed from a graph differs from mori"


SCENARIOS = {
    "pad_vs_mori": _scenario_pad_vs_mori,
    "self_test": _scenario_self_test,
    "rel_l2": _scenario_rel_l2,
    "bitwise_vs_mori": _scenario_bitwise_vs_mori,
    "graph_replay": _scenario_graph_replay,
}


def _run(scenario: str, artifacts: str, tmp_path: Path) -> None:
    from gemmar_aot.runtime import window_bytes_for

    run_cco_scenario("test_gpu", scenario, (WORLD, artifacts), tmp_path, world=WORLD, timeout=TIMEOUT_S,
                     vmm=3 * window_bytes_for(WORLD, m_max=M_MAX, n=N) + (256 << 20), env={"MORI_ENABLE_SDMA": os.environ.get("MORI_ENABLE_SDMA", "1")})


def test_self_test_passes_on_real_gpus(gpu_artifacts, tmp_path):
    _run("self_test", gpu_artifacts, tmp_path)


def test_rel_l2_against_torch_reference_bf16_wire(gpu_artifacts, tmp_path):
    _run("rel_l2", gpu_artifacts, tmp_path)


def test_bitwise_equal_to_mori_jit_op(gpu_artifacts, tmp_path):
    _run("bitwise_vs_mori", gpu_artifacts, tmp_path)


def test_graph_replay_across_m(gpu_artifacts, tmp_path):
    _run("graph_replay", gpu_artifacts, tmp_path)


def test_pad_equals_mori_at_the_missing_m(gpu_artifacts, tmp_path):
    _run("pad_vs_mori", gpu_artifacts, tmp_path)
