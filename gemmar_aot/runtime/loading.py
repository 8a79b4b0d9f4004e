"""The one way every op gets its kernels: check, verify, then load; roll back on failure.

An op states what it loads (its lock entries, which launches of each, where each sits) and what
it acquires around them (a window, tensors, plans); :meth:`LoadedOp._load` does the rest, in this
order, cheapest checks first and nothing acquired until every kernel is verified:

1. :func:`check_provenance` -- one toolchain profile, and the pod's mori the artifacts'
   (:mod:`.provenance`); for a collective op, the communicator's profile checked (not counted).
2. :func:`check_device` -- the driver (the HIP runtime's unless given) says the device is the
   arch every lock was built for.
3. :func:`verify_kernels` -- every lock entry, record, blob and code object
   (:func:`.kernel_checks.verify_entries`). A bad artifact is refused here.
4. On the device: the communicator's profile counted, then :meth:`Kernels.load` -- each code
   object loaded once (``hipModuleLoadData``) and its kernel looked up -- then the op's own
   ``acquire``. Every module loaded is in :attr:`Kernels.modules` the moment it is loaded, so a
   failure anywhere releases exactly what was acquired (the op's ``close``, through
   :meth:`LoadedOp._release_loaded`), and the first error is the one raised.

mori's hipcc-JIT kernels take steps 1 and 3 the same way (:func:`check_built`,
:func:`.kernel_checks.verify_whole_object`); the arch is the device's by construction (the variant is
chosen by it), and mori itself loads them from the file they are written to (:mod:`.hipcc_server`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from gemmar_aot.model.codeobject import KernelMetadata

from .driver import Driver, arch_base, unload_modules
from .artifact_errors import ArtifactMismatchError
from .provenance import COMMUNICATORS, MoriIdentity, check_installed_mori, one_profile
from .kernel_checks import EntryPosition, EpPosition, verify_entries


log = logging.getLogger("gemmar_aot.runtime")


class Kernels:
    """An op's code objects: verified (:func:`verify_kernels`), then loaded (:meth:`load`).

    ``kernel[digest]`` is a code object's kernel metadata, ``function[digest]`` its loaded kernel
    (after :meth:`load`)."""

    def __init__(self, images: dict[str, tuple[bytes, KernelMetadata]]):
        self.kernel = {d: kern for d, (_data, kern) in images.items()}
        self.function: dict[str, Any] = {}
        self.modules: list[Any] = []
        self._images: dict[str, tuple[bytes, KernelMetadata]] | None = images

    def load(self, driver: Driver) -> None:
        """Load every verified code object once (on the current device) and look up its kernel.
        Must be called once; the bytes are dropped once loaded."""
        images, self._images = self._images, None
        if images is None:
            raise RuntimeError("these kernels were loaded already")
        for digest, (data, kern) in images.items():
            module = driver.load_module(data)
            self.modules.append(module)
            self.function[digest] = driver.get_function(module, kern.name)

    def unload(self, driver: Driver, errors: list) -> None:
        """Unload every module loaded (newest first); errors are appended to ``errors``."""
        self.function.clear()
        unload_modules(driver, self.modules, errors)


def check_provenance(entries: Sequence[Any]) -> MoriIdentity | None:
    """Step 1 for ``entries`` (RankEntry or EpRankEntry): :func:`check_built` of their locks."""
    return check_built([(e.lock.mori, e.where) for e in entries])


def check_built(built: Sequence[tuple[Any, str]]) -> MoriIdentity | None:
    """Step 1 for what was built, as (the lock's mori, where): one toolchain profile (returned),
    and the pod's mori the artifacts'. Raises ArtifactMismatchError."""
    mori = one_profile(built)
    check_installed_mori(built)
    return mori


def check_device(entries: Sequence[Any], driver: Driver, device: Any) -> str:
    """Step 2: the device's arch, after checking it is the one every entry was compiled for."""
    dev_arch = driver.device_arch(device)
    base = arch_base(dev_arch)
    for e in entries:
        if e.lock.arch != base:
            raise ArtifactMismatchError(
                f"the artifacts at {e.at} were compiled for {e.lock.arch or '?'} but {device} is "
                f"{dev_arch}; build the manifest for this GPU's arch")
    return base


def verify_kernels(artifacts: Any, entries: Sequence[Any], *, launches: Callable[[Any], Sequence[Any]],
                   position: Callable[[Any, Any], EntryPosition | EpPosition],
                   sequences: Callable[[Sequence[Any]], None] | None = None) -> Kernels:
    """Step 3 for ``entries``: every launch entry ``le`` of ``launches(e)`` checked at ``position(e, le)``
    after ``sequences(entries)`` (:func:`.kernel_checks.verify_entries`). Acquires nothing; raises
    ArtifactMismatchError (or the store's errors) on the first problem."""
    extra = {} if sequences is None else {"sequences": sequences}
    return Kernels(verify_entries(artifacts, entries, launches=launches, position=position, **extra))


def release(handles: Sequence[Any], kernels: Kernels | None, driver: Driver, errors: list) -> None:
    """Close ``handles`` in the order given (a window before the memory under it), then unload
    ``kernels``; every error is appended to ``errors``, none raised: an op's ``close`` releases
    everything it holds before it reports the first failure."""
    for handle in handles:
        if handle is not None:
            try:
                handle.close()
            except Exception as exc:  # noqa: BLE001 - reported by the caller, after the rest is released
                errors.append(exc)
    if kernels is not None:
        kernels.unload(driver, errors)


class LoadedOp:
    """What every op holds from the loading path, and gives back: the artifacts' mori (counted on
    the communicator while held), the driver, the device and its arch, the kernels.

    An op calls :meth:`_init_loaded` first (so a failure anywhere rolls back through its
    ``close``), then :meth:`_load`; its ``close`` sets ``_closed`` and calls :meth:`_release_loaded`
    with the handles it acquired."""

    def _init_loaded(self) -> None:
        self._closed = True
        self._driver: Any = None
        self._kernels: Kernels | None = None
        self._mori: MoriIdentity | None = None
        self._counted_on: Any = None  # the communicator this op's profile is counted on
        self.device: Any = None
        self.arch: str | None = None

    def _load(self, artifacts: Any, entries: Sequence[Any], *, driver: Driver | None, device: Callable[[], Any],
              launches: Callable[[Any], Sequence[Any]], position: Callable[[Any, Any], EntryPosition | EpPosition],
              acquire: Callable[[Kernels], None], sequences: Callable[[Sequence[Any]], None] | None = None,
              comm: Any = None) -> None:
        """Steps 1-4 of the module docstring for ``entries`` (RankEntry or EpRankEntry) on the device
        ``device()`` names (asked after step 1); ``acquire(kernels)`` runs last, on the device, with the
        kernels loaded. Raises what the first failing step raises, after releasing everything acquired."""
        self._mori = check_provenance(entries)
        if comm is not None:
            COMMUNICATORS.acquire(comm, self._mori, entries[0].where, check_only=True)
        if driver is None:
            from .hip import HipDriver

            driver = HipDriver()
        self._driver = driver
        self.device = device = device()
        self.arch = check_device(entries, driver, device)
        kernels = verify_kernels(artifacts, entries, launches=launches, position=position, sequences=sequences)
        from .memory import device_context

        with device_context(device):
            try:
                if comm is not None:
                    COMMUNICATORS.acquire(comm, self._mori, entries[0].where)
                    self._counted_on = comm
                self._kernels = kernels
                kernels.load(driver)
                self._closed = False  # from here on, close() has something to release
                acquire(kernels)
            except BaseException:
                self._rollback()
                raise

    def _rollback(self) -> None:
        """Release whatever construction acquired; never masks the error being raised."""
        self._closed = False
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the original error is the one to report
            log.exception("gemmar-aot: releasing a half-constructed %s failed", type(self).__name__)

    def close(self) -> None:  # pragma: no cover - every op defines its own
        raise NotImplementedError

    def _release_loaded(self, handles: Sequence[Any], errors: list) -> None:
        """The communicator's count given back, ``handles`` closed in order, the modules unloaded;
        every error appended to ``errors``."""
        comm, self._counted_on = self._counted_on, None
        if comm is not None:
            COMMUNICATORS.release(comm, self._mori)
        release(handles, self._kernels, self._driver, errors)
