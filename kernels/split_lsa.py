"""split-lsa: the unfused baseline. GEMM(fuse=False) -> LSA all-reduce.

The GEMM with ``fuse=False`` never touches the window (no counters, no puts), so
no M or window changes its bytes; its rank and queue count do (they are in its
name), so it is built per rank as mori's benchmark builds it (:mod:`.gemm_only`),
one per (N, K, quant, tile, rank), shared by every M and with split-sdma. ``c_m``
is a runtime argument; the launch record carries the grid as FlyDSL computes it.

The all-reduce is ``build_lsa_ar(cfg, rank)`` over the op's window layout, in the
place the fused path puts its GEMM output (the window's input region). It picks
1-stage or 2-stage from the payload size itself (``select_stage``). The self-test
runs that same kernel over an input of rank+1 (an LSA all-reduce has no puts that
could silently do nothing, but it does prove the window's peer mapping).
"""

from __future__ import annotations

from gemmar_aot.model.spec import KernelSpec

from . import sdma_phases
from ._common import RankKernels, make_cfg
from .gemm_only import split_gemm_spec

RECIPE = "split-lsa"
LSA_FIXED = {"force_stage": None, "gather": "interleaved"}


def specs(w, layout, env: dict) -> tuple[RankKernels, ...]:
    cfg = sdma_phases.tuple_cfg(w, layout)
    out = []
    for rank in range(w.world):
        ar = KernelSpec.make(RECIPE, "lsa_ar", rank, {"cfg": cfg, "builder": dict(LSA_FIXED)})
        out.append(RankKernels(rank=rank, launches=(split_gemm_spec(w, rank), ar), self_test=(ar,)))
    return tuple(out)


def build(spec: KernelSpec):
    from mori.ops.gemm_ar.kernels_lsa import build_lsa_ar

    p = spec.param_dict()
    run, _stage = build_lsa_ar(make_cfg(p["cfg"]), spec.rank, **p["builder"])
    return run, (0, 0)


def build_group(spec: KernelSpec) -> str | None:
    return None
