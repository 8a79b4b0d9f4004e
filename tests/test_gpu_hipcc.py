"""GPU tier for mori's hipcc-JIT kernels: mori's own EP v1 op (``mori.ops.EpDispatchCombineOp``,
IntraNode) on 8 real MI300X or MI355X GPUs, its kernels served from prebuilt code objects.

Skipped unless torch sees 8 GPUs of one arch, gfx942 or gfx950, and mori is installed. Each
rank installs the hand-over (``gemmar_aot.runtime.hipcc_server.install``: mori's ``compile_genco`` and
``ensure_compiled`` served), initialises mori's shmem over a torch process group, builds mori's
own v1 op and runs a dispatch -> identity experts -> combine round trip in bf16:

* every token goes to ``TOPK`` experts on ``TOPK`` distinct ranks, so the combine sums ``TOPK``
  copies of it (``out == TOPK * x``: the values are multiples of 1/64 under 2, exact in bf16);
* each rank receives exactly the tokens the routing sends it (``total_recv``);
* mori compiled nothing: the code object mori loaded is the prebuilt one (its path in mori's
  ``_compiled_hsaco`` table is our content-addressed file of the lock's digest), and its JIT
  cache directory stays empty.

Artifacts: ``$GEMMAR_AOT_GPU_HIPCC_ARTIFACTS`` (a store or lock) if set, else
``manifests/dsv4-pro-hipcc.toml`` (gfx950) or ``manifests/mi300x-hipcc.toml`` (gfx942) is built
into a temporary store. Every multi-process run has a timeout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_ranks import rank_outcome, run_ranks, skip_reason

WORLD, HIDDEN, TOPK, EXPERTS, TOKENS = 8, 7168, 8, 256, 512
TIMEOUT_S = float(os.environ.get("GEMMAR_AOT_GPU_TIMEOUT", "900"))
ROOT = Path(__file__).resolve().parents[1]

SKIP_REASON = skip_reason(WORLD, ("mori", "mori.ops", "mori.shmem"), archs=("gfx942", "gfx950"))
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(SKIP_REASON is not None, reason=f"GPU tier skipped: {SKIP_REASON}")]


@pytest.fixture(scope="module")
def hipcc_artifacts(tmp_path_factory):
    env = os.environ.get("GEMMAR_AOT_GPU_HIPCC_ARTIFACTS")
    if env:
        return env
    import torch

    from gemmar_aot.builder.pipeline import run_build

    arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    manifest = "dsv4-pro-hipcc.toml" if arch == "gfx950" else "mi300x-hipcc.toml"
    out = tmp_path_factory.mktemp("hipcc-store")
    summary = run_build(ROOT / "manifests" / manifest, store=out, jobs=os.cpu_count() or 2, progress=False)
    assert summary["failed"] == 0, summary["failures"]
    return str(out)


def _worker(rank: int, store: str, port: int, out_dir: str, jit_cache: str) -> None:
    with rank_outcome(out_dir, rank):
        os.environ["MORI_JIT_CACHE_DIR"] = jit_cache
        os.environ["GEMMAR_AOT_HSACO_DIR"] = str(Path(out_dir) / "hsaco")
        import torch
        import torch.distributed as dist

        from gemmar_aot.runtime import hipcc_server as hipcc

        torch.cuda.set_device(rank)
        hipcc.install(artifacts=store)
        dist.init_process_group("cpu:gloo,cuda:nccl", rank=rank, world_size=WORLD,
                                init_method=f"tcp://127.0.0.1:{port}", device_id=torch.device("cuda", rank))
        torch._C._distributed_c10d._register_process_group("default", dist.group.WORLD)
        import mori
        from mori.ops import _jit_loader

        mori.shmem.shmem_torch_process_group_init("default")
        try:
            cfg = mori.ops.EpDispatchCombineConfig(
                data_type=torch.bfloat16, rank=rank, world_size=WORLD, hidden_dim=HIDDEN, scale_dim=0,
                scale_type_size=0, max_token_type_size=2, max_num_inp_token_per_rank=TOKENS,
                num_experts_per_rank=EXPERTS // WORLD, num_experts_per_token=TOPK, gpu_per_node=WORLD,
                kernel_type=mori.ops.EpDispatchCombineKernelType.IntraNode)
            op = mori.ops.EpDispatchCombineOp(cfg)
            dev, epr = torch.device("cuda", rank), EXPERTS // WORLD
            t, j = torch.arange(TOKENS, device=dev), torch.arange(TOPK, device=dev)
            idx = ((((rank + t[:, None] + j[None, :]) % WORLD) * epr) + (t[:, None] % epr)).to(torch.int32)
            x = ((((t[:, None] * 7 + torch.arange(HIDDEN, device=dev)[None, :] + rank) % 97) - 48).float() / 64
                 ).to(torch.bfloat16)
            w = torch.ones(TOKENS, TOPK, dtype=torch.float32, device=dev)
            recv, recv_w, _s, recv_idx, total = op.dispatch(x, w, None, idx)
            torch.cuda.synchronize()
            assert int(total.item()) == TOKENS, f"rank {rank} received {int(total.item())} tokens, sent {TOKENS} each"
            out, _ = op.combine(recv, recv_w, recv_idx)
            torch.cuda.synchronize()
            assert torch.equal(out[:TOKENS].float(), TOPK * x.float()), f"rank {rank}: combine != {TOPK} * x"
            path = Path(_jit_loader._compiled_hsaco["ep_intranode"])
            assert path.parent == Path(out_dir) / "hsaco" and path.suffix == ".hsaco", path
            assert not any(Path(jit_cache).rglob("*.hsaco")), "mori compiled a kernel"
        finally:
            mori.shmem.shmem_finalize()
            dist.destroy_process_group()


def test_moris_ep_v1_intranode_round_trip_from_prebuilt_code_objects(hipcc_artifacts, tmp_path):
    from nginx_server import free_port

    port = free_port()
    run_ranks(_worker, (hipcc_artifacts, port, str(tmp_path), str(tmp_path / "mori-jit")), world=WORLD,
              out_dir=tmp_path, what="EP v1 round trip", timeout=TIMEOUT_S)
