"""The GEMM with ``fuse=False``: ``Mxfp8GemmOp``'s (gemm-only), and the split modes'.

``compile_fused_gemm_scatter(fuse=False)`` emits the fused kernel minus its
epilogue tail. With ``fuse=False`` no field of the config reaches the code
(mori 1.2.4 kernels_fused.py: ``rotated`` defaults to ``fuse``, so the tile order
is linear; the counter, lock, input and recv offsets are read only under
``fuse``, lines 1128-1143 and 1647; ``c_m`` is a runtime argument). Compiled with
the throwaway config below and with the split benchmark's own per-M config
(world 2, M 256 and 512), the code objects are byte-identical, and the parity
tier holds it there (its oracle builds with the run's config).

Two builder arguments do change the bytes: the kernel's name is
``mori_fused_split_..._q{sdma_queues}..._r{rank}`` (kernels_fused.py:1138-1148),
and the name is in the code object (symbol and hash tables, metadata note). The
machine code (``.text``) and the kernel descriptor are the same for every rank
and queue count, but a code object is its bytes: every spec names both.

* gemm-only: what ``Mxfp8GemmOp`` builds (gemm.py:234-252): rank 0, the
  builder's default ``sdma_queues`` (8), mxfp8, and exactly two kernels per
  (N, K): the wide tile (BLOCK_N=256, permlane store) and, when the wide grid
  would be under 140 blocks, the narrow tile (BLOCK_N=128, no permlane). A
  tuple's M picks which one it needs.
* split-sdma, split-lsa: what mori's benchmark builds (bench_gemm_ar.py ``run()``:
  ``compile_fused_gemm_scatter(cfg, rank, ..., sdma_queues=args.sdma_queues,
  fuse=False, transport="sdma", ...)``): one GEMM per rank with the run's queue
  count. The tuple's ``sdma_queues`` is that count (1, GemmAllReduceOp's default;
  split-lsa takes none and uses 1). Both split modes at the same (N, K, quant,
  tile, queues) share each rank's GEMM.
"""

from __future__ import annotations

from gemmar_aot.model.spec import KernelSpec

from ._common import GEMM_FIXED, RankKernels, build_gemm, gemm_only_cfg

RECIPE = "gemm-only"
#: compile_fused_gemm_scatter's default, which Mxfp8GemmOp leaves alone.
MXFP8_GEMM_OP_SDMA_QUEUES = 8


def unfused_gemm_spec(*, n: int, k: int, quant: str, block_m: int, block_n: int, rank: int, sdma_queues: int,
                      narrow: bool = False) -> KernelSpec:
    """``compile_fused_gemm_scatter(cfg, rank, fuse=False, sdma_queues=...)`` with a config no byte depends on."""
    from gemmar_aot.model import rules

    builder = {"K": k, "BLOCK_M": block_m, "BLOCK_N": rules.NARROW_BLOCK_N if narrow else block_n,
               "fuse": False, "transport": "sdma", "quant": quant, "sdma_queues": sdma_queues,
               **GEMM_FIXED}
    # The narrow tile gives up the permlane store (it pairs exactly two 256-wide N tiles).
    builder["permlane"] = builder["lane_transpose"] = not narrow
    return KernelSpec.make(RECIPE, "gemm", rank, {"cfg": gemm_only_cfg(n=n, block_m=block_m), "n": n,
                                                  "builder": builder})


def split_gemm_spec(w, rank: int) -> KernelSpec:
    """The split modes' GEMM for one rank, as mori's benchmark builds it."""
    return unfused_gemm_spec(n=w.n, k=w.k, quant=w.quant, block_m=w.block_m, block_n=w.block_n, rank=rank,
                             sdma_queues=w.sdma_queues)


def specs(w, layout, env: dict) -> tuple[RankKernels, ...]:
    from gemmar_aot.model import rules

    gemm = unfused_gemm_spec(n=w.n, k=w.k, quant="mxfp8", block_m=rules.MXFP8_BLOCK_M, block_n=w.block_n,
                             rank=0, sdma_queues=MXFP8_GEMM_OP_SDMA_QUEUES,
                             narrow=rules.gemm_only_wants_narrow(w.m, w.n))
    # No collective: every rank runs the same kernel (Mxfp8GemmOp builds rank 0's). Report one rank.
    return (RankKernels(rank=0, launches=(gemm,)),)


def build(spec: KernelSpec):
    # Any M traces the same kernel (c_m is a runtime argument); trace at one band.
    return build_gemm(spec, placeholder_m=spec.param_dict()["builder"]["BLOCK_M"])


def build_group(spec: KernelSpec) -> str | None:
    return None
