"""mori's hipcc-JIT kernels served from prebuilt code objects: a pod with no ROCm compiler.

mori compiles its EP v1 (``mori.ops.EpDispatchCombineOp``), local expert count, collective,
shmem and IO kernels with ``hipcc --genco`` at first use, through one function,
``mori.jit.core.compile_genco(name, source_dir)`` (its ``_jit_loader.ensure_compiled`` wraps it
for the ops), which checks for ``$ROCM_PATH/bin/hipcc`` before anything else. :func:`install`
(or ``gemmar-aot mori-patch install`` and ``GEMMAR_AOT_PATCH_MORI=1``) replaces both with
:func:`compile_genco` and :func:`ensure_compiled` here: same signatures, same results (the path
of a code object mori then loads with its own ``HipModule`` and ``shmem_module_init``), and
nothing compiles.

Which code object: the one mori would have compiled in this pod, found as mori finds it -- the
arch from ``$MORI_GPU_ARCHS`` (mori's own override) or else the GPU's own ``gcnArchName``
through the HIP runtime; the NIC from mori's ``detect_nic_type`` (``$MORI_DEVICE_NIC``, sysfs,
lspci, libraries); CCQE from mori's own ionic probe; the host proxy from
``$MORI_ENABLE_HOST_PROXY``. Then:

* the lock item of that variant (``$GEMMAR_AOT_ARTIFACTS`` or installed artifact packages, as
  for every op; trusted keys as for every op), the lock's mori checked against the pod's;
* its record bound to the variant (a record of another source, arch or NIC is refused);
* the code object read and verified by digest, checked to be an AMDGPU code object of the arch
  defining the kernels the record names, and written once into a content-addressed file
  (``$GEMMAR_AOT_HSACO_DIR``, else ``~/.cache/gemmar-aot/hsaco``; a file found there is taken
  only when its bytes hash to the digest).

A variant the artifacts lack raises :class:`~.artifact_errors.ArtifactMissingError` with the
``[[hipcc]]`` lines that build it (also to the miss report, for ``gemmar-aot suggest``), loudly:
mori's ``ensure_compiled`` would turn a compile failure into a warning, ours does not. Never a
silent JIT. A ``MORI_DEBUG_INFO`` or ``ENABLE_PROFILER`` build is refused the same way: neither
is built.

Runtime module: standard library only (mori's own detection functions are imported from the
pod's mori, when it asks).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from gemmar_aot.util.atomic_write import atomic_write_bytes
from gemmar_aot.model.hipcc import ARCHS, SOURCES, HipccVariant, nic_variant

from . import misses
from .artifact_errors import ArtifactMismatchError, ArtifactMissingError

log = logging.getLogger("gemmar_aot.runtime")

#: Where verified code objects are written for mori to load (one file per digest).
DIR_ENV = "GEMMAR_AOT_HSACO_DIR"


def manifest_lines(v: HipccVariant) -> str:
    """The ``[[hipcc]]`` entry that builds ``v``."""
    return (f'[[hipcc]]\nsources = ["{v.source}"]\narchs = ["{v.arch}"]\nnics = ["{v.nic}"]\n'
            + ("host_proxy = true\n" if v.host_proxy else ""))


def pod_arch(driver: Any = None) -> str:
    """The GPU arch mori compiles for in this pod: ``$MORI_GPU_ARCHS`` (mori's own override, read as
    mori reads it), else the GPU's ``gcnArchName`` through ``driver`` (default: the HIP runtime)."""
    from .driver import arch_base

    env = os.environ.get("MORI_GPU_ARCHS", "")
    for arch in ARCHS:
        if arch in env:
            return arch
    if driver is None:
        from .hip import HipDriver

        driver = HipDriver()
    return arch_base(driver.device_arch(0))


def user_cache_dir(env_var: str, leaf: str) -> Path:
    """``$env_var``, else ``$XDG_CACHE_HOME/gemmar-aot/<leaf>``, else ``~/.cache/gemmar-aot/<leaf>``:
    where a pod writes the verified code objects it hands mori."""
    env = os.environ.get(env_var, "").strip()
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "gemmar-aot" / leaf


def cache_dir() -> Path:
    return user_cache_dir(DIR_ENV, "hsaco")


