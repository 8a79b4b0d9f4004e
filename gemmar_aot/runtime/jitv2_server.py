"""mori's JIT v2 kernels served from prebuilt code objects: EP v2's HIP backend in a pod with no compiler.

mori's JIT v2 (``libmori_jit.so``) renders, keys and compiles each plan's translation unit when
mori's EP v2 op is constructed with ``kernel_backend="hip"`` (every internode config), with
``$MORI_JIT_HIPCC`` -- resolved before it looks in its cache -- into
``$MORI_JIT_CACHE_DIR/<arch>_<nic>[_ccqe]/kernel.<plan>.<key>/kernel.hsaco``; a hit checks only
that the file is there. :meth:`JitV2Server.install` makes mori find every kernel there and nothing
else, and compile nothing:

* the pod's arch (``$MORI_JIT_ARCH``, else mori's ``$MORI_GPU_ARCHS``, else the GPU's
  ``gcnArchName``) and NIC variant (mori's own ``detect_nic_type`` and ionic CCQE probe) pick the
  lock items that serve here (``$GEMMAR_AOT_ARTIFACTS`` or installed artifact packages; trusted keys
  as for every op);
* each is verified as every whole code object is (:func:`.kernel_checks.verify_whole_object`: its
  record bound to the plan, arch, NIC and cache entry; the blob by digest; the object's own note)
  and written at the cache entry the build recorded, in a cache directory of its own for exactly
  that set of objects (``<root>/<digest of the set>``), so no file another lock left can be hit;
* ``$MORI_JIT_HIPCC`` is a hipcc of ours in that directory: ``--version`` answers the identity line
  the build keyed every entry with (the lock says which), anything else fails loudly (exit 86)
  -- nothing is compiled in the pod;
* mori's knobs are set to what was checked: ``MORI_JIT_CACHE_DIR``, ``MORI_JIT_HIPCC``,
  ``MORI_JIT_ARCH``, ``MORI_DEVICE_NIC``, ``MORI_DEVICE_IONIC_CCQE``.

Where files go: ``$GEMMAR_AOT_MORI_JIT_DIR``, else ``$XDG_CACHE_HOME/gemmar-aot/mori-jit``, else
``~/.cache/gemmar-aot/mori-jit``; when that cannot be written (a read-only HOME), the temp
directory's ``gemmar-aot-<uid>/mori-jit``, said once in the log.

A plan mori asks for that the artifacts lack reaches our hipcc: mori raises, and :func:`missing`
turns that into :class:`~.artifact_errors.ArtifactMissingError` with the ``[[ep]]`` lines that
build it (also to the miss report, for ``gemmar-aot suggest``). Runtime module: standard library only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from gemmar_aot.model.hipcc import NICS, nic_variant
from gemmar_aot.model.jitv2 import JitV2Variant
from gemmar_aot.util.atomic_write import atomic_write_bytes

from . import misses
from .artifact_errors import ArtifactMismatchError, ArtifactMissingError

log = logging.getLogger("gemmar_aot.runtime")

#: Where the seeded caches go (see the module docstring).
DIR_ENV = "GEMMAR_AOT_MORI_JIT_DIR"
#: What our hipcc prints (and exits with) when mori asks it to compile: the mark :func:`is_miss` finds.
MISS_MARK = "gemmar-aot: mori JIT v2 asked to compile"
MISS_EXIT = 86


def default_root() -> Path:
    from .hipcc_server import user_cache_dir

    return user_cache_dir(DIR_ENV, "mori-jit")


def _writable_root(root: Path, explicit: bool) -> Path:
    """``root``, made; else (a read-only HOME) the temp directory's, unless ``root`` was asked for."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    if explicit:
        raise ArtifactMismatchError(f"cannot write mori's JIT v2 cache into {root}: set ${DIR_ENV} to a writable "
                                    f"directory")
    fallback = Path(tempfile.gettempdir()) / f"gemmar-aot-{os.getuid()}" / "mori-jit"
    fallback.mkdir(parents=True, exist_ok=True)
    log.warning("gemmar-aot: %s is not writable; mori's JIT v2 cache goes to %s (set $%s to choose)", root,
                fallback, DIR_ENV)
    return fallback


