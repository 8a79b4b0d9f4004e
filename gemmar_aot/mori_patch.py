"""Serve mori's run-time compiled kernels from gemmar-aot artifacts in a server that changes no code.

A server such as sglang (behind ``SGLANG_OPT_FUSED_WO_B_AR=1``, and with its mori EPv2 MoE
backend) does::

    from mori.ops.gemm_ar import GemmAllReduceOp
    from mori.ops.dispatch_combine_v2 import EpDispatchCombineConfig, EpDispatchCombineOp

and sglang's and vLLM's mori EP path (``mori.ops.EpDispatchCombineOp``, EP v1), the collectives,
shmem and IO kernels reach mori's hipcc JIT (``mori.jit.core.compile_genco``), which the hook
serves from prebuilt code objects too (``gemmar_aot.runtime.hipcc_server``), and EP v2's HIP
backend (every multi-node EP v2) reaches mori's JIT v2 (``mori.jit.v2.plan_api``), whose plans
the hook serves from prebuilt code objects (``gemmar_aot.runtime.jitv2_server``).

With ``GEMMAR_AOT_PATCH_MORI=1`` in its environment and the hook installed
(``gemmar-aot mori-patch install``: one ``.pth`` line in the environment's
site-packages), those op names resolve to gemmar-aot's ops instead of mori's JIT ops
(:data:`TARGETS`): same constructors, calls and results; artifacts from
``$GEMMAR_AOT_ARTIFACTS`` or installed artifact packages; anything without artifacts raises
:class:`~gemmar_aot.runtime.ArtifactMissingError` (strict, as always: no silent JIT); and each
op logs one line naming the artifacts it bound. Every other name of those packages is mori's
own (``EpDispatchCombineConfig`` included: the EP op reads it as it is).

How: the ``.pth`` line runs at interpreter start-up and, only when the variable is
set, adds an import hook (a ``sys.meta_path`` finder) for the target packages.
mori's own package is imported as usual, then the hook sets the op's name on it. For
``mori.ops.gemm_ar`` (whose ``__init__`` is lazy) mori's module ``__getattr__`` never runs
for that name, so FlyDSL/MLIR are never imported for it; ``mori.ops.dispatch_combine_v2``'s
``__init__`` imports its op module eagerly, which needs torch and ``mori.jit`` but not FlyDSL
(its FlyDSL backend is imported only when mori's op selects it, which ours never does). A
server that imports an op from the defining submodule (``...dispatch_combine_v2.dispatch_combine_op``)
gets mori's: the hook serves the package names servers import. Without the variable the
``.pth`` line does nothing but read the environment.

Runtime module: standard library only until an op is built. Its import name is written into
every installed hook (:data:`PTH_LINE`), so it stays ``gemmar_aot.mori_patch``: a hook an older
gemmar-aot installed must keep working after an upgrade (a hook whose import fails would leave
the server on mori's JIT op, silently).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import sysconfig
from pathlib import Path

ENV_VAR = "GEMMAR_AOT_PATCH_MORI"
#: mori's GEMM + all-reduce package (kept by name: the first target, what older hooks patched).
TARGET = "mori.ops.gemm_ar"
EP_TARGET = "mori.ops.dispatch_combine_v2"
PTH_NAME = "gemmar_aot_mori_patch.pth"
#: The .pth line: cheap when the variable is unset (one environment read).
PTH_LINE = (f"import os; os.environ.get({ENV_VAR!r}, '').strip() not in ('', '0') and "
            f"__import__('gemmar_aot.mori_patch').mori_patch.install()\n")

log = logging.getLogger("gemmar_aot.mori_patch")


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "").strip() not in ("", "0")


def _patched_op():
    """gemmar-aot's GemmAllReduceOp, logging at construction which artifacts it bound."""
    from gemmar_aot.runtime import GemmAllReduceOp as _Op

    class GemmAllReduceOp(_Op):
        __doc__ = _Op.__doc__
        __module__ = TARGET  # what the server imported it as
        __qualname__ = "GemmAllReduceOp"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            sources = sorted({e.where for e in self._entries.values()})
            prof = self._mori.describe() if getattr(self, "_mori", None) is not None else "unknown toolchain"
            log.info("gemmar-aot serves %s.GemmAllReduceOp (%s=1): rank %d/%d, %s, M %s from %s [%s]",
                     TARGET, ENV_VAR, self.rank, self.world_size, self.key.describe(), list(self.m_values),
                     "; ".join(sources), prof)

    return GemmAllReduceOp


def _patched_ep_op():
    """gemmar-aot's EpDispatchCombineOp, logging at construction which artifacts it bound."""
    from gemmar_aot.runtime import EpDispatchCombineOp as _Op

    class EpDispatchCombineOp(_Op):
        __doc__ = _Op.__doc__
        __module__ = EP_TARGET
        __qualname__ = "EpDispatchCombineOp"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            prof = self._mori.describe() if getattr(self, "_mori", None) is not None else "unknown toolchain"
            log.info("gemmar-aot serves %s.EpDispatchCombineOp (%s=1): rank %d/%d, %s, %d kernels from %s [%s]",
                     EP_TARGET, ENV_VAR, self.rank, self.world_size, self._describe(self.config), len(self._launch),
                     self._entry.where, prof)

    return EpDispatchCombineOp


