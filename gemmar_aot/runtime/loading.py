"""The one way every op gets its kernels: check, verify, then load; roll back on failure.

Cheapest checks first, and nothing acquired until every kernel is verified:

1. :func:`check_provenance` -- one toolchain profile, and the pod's mori the artifacts'
   (:mod:`.provenance`).
2. :func:`check_device` -- the device is the arch every lock was built for.
3. :func:`verify_kernels` -- every lock entry, record, blob and code object
   (:func:`.verify.verify_entries`). A bad artifact is refused here.
4. :meth:`Kernels.load` -- each code object loaded once (``hipModuleLoadData``) and its
   kernel looked up. Every module loaded is in :attr:`Kernels.modules` the moment it is
   loaded, so an op whose construction fails after any step releases exactly what was
   acquired (:meth:`Kernels.unload`, called from the op's ``close``).

The ops differ in what they do around these steps (the collective op checks its communicator
after 1, acquires it and its window before 4, and resolves a launch plan per M after 4); the
steps themselves, and what they check, are the same for every op.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from gemmar_aot.model.codeobject import KernelMetadata

from .driver import Driver, arch_base, unload_modules
from .errors import ArtifactMismatchError
from .provenance import MoriIdentity, check_installed_mori, one_profile
from .verify import EntryPosition, EpPosition, verify_entries


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
    """Step 1 for ``entries`` (RankEntry): one toolchain profile (returned), and the pod's mori the
    artifacts'. Raises ArtifactMismatchError."""
    built = [(e.lock.mori, e.where) for e in entries]
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
    after ``sequences(entries)`` (:func:`.verify.verify_entries`). Acquires nothing; raises
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
