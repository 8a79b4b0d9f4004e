"""Kernel recipes: how each mode of mori's gemm_ar maps to builder calls and launches.

Build-time only (installed as ``gemmar_aot_kernels``; the runtime never imports it).

Each recipe module has two halves:

* a pure half, used by the plan: ``specs(workload, layout) -> RankKernels``, which
  turns one validated tuple into the per-rank kernel specs in launch order. No
  FlyDSL, torch or mori import happens here, so ``gemmar-aot plan`` is instant.
* a build half, used by compile workers: ``build(spec) -> (jit_fn, args)``, which
  calls mori's own builder with exactly the spec's parameters and returns the
  untraced FlyDSL launcher plus placeholder arguments to trace it with. Imports of
  mori and FlyDSL happen inside it.
* ``build_group(spec) -> str | None``: specs with the same group are built from one
  builder call, so the compile driver sends them to one worker together.
"""

from __future__ import annotations

from importlib import import_module

#: recipe name (KernelSpec.recipe) -> module
RECIPES = {
    "fused-sdma": "gemmar_aot_kernels.fused_sdma",
    "split-lsa": "gemmar_aot_kernels.split_lsa",
    "gemm-only": "gemmar_aot_kernels.gemm_only",
}

#: Bump when any recipe changes what it builds for a given spec. Part of every key.
RECIPE_VERSION = 1


def recipe_module(name: str):
    try:
        return import_module(RECIPES[name])
    except KeyError:
        raise KeyError(f"no kernel recipe {name!r}; known: {sorted(RECIPES)}") from None
