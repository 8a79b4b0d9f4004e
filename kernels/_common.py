"""Pieces shared by the recipes: the op's fixed settings and config construction."""

from __future__ import annotations

from dataclasses import dataclass

from gemmar_aot.model.spec import KernelSpec, canonical_json

#: compile_fused_gemm_scatter's keyword arguments as GemmAllReduceOp passes them
#: (op.py, _compiled), with every other keyword written out at mori 1.2.4's
#: default so the spec names all of them.
GEMM_FIXED = {
    "b_preshuffled": True,
    "waves_per_eu": 2,
    "xcd_swizzle": 0,
    "rotated": None,
    "n_stripe": None,
    "swap_ab": True,
    "store_probe": False,
    "permlane": True,
    "lane_transpose": True,
    "hoist_scales": False,
    "peer_uncached": False,
    "direct_fence": "leader",
    "emit_put": True,
    "atomic_order": "acq_rel",
}

#: build_sdma_phases' keyword arguments beyond (cfg, rank, queues), at their
#: defaults, which is how the op calls it.
PHASE_FIXED = {
    "signal": False,
    "reduce_blocks": None,
    "reduce_self_from_recv": False,
    "recv_uncached": False,
    "fuse_quantize": False,
    "fuse_reduce_push": False,
    "publish": "writethrough",
}


@dataclass(frozen=True)
class RankKernels:
    """One rank's kernels for one tuple, in launch order."""

    rank: int
    launches: tuple[KernelSpec, ...]  # what __call__ runs, in order
    self_test: tuple[KernelSpec, ...] = ()  # what self_test runs, in order


def op_cfg(*, world, m_pad, n, block_m, gather_dtype, gather_transport, shape_slots,
           shape_index, capacity_m) -> dict:
    """Arguments of the op's own ``_build_cfg`` (the one place mori builds an ArConfig)."""
    from gemmar_aot.model.rules import MAX_CHUNKS  # plan half only: the build half reads the spec

    return {
        "via": "op._build_cfg",
        "world_size": world,
        "m_pad": m_pad,
        "n": n,
        "block_m": block_m,
        "gather_dtype": gather_dtype,
        "gather_transport": gather_transport,
        "counter_capacity": MAX_CHUNKS,
        "shape_slots": shape_slots,
        "shape_index": shape_index,
        "capacity_m": capacity_m,
    }


def gemm_only_cfg(*, n, block_m) -> dict:
    """The throwaway config Mxfp8GemmOp hands the builder for a fuse=False GEMM."""
    return {"via": "ArConfig", "world_size": 2, "m": block_m, "n": n}


# ---- build half (imports mori lazily) ----

def make_cfg(cfg: dict):
    args = dict(cfg)
    via = args.pop("via")
    if via == "op._build_cfg":
        from mori.ops.gemm_ar.op import _build_cfg

        return _build_cfg(**args)
    if via == "ArConfig":
        from mori.ops.gemm_ar.layout import ArConfig

        return ArConfig(**args)
    raise ValueError(f"unknown cfg constructor {via!r}")


def gemm_placeholders(*, m: int, n: int, k: int, quant: str):
    """Flat CPU tensors with the op's dtypes and element counts, to trace the GEMM with.

    Sizes are the real ones: each flat tensor travels as a pointer and an int32
    element count that the kernel uses as a buffer bound.
    """
    import torch

    if quant == "mxfp8":
        sa = torch.empty(m * k // 128, dtype=torch.int32)
        sb = torch.empty((n // 32) * (k // 32), dtype=torch.int32)
    else:
        sa = torch.empty(m * (k // 128), dtype=torch.float32)
        sb = torch.empty((n // 128) * (k // 128), dtype=torch.float32)
    a = torch.empty(m * k, dtype=torch.int8)
    b = torch.empty(n * k, dtype=torch.int8)
    c = torch.empty(m * n, dtype=torch.bfloat16)
    return (a, b, c, sa, sb, m, n, 0, 0)


def build_gemm(spec: KernelSpec, placeholder_m: int):
    from mori.ops.gemm_ar.kernels_fused import compile_fused_gemm_scatter

    p = spec.param_dict()
    kwargs = dict(p["builder"])
    cfg = make_cfg(p["cfg"])
    launch = compile_fused_gemm_scatter(cfg, spec.rank, **kwargs)
    args = gemm_placeholders(m=placeholder_m, n=p["n"], k=kwargs["K"], quant=kwargs["quant"])
    return launch, args


def phase_build_group(spec: KernelSpec) -> str:
    """What ``build_sdma_phases`` is called with for this phase: specs that share it are
    built by one call (it traces nothing, but rewrites every phase kernel's AST)."""
    p = spec.param_dict()
    return canonical_json({"recipe": spec.recipe, "rank": spec.rank, "cfg": p["cfg"],
                           "builder": p["builder"], "env": p.get("env") or {}})


_PHASES_CACHE: dict[str, dict] = {}
_PHASES_CACHE_SIZE = 4


def build_phase(spec: KernelSpec):
    group = phase_build_group(spec)
    parts = _PHASES_CACHE.pop(group, None)
    if parts is None:
        parts = _build_phases(spec)
    _PHASES_CACHE[group] = parts  # most recent last
    while len(_PHASES_CACHE) > _PHASES_CACHE_SIZE:
        _PHASES_CACHE.pop(next(iter(_PHASES_CACHE)))
    return parts[spec.param_dict()["phase"]], (0, 0)


def _build_phases(spec: KernelSpec) -> dict:
    import os

    from mori.ops.gemm_ar.kernels_sdma import build_sdma_phases

    p = spec.param_dict()
    env = p.get("env") or {}
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        return build_sdma_phases(make_cfg(p["cfg"]), spec.rank, **p["builder"])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
