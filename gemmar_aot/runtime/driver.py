"""The driver interface: the handful of HIP operations the runtime needs.

The op talks to the GPU only through an object with these methods, so the hot
path is the same code whether the driver is the real one
(:class:`gemmar_aot.runtime.hip.HipDriver`, ctypes over ``libamdhip64.so``) or a
test double. Handles (modules, functions, streams) are opaque to the op.

Kernel arguments travel in a :class:`KernArgs`: a fixed host buffer the op packs
the explicit arguments into (once at construction for the phase kernels, whose
arguments never change; per call, in place, for the GEMM). The buffer lives as
long as the op, so a launch allocates nothing, which is what lets a CUDA/HIP
graph capture the launch sequence.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol, runtime_checkable


class KernArgs:
    """A kernel's explicit-argument buffer (``size`` bytes, the code object's kernarg size).

    ``driver_data`` is free for the driver to cache what it derives from the
    buffer (the real driver keeps its ``extra`` launch array there), so it is built
    once per buffer rather than once per launch.
    """

    __slots__ = ("buf", "size", "driver_data")

    def __init__(self, size: int):
        self.size = int(size)
        self.buf = ctypes.create_string_buffer(max(self.size, 1))
        self.driver_data: Any = None

    @property
    def address(self) -> int:
        return ctypes.addressof(self.buf)

    def tobytes(self) -> bytes:
        return self.buf.raw[: self.size]


@runtime_checkable
class Driver(Protocol):
    """What the op needs from HIP. Every method may raise; errors should name the call."""

    def device_arch(self, device: Any) -> str:
        """The device's ``gcnArchName``, e.g. ``"gfx950:sramecc+:xnack-"``."""

    def current_stream(self, device: Any) -> int:
        """The stream handle work is queued on now (torch's current stream for ``device``)."""

    def load_module(self, image: bytes) -> Any:
        """Load one code object (``hipModuleLoadData``); returns a module handle."""

    def get_function(self, module: Any, name: str) -> Any:
        """The kernel ``name`` in ``module`` (``hipModuleGetFunction``)."""

    def unload_module(self, module: Any) -> None:
        """Release a module (``hipModuleUnload``)."""

    def launch(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: KernArgs, stream: int) -> None:
        """Queue one launch (``hipModuleLaunchKernel`` with the packed argument buffer)."""

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        """Fill device memory, complete before it returns (``hipMemset`` + a device sync)."""

    def synchronize(self, stream: int) -> None:
        """Wait for everything queued on ``stream``."""


def arch_base(gcn_arch_name: str) -> str:
    """``"gfx950:sramecc+:xnack-"`` -> ``"gfx950"``."""
    return str(gcn_arch_name).split(":", 1)[0].strip()


def unload_modules(driver: Driver, modules: list, errors: list) -> None:
    """Unload every module in ``modules`` (emptying it, newest first); an error is appended to
    ``errors`` and the rest are still unloaded, so a close releases all it can."""
    while modules:
        module = modules.pop()
        try:
            driver.unload_module(module)
        except Exception as exc:  # noqa: BLE001 - collected; the caller raises the first
            errors.append(exc)
