"""Kernel recipes: how each kernel family mori compiles at run time is built ahead of time.

One module per recipe: each mode of mori's GEMM + all-reduce (``fused_sdma``, ``split_sdma``,
``split_lsa``, ``fused_lsa``, ``gemm_only``, ``gemv``, and the ``sdma_phases`` they share) and EP
dispatch/combine v2's FlyDSL backend (``ep``), traced by FlyDSL for gfx950; mori's hipcc-JIT
kernels (``hipcc``: EP v1, collectives, shmem, IO) and its JIT v2 kernels (``jitv2``: EP v2's HIP
backend, multi-node included), compiled by clang for gfx950 and gfx942 in a process of their own
(no FlyDSL worker; ``gemmar_aot.compiler.keys.OWN_COMPILE``).

Build-time only (installed as ``gemmar_aot_kernels``; the runtime never imports it).

A FlyDSL recipe module has up to two halves:

* a pure half, used by the plan: ``specs(workload, layout, env) -> RankKernels``,
  which turns one validated tuple into the per-rank kernel specs in launch order.
  No FlyDSL, torch or mori import happens here, so ``gemmar-aot plan`` is instant.
  Every mode (``gemmar_aot.builder.workload.MODES``) has one.
* a build half, used by compile workers: ``build(spec) -> (jit_fn, args)``, which
  calls mori's own builder with exactly the spec's parameters and returns the
  untraced FlyDSL launcher plus placeholder arguments to trace it with, and
  ``build_group(spec) -> str | None``: specs with the same group are built from one
  builder call, so the compile driver sends them to one worker together. Every
  ``KernelSpec.recipe`` names a module with this half.

Kernels several modes share are specs of one recipe, so the plan builds them once:
the unfused GEMM (``gemm-only``: split-sdma's, split-lsa's and Mxfp8GemmOp's) and
the SDMA phases (``sdma-phases``: scatter, drain, reduce, gather and the fp8
inserts of fused-sdma, split-sdma and fused-lsa, and every mode's self-test).
"""

from __future__ import annotations

from importlib import import_module

#: Bump when any recipe changes what it builds for a given spec. Part of every key.
RECIPE_VERSION = 2


def recipe_module(name: str):
    """The module of recipe ``name`` (a mode, or ``KernelSpec.recipe``): ``gemmar_aot_kernels.<name
    with - as _>``. By name, not from a table here: this module is compile code of every kernel
    (``keys.COMPILE_CODE``), so a table of recipes here would move every key when a mode is added."""
    mod = name.replace("-", "_")
    if not mod.isidentifier() or mod.startswith("_"):
        raise KeyError(f"no kernel recipe {name!r}: a recipe is a module of gemmar_aot_kernels")
    try:
        return import_module(f"{__name__}.{mod}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{mod}":
            raise
        raise KeyError(f"no kernel recipe {name!r} (no module {__name__}.{mod})") from None
