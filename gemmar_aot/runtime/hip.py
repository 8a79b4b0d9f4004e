"""The real driver: ctypes over ``libamdhip64.so``.

Only what the op needs: module load/unload, function lookup, one launch entry
point (``hipModuleLaunchKernel`` with the argument buffer passed through
``extra``), memset and synchronisation. The device's architecture and the
current stream come from torch when it has a GPU (it is the framework the caller
already uses and the stream the caller's work is ordered on), with a plain HIP
fallback for the architecture.

Loading this on a machine without HIP raises :class:`HipError` saying so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path
from typing import Any

from .driver import KernArgs
from .artifact_errors import HipError

#: ``extra`` markers of hipModuleLaunchKernel (hip_runtime_api.h).
HIP_LAUNCH_PARAM_BUFFER_POINTER = 0x01
HIP_LAUNCH_PARAM_BUFFER_SIZE = 0x02
HIP_LAUNCH_PARAM_END = 0x03

_LIB_NAMES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5")


def _candidates() -> list[str]:
    out: list[str] = list(_LIB_NAMES)
    for env in ("ROCM_PATH", "HIP_PATH"):
        root = os.environ.get(env)
        if root:
            out += [str(Path(root) / "lib" / n) for n in _LIB_NAMES]
    out += [str(Path("/opt/rocm/lib") / n) for n in _LIB_NAMES]
    try:  # a ROCm torch wheel ships its own copy
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec and spec.origin:
            out += [str(Path(spec.origin).parent / "lib" / n) for n in _LIB_NAMES]
    except Exception:  # noqa: BLE001 - only a search path
        pass
    found = ctypes.util.find_library("amdhip64")
    if found:
        out.append(found)
    return out


def load_hip_library(path: str | None = None) -> ctypes.CDLL:
    """``libamdhip64.so``, or HipError naming every place that was tried."""
    tried = [path] if path else _candidates()
    errors = []
    for name in tried:
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise HipError(
        "the HIP runtime (libamdhip64.so) is not available on this machine, so the real driver "
        "cannot load kernels. Install ROCm (or a ROCm build of torch), set ROCM_PATH, or pass a "
        "driver= for testing. Tried: " + "; ".join(errors[:4]) + ("; ..." if len(errors) > 4 else ""))


class HipDriver:
    """The :class:`~gemmar_aot.runtime.driver.Driver` backed by the HIP runtime."""

    def __init__(self, library: str | None = None):
        lib = self._lib = load_hip_library(library)
        vp, u = ctypes.c_void_p, ctypes.c_uint
        lib.hipGetErrorString.restype = ctypes.c_char_p
        lib.hipGetErrorString.argtypes = [ctypes.c_int]
        lib.hipModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
        lib.hipModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        lib.hipModuleUnload.argtypes = [vp]
        lib.hipModuleLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, ctypes.POINTER(vp),
                                              ctypes.POINTER(vp)]
        lib.hipMemset.argtypes = [vp, ctypes.c_int, ctypes.c_size_t]
        lib.hipStreamSynchronize.argtypes = [vp]
        for fn in ("hipModuleLoadData", "hipModuleGetFunction", "hipModuleUnload",
                   "hipModuleLaunchKernel", "hipMemset", "hipStreamSynchronize", "hipDeviceSynchronize"):
            getattr(lib, fn).restype = ctypes.c_int
        self._launch_fn = lib.hipModuleLaunchKernel
        #: Code object images by module handle: kept alive while the module is loaded.
        self._images: dict[int, bytes] = {}

    def _check(self, err: int, call: str) -> None:
        if err:
            msg = self._lib.hipGetErrorString(err)
            raise HipError(f"{call} failed: {msg.decode() if msg else '?'} (hipError {err})")

    # ---- device facts ----

    def device_arch(self, device: Any) -> str:
        try:
            import torch

            if torch.cuda.is_available():
                return str(torch.cuda.get_device_properties(device).gcnArchName)
        except Exception:  # noqa: BLE001 - fall back to HIP itself
            pass
        return self._device_arch_from_hip(device)

    def _device_arch_from_hip(self, device: Any) -> str:
        # hipDeviceProp_t's layout changes between ROCm releases, so do not hard-code the
        # offset of gcnArchName: fetch the struct into a generous buffer and take the
        # NUL-terminated string that starts with "gfx".
        index = getattr(device, "index", device) or 0
        buf = ctypes.create_string_buffer(8192)
        fn = getattr(self._lib, "hipGetDevicePropertiesR0600", None) or self._lib.hipGetDeviceProperties
        fn.restype = ctypes.c_int
        self._check(fn(buf, ctypes.c_int(int(index))), "hipGetDeviceProperties")
        raw = buf.raw
        at = raw.find(b"gfx")
        if at < 0:
            raise HipError("hipGetDeviceProperties returned no gcnArchName")
        return raw[at:raw.index(b"\0", at)].decode("ascii", "replace")

    def current_stream(self, device: Any) -> int:
        import torch

        return torch.cuda.current_stream(device).cuda_stream

    # ---- modules ----

    def load_module(self, image: bytes) -> Any:
        mod = ctypes.c_void_p()
        self._check(self._lib.hipModuleLoadData(ctypes.byref(mod), image), "hipModuleLoadData")
        self._images[mod.value] = image
        return mod.value

    def get_function(self, module: Any, name: str) -> Any:
        fn = ctypes.c_void_p()
        self._check(self._lib.hipModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                    f"hipModuleGetFunction({name!r})")
        return fn.value

    def unload_module(self, module: Any) -> None:
        self._images.pop(module, None)
        self._check(self._lib.hipModuleUnload(module), "hipModuleUnload")

    # ---- work ----

    def launch(self, function: Any, grid, block, args: KernArgs, stream: int) -> None:
        extra = args.driver_data
        if extra is None:
            size = ctypes.c_size_t(args.size)
            extra = (ctypes.c_void_p * 5)(HIP_LAUNCH_PARAM_BUFFER_POINTER, args.address,
                                          HIP_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size),
                                          HIP_LAUNCH_PARAM_END)
            args.driver_data = extra = (extra, size)  # the size must outlive the array
        err = self._launch_fn(function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                              0, stream, None, extra[0])
        if err:
            self._check(err, "hipModuleLaunchKernel")

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        self._check(self._lib.hipMemset(ptr, value, nbytes), "hipMemset")
        self._check(self._lib.hipDeviceSynchronize(), "hipDeviceSynchronize")

    def synchronize(self, stream: int) -> None:
        self._check(self._lib.hipStreamSynchronize(stream), "hipStreamSynchronize")
