"""fused-lsa: Direct LSA, mori's ``--mode fused-lsa`` (the PR's benchmark; no op class).

Per call: ``compile_fused_gemm_scatter(fuse=True, transport="lsa")`` -- the
epilogue stores each destination's rows straight into that peer's recv slot
(its own rows into its own slot) and publishes them with a system fence -- then
``build_sdma_phases(..., reduce_self_from_recv=True)["fused_order"]``: drain (here
only the barrier: nothing was queued), reduce (own slice read from the recv slot),
gather. bf16 wire only, as mori builds and measures it.

``n_stripe`` stays at the builder's default (None), which resolves to 2 for
Direct LSA, the PR's measured best. ``self_test`` runs the standard split order
(scatter -> reduce -> gather) over the same window: the Direct-LSA reduce would
read a recv slot no scatter fills.
"""

from __future__ import annotations

from gemmar_aot.model.spec import KernelSpec

from . import sdma_phases
from ._common import RankKernels, build_gemm
from .fused_sdma import fused_gemm_spec

RECIPE = "fused-lsa"


def specs(w, layout, env: dict) -> tuple[RankKernels, ...]:
    cfg = sdma_phases.tuple_cfg(w, layout)
    tail = sdma_phases.tail(w.gather_dtype, w.gather_transport)
    return tuple(
        RankKernels(rank=rank,
                    launches=(fused_gemm_spec(RECIPE, w, rank, cfg, transport="lsa"),)
                    + sdma_phases.sequence(w, rank, ("drain",) + tail, cfg, env, reduce_self_from_recv=True,
                                                           recv_uncached=True),
                    self_test=sdma_phases.self_test(w, rank, cfg, env))
        for rank in range(w.world))


def build(spec: KernelSpec):
    return build_gemm(spec, placeholder_m=spec.param_dict()["cfg"]["m_pad"])


def build_group(spec: KernelSpec) -> str | None:
    return None