def hipcc_script(identity: str) -> str:
    """Our hipcc: the identity line for ``--version``, a loud refusal for anything else."""
    if "'" in identity or "\n" in identity:
        raise ValueError(f"a hipcc identity line cannot hold quotes or newlines: {identity!r}")
    return ("#!/bin/sh\n# gemmar-aot: mori's JIT v2 kernels are served prebuilt here; nothing is compiled in this pod.\n"
            f"if [ \"$1\" = \"--version\" ]; then echo '{identity}'; exit 0; fi\n"
            f"echo \"{MISS_MARK} ($*): no prebuilt code object serves it; nothing is compiled in this pod\" >&2\n"
            f"exit {MISS_EXIT}\n")


def is_miss(exc: BaseException) -> bool:
    """Whether ``exc`` is mori's report of a compile our hipcc refused."""
    return isinstance(exc, RuntimeError) and MISS_MARK in str(exc)


class JitV2Server:
    """Seeds mori's JIT v2 cache with the verified code objects of this pod (see the module docstring).

    ``artifacts``, ``trusted_keys``, ``miss_report``: as for every op. ``driver``: the HIP driver that
    tells the GPU's arch when no variable does (default: the HIP runtime's). ``directory``: the root."""

    def __init__(self, artifacts: Any = None, *, driver: Any = None, trusted_keys: Any = None,
                 miss_report: Any = None, directory: Path | None = None):
        self._spec = (artifacts, trusted_keys)
        self._arts = None
        self._driver = driver
        self._dir = Path(directory) if directory is not None else None
        self._miss_report = miss_report
        self._lock = threading.Lock()
        self._env: dict[str, str] | None = None

    def artifacts(self):
        if self._arts is None:
            from .artifacts import load_artifacts

            self._arts = load_artifacts(self._spec[0], trusted_keys=self._spec[1])
        return self._arts

    def variant(self) -> JitV2Variant:
        """The arch and NIC variant mori's JIT v2 compiles for in this pod, found as mori finds them."""
        from mori.jit import core
        from mori.jit.config import detect_nic_type

        from .hipcc_server import pod_arch

        arch = os.environ.get("MORI_JIT_ARCH", "").split(":")[0].strip() or pod_arch(self._driver)
        return JitV2Variant(arch, nic_variant(detect_nic_type(), bool(core.is_ccqe_enabled())))

    def install(self) -> dict[str, str]:
        """Seed the cache and set mori's knobs (once per process); returns what was set."""
        with self._lock:
            if self._env is None:
                self._env = self.prepare(self.variant())
                os.environ.update(self._env)
            return dict(self._env)

    def prepare(self, v: JitV2Variant) -> dict[str, str]:
        """The verified cache of ``v``'s code objects, and mori's knobs pointing at it."""
        from .kernel_checks import verify_whole_object
        from .loading import check_built

        arts = self.artifacts()
        items = sorted(arts.jitv2_index.get(v, {}).values(), key=lambda x: x[0].cache_entry)
        # the pod's mori must be the one the locks were built with: its headers are in mori's key
        check_built(list({info.source: (info.mori, f"{info.source} ({item.source})") for item, info in items}.values()))
        identities = {item.identity for item, _info in items}
        if len(identities) > 1:
            raise ArtifactMismatchError(f"the artifacts' JIT v2 code objects for {v.describe()} were keyed with "
                                        f"different hipcc identities ({sorted(identities)}): mori's cache answers one; "
                                        f"rebuild them with one gemmar-aot")
        identity = identities.pop() if identities else ""
        objects = {item.cache_entry: verify_whole_object(arts, info, item) for item, info in items}
        root = _writable_root(self._dir or default_root(), self._dir is not None or bool(os.environ.get(DIR_ENV)))
        cache = self._seed(root, v, identity, objects)
        env_nic, ccqe = NICS[v.nic]
        log.info("gemmar-aot serves mori's JIT v2 for %s: %d prebuilt code objects in %s, no compiler",
                 v.describe(), len(objects), cache)
        return {"MORI_JIT_CACHE_DIR": str(cache), "MORI_JIT_HIPCC": str(cache / "bin" / "hipcc"),
                "MORI_JIT_ARCH": v.arch, "MORI_DEVICE_NIC": env_nic, "MORI_DEVICE_IONIC_CCQE": "1" if ccqe else "0"}

    @staticmethod
    def _seed(root: Path, v: JitV2Variant, identity: str, objects: dict[str, bytes]) -> Path:
        """``root/<digest>``: exactly ``objects`` at their cache entries, and our hipcc; made whole in
        a temporary directory and renamed into place, or found there and checked byte for byte."""
        h = hashlib.sha256(f"{v.arch}\0{v.nic}\0{identity}\0".encode())
        for entry in sorted(objects):
            h.update(f"{entry}\0{hashlib.sha256(objects[entry]).hexdigest()}\0".encode())
        cache = root / h.hexdigest()[:24]
        script = hipcc_script(identity).encode()
        if not cache.is_dir():
            tmp = Path(tempfile.mkdtemp(prefix=".seed-", dir=root))
            try:
                for entry, data in objects.items():
                    atomic_write_bytes(tmp / entry / "kernel.hsaco", data, durable=False)
                atomic_write_bytes(tmp / "bin" / "hipcc", script, durable=False)
                (tmp / "bin" / "hipcc").chmod(0o755)
                os.rename(tmp, cache)
            except OSError:
                if not cache.is_dir():
                    raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        _check_seeded(cache, objects, script)
        return cache


