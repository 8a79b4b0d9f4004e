"""The serving-side runtime: every kernel mori compiles at run time, from precompiled code objects.

    from gemmar_aot.runtime import GemmAllReduceOp

    op = GemmAllReduceOp(comm, n=7168, k=2048, m_max=16384)   # artifacts from $GEMMAR_AOT_ARTIFACTS
    out = op(a_fp8, b_preshuffled, a_scale, b_scale)          # bf16 [M, N] view of the window

It loads verified code objects from a gemmar-aot store or an installed artifact wheel instead of
JIT-compiling, and refuses what it has no kernels for instead of compiling it:

* mori's FlyDSL ops on gfx950 (MI355X), as drop-ins: ``GemmAllReduceOp`` for
  ``mori.ops.gemm_ar.GemmAllReduceOp`` (same keywords, call, checks and results; ``transport=``
  also serves the PR's split-sdma, split-lsa and fused-lsa paths), ``Mxfp8GemmOp``,
  ``Mxfp8GemvOp``, and ``EpDispatchCombineOp`` for mori's EP dispatch/combine v2 on its FlyDSL
  backend (intranode);
* mori's JIT v2 kernels on gfx950 and gfx942 (MI355X, MI300X): EP v2's HIP backend, multi-node
  included; ``EpDispatchCombineOp`` with ``kernel_backend='hip'`` hands over to mori's own HIP op
  with its JIT v2 cache seeded (:mod:`.jitv2_server`);
* mori's hipcc-JIT kernels on gfx950 and gfx942: EP v1 (``mori.ops.EpDispatchCombineOp``), the
  collectives, shmem and IO; mori's ``compile_genco`` gets the prebuilt code object of the variant
  it would have compiled (:mod:`.hipcc_server`).

``gemmar_aot.mori_patch`` binds all of them into an unchanged server.

Import rule: this package imports neither FlyDSL, MLIR, mori's kernel builders
(``mori.ops``), nor gemmar-aot's build side (``gemmar_aot.compiler``,
``.toolchain``, ``.builder``, ``gemmar_aot_kernels``). torch is imported
lazily, when an op is built or called; ``mori.cco`` only for a mori communicator; mori's own
modules (``mori.jit``, its HIP-backend op) only when its hipcc-JIT or JIT v2 kernels are served to
them.
"""

from .artifact_errors import (
    ArtifactConflictError,
    ArtifactError,
    ArtifactMismatchError,
    ArtifactMissingError,
    ArtifactNotFoundError,
    ArtifactSignatureError,
    HipError,
    SelfTestError,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "ArtifactConflictError",
    "ArtifactError",
    "ArtifactMismatchError",
    "ArtifactMissingError",
    "ArtifactNotFoundError",
    "ArtifactSignatureError",
    "Artifacts",
    "Driver",
    "EpDispatchCombineConfig",
    "EpDispatchCombineOp",
    "EpDispatchRoutingHandle",
    "GemmAllReduceOp",
    "HipDriver",
    "HipError",
    "KernArgs",
    "Mxfp8GemmOp",
    "Mxfp8GemvOp",
    "SelfTestError",
    "Source",
    "TupleKey",
    "arch_base",
    "load_artifacts",
    "padded_m",
    "supports",
    "window_bytes_for",
]

#: Each name's module, imported when the name is first asked for: a pod imports the ops it
#: serves and what they use, no more (a pod of Mxfp8GemvOp never imports the collective op, one
#: that serves no EP op never the EP model). The errors are here from the start: they are what
#: a caller catches.
_LAZY = {
    "ENTRY_POINT_GROUP": ".artifacts", "ENV_VAR": ".artifacts", "Artifacts": ".artifacts", "Source": ".artifacts",
    "TupleKey": ".artifacts", "load_artifacts": ".artifacts",
    "Driver": ".driver", "KernArgs": ".driver", "arch_base": ".driver",
    "HipDriver": ".hip", "Mxfp8GemmOp": ".gemm", "Mxfp8GemvOp": ".gemm", "GemmAllReduceOp": ".op",
    "padded_m": ".support", "supports": ".support", "window_bytes_for": ".window",
    "EpDispatchCombineOp": ".ep_op", "EpDispatchCombineConfig": ".ep_config", "EpDispatchRoutingHandle": ".ep_config",
}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
