"""What identifies mori's cco device ABI, computed the same way at build time and in the pod.

Every gemm_ar kernel inlines cco device code (linked from ``libmori_cco_device.bc``)
and reads the ``ccoDevComm`` / window structs that mori's host library lays out
when it creates the dev comm. Both sides must come from one mori: the nightly
(1.2.5.dev20261026) adds device symbols (``cco_local_ptr``, ``cco_sdma_put_ptr_*``)
and gives the top bit of an SDMA queue's committed write pointer a new meaning, so a
kernel built against one release and run against the other's host library corrupts
queues instead of failing.

The **device-ABI digest** is a :func:`~gemmar_aot.util.filedigest.tree_digest` over the
files of the installed ``mori`` package that define that ABI:

* ``_jit-sources/src/cco/device/*``: the device wrapper compiled into the bitcode;
* ``_jit-sources/include/mori/cco/**``, ``.../core/**``, ``.../hip_compat.hpp``: every
  mori header the wrapper's compile includes (clang's include closure, measured on
  1.2.4: 17 files, all under these) -- also the structs the host library builds;
* ``cco/device/*.py``, ``cco/device/flydsl/*.py``: the FlyDSL-side bindings the
  kernels are generated from (struct offsets, symbol names).

mori's wheels ship all of them (its own JIT builds the bitcode from ``_jit-sources``),
identical across Python versions, so the pod computes the same digest from its
installed package without importing it (``mori/__init__`` loads ROCm libraries).

Standard library only: the runtime imports this module.
"""

from __future__ import annotations

from pathlib import Path

from gemmar_aot.util.filedigest import tree_digest

#: Globs relative to the directory that holds ``mori/``.
DEVICE_ABI_GLOBS = (
    "mori/_jit-sources/src/cco/device/*",
    "mori/_jit-sources/include/mori/cco/**/*",
    "mori/_jit-sources/include/mori/core/**/*",
    "mori/_jit-sources/include/mori/hip_compat.hpp",
    "mori/cco/device/*.py",
    "mori/cco/device/flydsl/*.py",
)

#: Files that must be among them, or the package is not a mori we can check.
REQUIRED = (
    "mori/_jit-sources/src/cco/device/cco_device_wrapper.cpp",
    "mori/_jit-sources/include/mori/cco/cco.hpp",
)


class DeviceAbiUnknown(Exception):
    """The directory does not hold mori's device-ABI sources (not a mori wheel install)."""


def device_abi_files(mori_parent: Path) -> list[str]:
    """Sorted ``mori/...`` paths of the device-ABI files under ``mori_parent``."""
    base = Path(mori_parent)
    files = set()
    for pattern in DEVICE_ABI_GLOBS:
        for p in base.glob(pattern):
            if p.is_file() and "__pycache__" not in p.parts:
                files.add(p.relative_to(base).as_posix())
    missing = [r for r in REQUIRED if r not in files]
    if missing:
        raise DeviceAbiUnknown(f"{base / 'mori'} has no {', '.join(missing)}")
    return sorted(files)


def device_abi_digest(mori_parent: Path) -> str:
    """The device-ABI digest of the ``mori`` package inside ``mori_parent``."""
    return tree_digest(mori_parent, device_abi_files(mori_parent))