JIT_TARGET = "mori.jit.core"
LOADER_TARGET = "mori.ops._jit_loader"


def _patched_compile_genco():
    """gemmar-aot's ``compile_genco`` (``gemmar_aot.runtime.hipcc_server``), logging each code object it hands mori."""
    from gemmar_aot.runtime import hipcc_server as hipcc

    told: set = set()

    def compile_genco(kernel_name: str, source_dir: str = "src/ops/kernels") -> str:
        path = hipcc.compile_genco(kernel_name, source_dir)
        if (kernel_name, path) not in told:
            told.add((kernel_name, path))
            log.info("gemmar-aot serves %s.compile_genco (%s=1): %s/%s.hip -> prebuilt %s, no hipcc", JIT_TARGET,
                     ENV_VAR, source_dir, kernel_name, path)
        return path

    compile_genco.__doc__ = hipcc.compile_genco.__doc__
    return compile_genco


def _patched_ensure_compiled():
    from gemmar_aot.runtime import hipcc_server as hipcc

    return hipcc.ensure_compiled


JITV2_TARGET = "mori.jit.v2.plan_api"


def _patched_make_plan():
    """mori's ``make_plan`` whose plans, at their first construction in the process, find mori's JIT
    v2 cache seeded with the verified prebuilt code objects and mori's hipcc pointed at ours
    (``gemmar_aot.runtime.jitv2_server``): nothing is compiled; a plan the artifacts lack raises
    ``ArtifactMissingError``. Every JIT v2 user is served, not only the EP op."""
    from gemmar_aot.runtime import jitv2_server

    original = sys.modules[JITV2_TARGET].make_plan
    told: list = []

    def make_plan(kernel, enums=None):
        cls = original(kernel, enums)
        init = cls.__init__

        def __init__(self, *args, **kwargs):
            srv = jitv2_server.server()
            env = srv.install()
            if not told:
                told.append(env)
                log.info("gemmar-aot serves %s (%s=1): mori's JIT v2 cache %s, hipcc %s (compiles nothing)",
                         JITV2_TARGET, ENV_VAR, env["MORI_JIT_CACHE_DIR"], env["MORI_JIT_HIPCC"])
            try:
                init(self, *args, **kwargs)
            except RuntimeError as exc:
                if jitv2_server.is_miss(exc):
                    raise jitv2_server.missing(srv, exc, f"plan {kernel}", None) from None
                raise

        cls.__init__ = __init__
        return cls

    make_plan.__doc__ = original.__doc__
    return make_plan


#: package -> (the name served, the factory of gemmar-aot's class or function for it). mori's
#: hipcc JIT is served where every caller reaches it: ``compile_genco`` (the collectives, shmem
#: and IO modules import it from ``mori.jit.core`` at each call; ``mori.jit`` imports it from there)
#: and the ops' ``ensure_compiled`` (which would turn a missing code object into a warning).
TARGETS = {TARGET: ("GemmAllReduceOp", _patched_op), EP_TARGET: ("EpDispatchCombineOp", _patched_ep_op),
           JIT_TARGET: ("compile_genco", _patched_compile_genco),
           LOADER_TARGET: ("ensure_compiled", _patched_ensure_compiled),
           JITV2_TARGET: ("make_plan", _patched_make_plan)}


def patch_module(module) -> None:
    """Bind gemmar-aot's op into an imported target package."""
    name, factory = TARGETS[module.__name__]
    setattr(module, name, factory())
    module.__gemmar_aot_patched__ = True


class _Loader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        self.real.exec_module(module)
        patch_module(module)


class MoriPatchFinder(importlib.abc.MetaPathFinder):
    """Finds each target package with the other finders, then wraps its loader to patch it."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


def _ensure_visible() -> None:
    """The bound-artifacts line is what the operator opted in for: show it even when the
    server configures no logging (Python would drop INFO)."""
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def install() -> None:
    """Add the hook (idempotent); patch the target packages already imported now."""
    if not any(isinstance(f, MoriPatchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MoriPatchFinder())
    _ensure_visible()
    for target in TARGETS:
        mod = sys.modules.get(target)
        if mod is not None and not getattr(mod, "__gemmar_aot_patched__", False):
            patch_module(mod)


# ---------------------------------------------------------------- installing the .pth hook


def site_dir() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def write_pth(directory: Path | None = None) -> Path:
    """Write the hook's ``.pth`` into ``directory`` (default: this environment's site-packages)."""
    d = Path(directory) if directory is not None else site_dir()
    p = d / PTH_NAME
    tmp = p.with_name(f".{PTH_NAME}.tmp")
    tmp.write_text(PTH_LINE)
    tmp.replace(p)
    return p


def remove_pth(directory: Path | None = None) -> bool:
    p = (Path(directory) if directory is not None else site_dir()) / PTH_NAME
    if p.is_file():
        p.unlink()
        return True
    return False
