"""GPU tier for mori's JIT v2: an internode EP v2 round trip (HIP backend) on two nodes of 8 GPUs, every
kernel served from prebuilt code objects, nothing compiled.

Two nodes of 8 MI355X (or MI300X) GPUs run the same command, each its half of one world of 16
(``gpu_per_node = 8``: mori's internode path, which only its HIP backend has)::

    GEMMAR_AOT_GPU_NODES=2 GEMMAR_AOT_GPU_NODE_RANK=<0|1> GEMMAR_AOT_GPU_UID_FILE=<a file both see> \\
        .venv/bin/python -m pytest -m gpu tests/test_gpu_jitv2.py

Node 0 writes the cco communicator's unique id to the shared file, node 1 reads it. Each rank makes
our ``EpDispatchCombineOp`` with ``kernel_backend="hip"``: mori's own HIP op, its JIT v2 cache seeded
with the lock's verified code objects and its hipcc ours (``gemmar_aot.runtime.ep_hip``); then a
dispatch -> identity experts -> combine round trip in bf16 at token counts on both sides of mori's
low-latency crossover: every token goes to ``TOPK`` experts on ``TOPK`` distinct ranks (both nodes),
so the combine is ``TOPK * x`` exactly, and each rank receives what the routing sends it. mori's
cache must hold no ``tmp/`` entry afterwards (a compile would have made one).

Artifacts: ``$GEMMAR_AOT_GPU_JITV2_ARTIFACTS`` (a store or lock) if set, else
``manifests/dsv4-pro-ep-hip.toml`` built into a temporary store on each node. Skipped elsewhere, with
the reason: this host has no GPU, and one node alone cannot run an internode world.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpu_ranks import rank_outcome, run_ranks, skip_reason

NODES, PER_NODE = 2, 8
WORLD, HIDDEN, TOPK, EXPERTS, MAX_TOKENS = NODES * PER_NODE, 7168, 8, 256, 4096
TOKENS = (128, 511, 512, 513, 4096)  # both families: mori switches at 512 tokens a call ("auto")
TIMEOUT_S = float(os.environ.get("GEMMAR_AOT_GPU_TIMEOUT", "1200"))
ROOT = Path(__file__).resolve().parents[1]


def _two_node_reason() -> str | None:
    reason = skip_reason(PER_NODE, ("mori", "mori.cco", "mori.ops.dispatch_combine_v2"), archs=("gfx942", "gfx950"))
    if reason:
        return reason
    if os.environ.get("GEMMAR_AOT_GPU_NODES") != str(NODES) or not os.environ.get("GEMMAR_AOT_GPU_UID_FILE"):
        return ("an internode world needs two nodes: run this tier on both with GEMMAR_AOT_GPU_NODES=2, "
                "GEMMAR_AOT_GPU_NODE_RANK=0|1 and GEMMAR_AOT_GPU_UID_FILE on storage both see")
    return None


SKIP_REASON = _two_node_reason()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(SKIP_REASON is not None, reason=f"GPU tier skipped: {SKIP_REASON}")]


@pytest.fixture(scope="module")
def jitv2_artifacts(tmp_path_factory):
    env = os.environ.get("GEMMAR_AOT_GPU_JITV2_ARTIFACTS")
    if env:
        return env
    from gemmar_aot.builder.pipeline import run_build

    out = tmp_path_factory.mktemp("jitv2-store")
    summary = run_build(ROOT / "manifests" / "dsv4-pro-ep-hip.toml", store=out, jobs=os.cpu_count() or 2,
                        progress=False)
    assert summary["failed"] == 0, summary["failures"]
    return str(out)


def _routing(rank: int, n: int, device):
    """Token t of ``rank`` goes to expert ``((rank + t + j*2) % WORLD) * epr + (t % epr)`` for j < K:
    K distinct ranks on both nodes, deterministic."""
    import torch

    epr = EXPERTS // WORLD
    t = torch.arange(n, device=device)
    j = torch.arange(TOPK, device=device)
    idx = ((((rank + t[:, None] + 2 * j[None, :]) % WORLD) * epr) + (t[:, None] % epr)).to(torch.int32)
    x = (((t[:, None] * 7 + torch.arange(HIDDEN, device=device)[None, :] + rank) % 97) - 48).to(torch.float32) / 64
    w = ((t[:, None] + j[None, :] + rank) % 16).to(torch.float32) / 64
    return x.to(torch.bfloat16), w, idx


def _expected_recv(rank: int, n: int) -> int:
    import torch

    epr = EXPERTS // WORLD
    return sum(int(((_routing(src, n, torch.device("cpu"))[2] // epr) == rank).any(dim=1).sum()) for src in range(WORLD))


def _worker(local: int, node: int, uid: bytes, store: str, out_dir: str, jit_dir: str) -> None:
    rank = node * PER_NODE + local
    with rank_outcome(out_dir, local):  # run_ranks reads this node's ranks by their local number
        os.environ["GEMMAR_AOT_MORI_JIT_DIR"] = jit_dir
        import torch

        torch.cuda.set_device(local)
        from mori.cco import Communicator, UniqueId
        from mori.ops.dispatch_combine_v2 import EpDispatchCombineConfig

        from gemmar_aot.runtime import EpDispatchCombineOp

        with Communicator.init(WORLD, rank, UniqueId.from_bytes(uid), per_rank_vmm=8 << 30) as comm:
            cfg = EpDispatchCombineConfig(rank=rank, world_size=WORLD, gpu_per_node=PER_NODE, hidden_dim=HIDDEN,
                                          max_num_inp_token_per_rank=MAX_TOKENS, num_experts_per_rank=EXPERTS // WORLD,
                                          num_experts_per_token=TOPK, data_type=torch.bfloat16, kernel_backend="hip")
            op = EpDispatchCombineOp(cfg, comm, artifacts=store)  # mori's HIP op, served
            for n in TOKENS:
                x, w, idx = _routing(rank, n, torch.device("cuda", local))
                recv, _rw, _rs, _ri, total, handle = op.dispatch(x, w, None, idx, return_routing=True)
                torch.cuda.synchronize()
                comm.barrier()
                got = int(total.item())
                assert got == _expected_recv(rank, n), f"n={n}: received {got} tokens"
                out, _ = op.combine(recv[:got].clone(), w, routing=handle)
                torch.cuda.synchronize()
                comm.barrier()
                assert torch.equal(out[:n], (x.float() * TOPK).to(torch.bfloat16)), f"n={n}: combine is not K * x"
            cache = Path(os.environ["MORI_JIT_CACHE_DIR"])
            assert not list(cache.glob("tmp/*")), "mori compiled something: its tmp directory is not empty"


def test_internode_round_trip_on_two_nodes_from_prebuilt_jitv2_kernels(jitv2_artifacts, tmp_path):
    node = int(os.environ["GEMMAR_AOT_GPU_NODE_RANK"])
    uid_file = Path(os.environ["GEMMAR_AOT_GPU_UID_FILE"])
    if node == 0:
        from mori.cco import Communicator

        uid_file.write_bytes(bytes(Communicator.get_unique_id()))
    deadline = time.monotonic() + 300
    while not uid_file.is_file():
        assert time.monotonic() < deadline, f"node 0 wrote no communicator id to {uid_file} in 300 s"
        time.sleep(1)
    run_ranks(_worker, (node, uid_file.read_bytes(), jitv2_artifacts, str(tmp_path), str(tmp_path / "mori-jit")),
              world=PER_NODE, out_dir=tmp_path, what=f"internode round trip, node {node}", timeout=TIMEOUT_S)
