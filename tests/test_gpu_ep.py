"""GPU tier for EP: gemmar-aot's EpDispatchCombineOp on 8 real MI355X GPUs with mori's communicator.

Skipped unless torch sees 8 gfx950 GPUs and mori (with ``mori.ops.dispatch_combine_v2``) is
installed. Each test starts 8 processes (one per GPU), builds a mori ``Communicator`` and our op
from ``manifests/dsv4-pro-ep.toml``'s bf16 entry (EP8, hidden 7168, topk 8, 256 experts, 4096
tokens a rank), and checks a dispatch -> identity experts -> combine round trip:

* the torch reference: every token's 8 experts sit on 8 distinct ranks, so the gather combine
  sums 8 copies of it (``out == 8 * x``) and folds 8 copies of its weight vector
  (``out_weights == 8 * w``); the values are multiples of 1/64 under 2, exact in bf16 and f32;
* each rank receives exactly the tokens the routing sends it (``total_recv``, and the local
  expert counts against a histogram of the indices);
* the outputs are bitwise equal to mori's own (JIT-compiling) op on the same operands;
* the same round trip captured in a CUDA graph and replayed, for token counts in three buckets.

Artifacts: ``$GEMMAR_AOT_GPU_EP_ARTIFACTS`` (a store or lock) if set, else the manifest is built
into a temporary store. Every multi-process run has a timeout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_ranks import run_cco_scenario, skip_reason

WORLD = 8
HIDDEN, TOPK, EXPERTS, MAX_TOKENS = 7168, 8, 256, 4096
#: token counts in three buckets of MI355X's bf16 schedule (<=128, <=1024, <=4096)
TOKENS = (96, 1000, 4096)
TIMEOUT_S = float(os.environ.get("GEMMAR_AOT_GPU_TIMEOUT", "900"))
ROOT = Path(__file__).resolve().parents[1]


SKIP_REASON = skip_reason(WORLD, ("mori", "mori.cco", "mori.ops.dispatch_combine_v2"))
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(SKIP_REASON is not None, reason=f"GPU tier skipped: {SKIP_REASON}")]


@pytest.fixture(scope="module")
def ep_artifacts(tmp_path_factory):
    env = os.environ.get("GEMMAR_AOT_GPU_EP_ARTIFACTS")
    if env:
        return env
    from gemmar_aot.builder.pipeline import run_build

    out = tmp_path_factory.mktemp("ep-store")
    summary = run_build(ROOT / "manifests" / "dsv4-pro-ep.toml", store=out, jobs=os.cpu_count() or 2, progress=False)
    assert summary["failed"] == 0, summary["failures"]
    return str(out)


def _routing(rank: int, n: int, device):
    """(x [n, H] bf16, weights [n, K] f32, indices [n, K] i32): token t of ``rank`` goes to expert
    ``((rank + t + j) % WORLD) * epr + (t % epr)`` for j < K -- 8 distinct ranks, deterministic."""
    import torch

    epr = EXPERTS // WORLD
    t = torch.arange(n, device=device)
    j = torch.arange(TOPK, device=device)
    idx = ((((rank + t[:, None] + j[None, :]) % WORLD) * epr) + (t[:, None] % epr)).to(torch.int32)
    x = (((t[:, None] * 7 + torch.arange(HIDDEN, device=device)[None, :] + rank) % 97) - 48).to(torch.float32) / 64
    w = ((t[:, None] + j[None, :] + rank) % 16).to(torch.float32) / 64
    return x.to(torch.bfloat16), w, idx


def _cfg(rank: int):
    import torch
    from mori.ops.dispatch_combine_v2 import EpDispatchCombineConfig

    return EpDispatchCombineConfig(rank=rank, world_size=WORLD, hidden_dim=HIDDEN, max_num_inp_token_per_rank=MAX_TOKENS,
                                   num_experts_per_rank=EXPERTS // WORLD, num_experts_per_token=TOPK,
                                   data_type=torch.bfloat16, kernel_backend="flydsl")


def _round_trip(op, comm, rank: int, n: int):
    """dispatch -> identity experts -> combine; (out, out_weights, total_recv, local expert counts)."""
    import torch

    x, w, idx = _routing(rank, n, torch.device("cuda", rank))
    recv, _rw, _rs, _ri, total, handle = op.dispatch(x, w, None, idx, return_routing=True)
    torch.cuda.synchronize()
    comm.barrier()
    counts = op.local_expert_count().clone()
    got = int(total.item())
    out, outw = op.combine(recv[:got].clone(), w, routing=handle)
    torch.cuda.synchronize()
    comm.barrier()
    return out.clone(), outw.clone(), got, counts


def _expected_recv(rank: int, n: int):
    """(tokens this rank receives, its local experts' histogram), from every rank's routing."""
    import torch

    epr = EXPERTS // WORLD
    hist = torch.zeros(epr, dtype=torch.int64)
    total = 0
    for src in range(WORLD):
        _x, _w, idx = _routing(src, n, torch.device("cpu"))
        mine = (idx // epr) == rank
        total += int(mine.any(dim=1).sum())
        hist += torch.bincount((idx[mine] % epr).long(), minlength=epr)
    return total, hist


def _scenario_reference(comm, rank):
    import torch

    from gemmar_aot.runtime import EpDispatchCombineOp

    with EpDispatchCombineOp(_cfg(rank), comm) as op:
        for n in TOKENS:
            out, outw, got, counts = _round_trip(op, comm, rank, n)
            x, w, _idx = _routing(rank, n, out.device)
            assert torch.equal(out, (x.float() * TOPK).to(torch.bfloat16)), f"n={n}: combine is not 8 * x"
            assert torch.equal(outw, w * TOPK), f"n={n}: the weight fold is not 8 * w"
            total, hist = _expected_recv(rank, n)
            assert got == total, f"n={n}: received {got} tokens, the routing sends {total}"
            assert torch.equal(counts.cpu().long(), hist), f"n={n}: local expert counts {counts} != {hist}"


def _scenario_bitwise_vs_mori(comm, rank):
    import torch
    from mori.ops.dispatch_combine_v2 import EpDispatchCombineOp as MoriOp

    from gemmar_aot.runtime import EpDispatchCombineOp

    with EpDispatchCombineOp(_cfg(rank), comm) as ours:
        got = [_round_trip(ours, comm, rank, n) for n in TOKENS]
    with MoriOp(_cfg(rank), comm) as theirs:
        want = [_round_trip(theirs, comm, rank, n) for n in TOKENS]
    for n, g, m in zip(TOKENS, got, want):
        assert torch.equal(g[0], m[0]) and torch.equal(g[1], m[1]) and g[2] == m[2], f"n={n}: differs from mori's op"
        assert torch.equal(g[3], m[3]), f"n={n}: local expert counts differ from mori's op"


def _scenario_graph(comm, rank):
    """Each n's dispatch -> copy -> combine captured once, replayed twice, against 8 * x."""
    import torch

    from gemmar_aot.runtime import EpDispatchCombineOp

    dev = torch.device("cuda", rank)
    with EpDispatchCombineOp(_cfg(rank), comm) as op:
        for n in TOKENS:
            x, w, idx = _routing(rank, n, dev)
            _round_trip(op, comm, rank, n)  # warm: the graph captures launches, not first-use work
            stream = torch.cuda.Stream()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                recv, _rw, _rs, _ri, _total, handle = op.dispatch(x, w, None, idx, return_routing=True)
                out, outw = op.combine(recv, w, routing=handle)
            for _ in range(2):
                out.zero_()
                torch.cuda.synchronize()
                comm.barrier()
                g.replay()
                torch.cuda.synchronize()
                comm.barrier()
                assert torch.equal(out, (x.float() * TOPK).to(torch.bfloat16)), f"n={n}: replayed combine != 8 * x"
            del g


SCENARIOS = {"reference": _scenario_reference, "bitwise_vs_mori": _scenario_bitwise_vs_mori, "graph": _scenario_graph}


def _run(scenario: str, artifacts: str, tmp_path: Path) -> None:
    run_cco_scenario("test_gpu_ep", scenario, (), tmp_path, world=WORLD, timeout=TIMEOUT_S, vmm=4 << 30,
                     env={"GEMMAR_AOT_ARTIFACTS": artifacts})


def test_ep_round_trip_against_the_torch_reference(ep_artifacts, tmp_path):
    _run("reference", ep_artifacts, tmp_path)


def test_ep_round_trip_bitwise_equal_to_moris_jit_op(ep_artifacts, tmp_path):
    _run("bitwise_vs_mori", ep_artifacts, tmp_path)


def test_ep_round_trip_in_a_cuda_graph(ep_artifacts, tmp_path):
    _run("graph", ep_artifacts, tmp_path)