class HipccServer:
    """Hands mori the verified code object of each source it asks for (see the module docstring).

    ``artifacts``, ``trusted_keys``, ``miss_report``: as for every op. ``driver``: the HIP driver
    that tells the GPU's arch when ``$MORI_GPU_ARCHS`` does not (default: the HIP runtime's)."""

    def __init__(self, artifacts: Any = None, *, driver: Any = None, trusted_keys: Any = None,
                 miss_report: Any = None, directory: Path | None = None):
        self._spec = (artifacts, trusted_keys)
        self._arts = None
        self._driver = driver
        self._dir = Path(directory) if directory is not None else None
        self._lock = threading.Lock()
        self._paths: dict[HipccVariant, str] = {}
        self._miss_report = miss_report

    # ---- what mori asks for ----

    def variant(self, name: str, source_dir: str = "src/ops/kernels") -> HipccVariant:
        """The code object mori would compile for ``name`` in this pod."""
        if SOURCES.get(name) != source_dir:
            raise ArtifactMissingError(f"mori asked for {source_dir}/{name}.hip, which is not one of the hipcc-JIT "
                                     f"sources gemmar-aot builds ({', '.join(f'{d}/{s}' for s, d in SOURCES.items())})",
                                       m=None)
        for env, what in (("MORI_DEBUG_INFO", "a debug build (-g)"), ("ENABLE_PROFILER", "the profiler build")):
            if os.environ.get(env, "").strip().lower() in ("1", "true", "yes", "on"):
                raise ArtifactMissingError(f"${env} asks mori for {what} of {name}, which is not built: unset it "
                                           f"in the pod, or let mori compile it (it needs ROCm's hipcc)", m=None)
        from mori.jit import core
        from mori.jit.config import detect_nic_type

        nic = nic_variant(detect_nic_type(), bool(core.is_ccqe_enabled()))
        return HipccVariant(name, self._arch(), nic, os.environ.get("MORI_ENABLE_HOST_PROXY") == "1")

    def _arch(self) -> str:
        return pod_arch(self._driver)

    def path(self, name: str, source_dir: str = "src/ops/kernels") -> str:
        """The verified code object mori would have compiled for ``name``, as a file path."""
        v = self.variant(name, source_dir)
        with self._lock:
            got = self._paths.get(v)
            if got is None:
                got = self._paths[v] = self._materialise(v)
        return got

    # ---- the artifacts ----

    def artifacts(self):
        if self._arts is None:
            from .artifacts import load_artifacts

            self._arts = load_artifacts(self._spec[0], trusted_keys=self._spec[1])
        return self._arts

    def _materialise(self, v: HipccVariant) -> str:
        """Steps 1 and 3 of every op's loading path (:mod:`.loading`) for this code object, then
        the file mori's loader reads."""
        from .loading import check_built
        from .kernel_checks import verify_whole_object

        arts = self.artifacts()
        found = arts.hipcc_index.get(v)
        if found is None:
            raise self._missing(v, arts)
        item, info = found
        check_built([(info.mori, f"{info.source} ({item.source})")])
        data = verify_whole_object(arts, info, item)
        return str(self._write(item.entry.blob.hash, data))

    def _write(self, digest: str, data: bytes) -> Path:
        d = self._dir or cache_dir()
        p = d / f"{digest}.hsaco"
        try:
            if p.is_file() and p.read_bytes() == data:  # ``data`` is verified: the same bytes are too
                return p
            atomic_write_bytes(p, data, durable=False)  # a cache: atomic for mori's reader, not durable
            return p
        except OSError as exc:
            raise ArtifactMismatchError(f"cannot write the verified code object {digest[:12]} for mori to load into "
                                        f"{d}: {exc.strerror or exc}; set ${DIR_ENV} to a writable directory") from None

    # ---- refusals ----

    def _missing(self, v: HipccVariant, arts) -> ArtifactMissingError:
        held = sorted({(w.source, w.arch, w.nic) for w in arts.hipcc_index})
        snippet = manifest_lines(v)
        err = ArtifactMissingError(
            f"no prebuilt code object for mori's {v.describe()} (sources: {arts.describe_sources()}); mori would "
            f"compile it here with hipcc, and nothing is compiled at run time. Held (source, arch, NIC): "
            f"{held or 'none'}. Add to the manifest and rebuild (gemmar-aot build):\n{snippet}",
            m=None, manifest_lines=snippet)
        misses.OpMisses("mori.jit.core.compile_genco", self._miss_report,
                        lambda: (v.to_json(), misses.profile_of(arts), misses.lock_digests(arts)), rank=None,
                        subject="hipcc").miss(None, type(err).__name__)
        return err


#: The process's server, made at the first request (after :func:`install` set its arguments).
_SERVER: HipccServer | None = None
_SERVER_ARGS: dict = {}


def server() -> HipccServer:
    global _SERVER
    if _SERVER is None:
        _SERVER = HipccServer(**_SERVER_ARGS)
    return _SERVER


def compile_genco(kernel_name: str, source_dir: str = "src/ops/kernels") -> str:
    """``mori.jit.core.compile_genco``, served: the path of the verified prebuilt code object."""
    return server().path(kernel_name, source_dir)


def ensure_compiled(hip_name: str) -> None:
    """``mori.ops._jit_loader.ensure_compiled``, served: fills mori's table of code object paths,
    and raises (never a warning) when the artifacts lack the code object."""
    from mori.jit import core
    from mori.ops import _jit_loader

    if hip_name in _jit_loader._compiled_hsaco or hip_name in _jit_loader._loaded_modules:
        return
    served = core.compile_genco  # ours, as install() or the mori-patch hook bound it (which logs it)
    if getattr(served, "__module__", "").split(".")[0] != "gemmar_aot":
        served = compile_genco
    _jit_loader._compiled_hsaco[hip_name] = served(hip_name)


#: mori's module -> (its function served, ours).
PATCHES = {"mori.jit.core": ("compile_genco", compile_genco), "mori.ops._jit_loader": ("ensure_compiled", ensure_compiled)}


def patch_module(module) -> None:
    """Bind the served function into one of mori's modules (``PATCHES``)."""
    name, fn = PATCHES[module.__name__]
    setattr(module, name, fn)


def install(artifacts: Any = None, *, driver: Any = None, trusted_keys: Any = None, miss_report: Any = None) -> None:
    """Serve mori's hipcc-JIT kernels from the artifacts in this process: patch ``compile_genco``
    (imported into ``mori.jit`` too) and ``ensure_compiled``, importing mori's modules now."""
    import importlib
    import sys

    global _SERVER
    _SERVER_ARGS.update(artifacts=artifacts, driver=driver, trusted_keys=trusted_keys, miss_report=miss_report)
    _SERVER = None
    for mod_name in PATCHES:
        patch_module(importlib.import_module(mod_name))
    jit = sys.modules.get("mori.jit")
    if jit is not None and hasattr(jit, "compile_genco"):
        jit.compile_genco = compile_genco
