"""gemm-only: ``Mxfp8GemmOp``'s GEMM, no collective (mori 1.2.4 gemm.py).

Exactly two kernels exist per (N, K): the wide tile (BLOCK_N=256, permlane store)
and, when the wide grid would be under 140 blocks, the narrow tile (BLOCK_N=128,
no permlane). Both are M-independent (``c_m`` is a runtime argument and the tail
block masks), built at rank 0 against the throwaway config the op uses. A tuple's
M picks which of the two it needs.
"""

from __future__ import annotations

from gemmar_aot import rules
from gemmar_aot.spec import KernelSpec

from ._common import GEMM_FIXED, RankKernels, build_gemm, gemm_only_cfg

RECIPE = "gemm-only"
MXFP8_BLOCK_M = rules.MXFP8_BLOCK_M
NARROW_BLOCK_N = 128


def call_sequence(w) -> tuple[str, ...]:
    return ("gemm",)


def specs(w, layout, env: dict) -> tuple[RankKernels, ...]:
    narrow = rules.gemm_only_wants_narrow(w.m, w.n)
    block_n = NARROW_BLOCK_N if narrow else w.block_n
    builder = {"K": w.k, "BLOCK_M": MXFP8_BLOCK_M, "BLOCK_N": block_n, "fuse": False,
               "transport": "sdma", "quant": "mxfp8", "sdma_queues": 8, **GEMM_FIXED}
    # Mxfp8GemmOp leaves sdma_queues at the builder default (8) and turns the
    # permlane store off for the narrow tile.
    builder["permlane"] = builder["lane_transpose"] = not narrow
    gemm = KernelSpec.make(RECIPE, "gemm", 0, {
        "cfg": gemm_only_cfg(n=w.n, block_m=MXFP8_BLOCK_M), "n": w.n, "builder": builder})
    # No collective: every rank runs the same kernel. Report one rank.
    return (RankKernels(rank=0, launches=(gemm,)),)


def build(spec: KernelSpec):
    return build_gemm(spec, placeholder_m=MXFP8_BLOCK_M)


def build_group(spec: KernelSpec) -> str | None:
    return None