def _check_seeded(cache: Path, objects: dict[str, bytes], script: bytes) -> None:
    """A seeded cache holds exactly ``objects`` (and our hipcc), byte for byte: a file another process
    changed is written again, one no lock item names is refused (mori would load it unchecked)."""
    for entry, data in objects.items():
        p = cache / entry / "kernel.hsaco"
        if not p.is_file() or p.read_bytes() != data:
            atomic_write_bytes(p, data, durable=False)
    hipcc = cache / "bin" / "hipcc"
    if not hipcc.is_file() or hipcc.read_bytes() != script:
        atomic_write_bytes(hipcc, script, durable=False)
    hipcc.chmod(0o755)
    found = {f"{tag.name}/{d.name}" for tag in cache.iterdir() if tag.is_dir() and tag.name not in ("bin", "tmp")
             for d in tag.iterdir()}
    extra = sorted(found - set(objects))
    if extra:
        raise ArtifactMismatchError(f"mori's JIT v2 cache {cache} holds entries no lock item names ({extra[:5]}): "
                                    f"mori would load them unchecked; remove {cache} and start again")


#: The process's server, made at the first request (after :func:`configure` set its arguments).
_SERVER: JitV2Server | None = None
_SERVER_ARGS: dict = {}


def configure(artifacts: Any = None, *, driver: Any = None, trusted_keys: Any = None, miss_report: Any = None) -> None:
    """Set the arguments of the process's server (before its first use)."""
    global _SERVER
    _SERVER_ARGS.update(artifacts=artifacts, driver=driver, trusted_keys=trusted_keys, miss_report=miss_report)
    _SERVER = None


def server() -> JitV2Server:
    global _SERVER
    if _SERVER is None:
        _SERVER = JitV2Server(**_SERVER_ARGS)
    return _SERVER


def missing(srv: JitV2Server, exc: BaseException, what: str, snippet: str | None) -> ArtifactMissingError:
    """The error for a plan our hipcc refused (``exc``, mori's), with the manifest lines that build
    it when known (``snippet``); the miss goes to the miss report too."""
    arts = srv.artifacts()
    held = sorted({(v.arch, v.nic, len(by)) for v, by in arts.jitv2_index.items()})
    err = ArtifactMissingError(
        f"no prebuilt code object for mori's JIT v2 kernels of {what} (sources: {arts.describe_sources()}); mori "
        f"would compile it here, and nothing is compiled at run time. Held (arch, NIC, code objects): "
        f"{held or 'none'}. mori said: {str(exc).splitlines()[0]}"
        + (f". Add to the manifest and rebuild (gemmar-aot build):\n{snippet}" if snippet else ""),
        m=None, manifest_lines=snippet)
    misses.OpMisses("mori.jit.v2", srv._miss_report,
                    lambda: ({"what": what, "manifest_lines": snippet}, misses.profile_of(arts),
                             misses.lock_digests(arts)),
                    rank=None, subject="jitv2").miss(None, type(err).__name__)
    return err
