"""The HIP runtime test double at the C ABI: build it, load it, read what it recorded.

``hipstub.c`` is a stand-in ``libamdhip64.so`` (see its header comment for what it
checks and records). :func:`build` compiles it from source with the toolchain's
``zig cc`` against the real HIP headers the toolchain ships; the output directory
holds ``libamdhip64.so`` plus the ``libamdhip64.so.7`` name FlyDSL's
``libfly_jit_runtime.so`` is linked against, so a process started with that
directory on ``LD_LIBRARY_PATH`` gets the double wherever HIP is looked up.

:class:`HipStub` reads the double's records through its ``hipstub_*`` functions.
It is a reader only: everything the double decides, it decides in C from the
code objects it is given.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "hipstub.c", HERE / "hipstub.map")
LIB_NAME = "libamdhip64.so"
SONAME = "libamdhip64.so.7"  # what libfly_jit_runtime.so's DT_NEEDED names

#: hipError_t values the tests compare against (hip_runtime_api.h).
HIP_ERROR_INVALID_VALUE = 1
HIP_ERROR_INVALID_IMAGE = 200
HIP_ERROR_NO_BINARY_FOR_GPU = 209
HIP_ERROR_INVALID_HANDLE = 400
HIP_ERROR_NOT_FOUND = 500


class BuildError(RuntimeError):
    pass


def _hip_include() -> Path:
    from gemmar_aot.toolchain import load_toolchain

    inc = load_toolchain().root / "hip" / "include"
    if not (inc / "hip" / "hip_runtime_api.h").is_file():
        raise BuildError(f"the toolchain has no HIP headers at {inc}; run `make setup`")
    return inc


def build(out_dir: Path) -> Path:
    """Compile the double into ``out_dir`` (idempotent per source digest); returns the library path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    inc = _hip_include()
    h = hashlib.sha256()
    for src in SOURCES:
        h.update(src.read_bytes())
    h.update(str(inc).encode())
    stamp = out_dir / ".hipstub.sha256"
    lib = out_dir / LIB_NAME
    if lib.is_file() and stamp.is_file() and stamp.read_text() == h.hexdigest():
        return lib
    cmd = [sys.executable, "-m", "ziglang", "cc", "-shared", "-fPIC", "-O2", "-g0", "-Wall", "-Wextra", "-Werror",
           "-D__HIP_PLATFORM_AMD__", f"-I{inc}", f"-Wl,--version-script={HERE / 'hipstub.map'}",
           f"-Wl,-soname,{SONAME}", "-o", str(lib) + ".tmp", str(HERE / "hipstub.c")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise BuildError(f"building the HIP test double failed ({' '.join(cmd)}):\n{proc.stderr}")
    os.replace(str(lib) + ".tmp", lib)
    alias = out_dir / SONAME
    if alias.is_symlink() or alias.exists():
        alias.unlink()
    alias.symlink_to(LIB_NAME)
    stamp.write_text(h.hexdigest())
    return lib


# ---------------------------------------------------------------------------
# reading the records
# ---------------------------------------------------------------------------


MAX_ARGS = 64  # hipstub.c


class _Arg(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_uint32), ("size", ctypes.c_uint32), ("kind", ctypes.c_uint32),
                ("hidden", ctypes.c_uint32)]


#: hipstub.c's argument kinds (from the metadata note's .value_kind).
ARG_KINDS = ("by_value", "global_buffer", "hidden", "other")


class _Launch(ctypes.Structure):
    _fields_ = [("digest", ctypes.c_char * 65), ("kernel", ctypes.c_char * 256), ("grid", ctypes.c_uint32 * 3),
                ("block", ctypes.c_uint32 * 3), ("shared_mem", ctypes.c_uint32), ("stream", ctypes.c_uint64),
                ("via_extra", ctypes.c_uint32), ("kernarg_size", ctypes.c_uint32),
                ("kernarg", ctypes.POINTER(ctypes.c_uint8)), ("nargs", ctypes.c_uint32),
                ("args", _Arg * MAX_ARGS)]


class _Memset(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_uint64), ("value", ctypes.c_int32), ("bytes", ctypes.c_uint64)]


@dataclass(frozen=True)
class Launch:
    """One hipModuleLaunchKernel the double accepted."""

    digest: str  # sha256 of the code object the function's module was loaded from
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    stream: int
    via_extra: bool  # argument bytes came through ``extra`` (else ``kernelParams``)
    kernarg: bytes  # the kernarg segment: each explicit argument at its offset, hidden ones (the runtime's) zero
    args: tuple[tuple[int, int, str], ...]  # (offset, size, kind) per argument, from the code object's note


class HipStub:
    """A handle on the loaded double (``RTLD_GLOBAL``, so FlyDSL's runtime binds to the same copy)."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        lib = self.lib = ctypes.CDLL(self.path, mode=ctypes.RTLD_GLOBAL)
        lib.hipstub_launch_count.restype = ctypes.c_size_t
        lib.hipstub_launch_at.restype = ctypes.POINTER(_Launch)
        lib.hipstub_launch_at.argtypes = [ctypes.c_size_t]
        lib.hipstub_memset_count.restype = ctypes.c_size_t
        lib.hipstub_memset_at.restype = ctypes.POINTER(_Memset)
        lib.hipstub_memset_at.argtypes = [ctypes.c_size_t]
        lib.hipstub_counter.restype = ctypes.c_uint64
        lib.hipstub_counter.argtypes = [ctypes.c_char_p]
        lib.hipstub_last_reject.restype = ctypes.c_char_p
        lib.hipstub_loaded_modules.restype = ctypes.c_int
        lib.hipStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.hipStreamCreate.restype = ctypes.c_int

    def launches(self) -> list[Launch]:
        out = []
        for i in range(self.lib.hipstub_launch_count()):
            r = self.lib.hipstub_launch_at(i).contents
            out.append(Launch(r.digest.decode(), r.kernel.decode(), tuple(r.grid), tuple(r.block), r.shared_mem,
                              r.stream, bool(r.via_extra), ctypes.string_at(r.kernarg, r.kernarg_size),
                              tuple((a.offset, a.size, ARG_KINDS[a.kind]) for a in r.args[:r.nargs])))
        return out

    def memsets(self) -> list[tuple[int, int, int]]:
        out = []
        for i in range(self.lib.hipstub_memset_count()):
            r = self.lib.hipstub_memset_at(i).contents
            out.append((r.ptr, r.value, r.bytes))
        return out

    def counter(self, name: str) -> int:
        v = self.lib.hipstub_counter(name.encode())
        if v == (1 << 64) - 1:
            raise KeyError(name)
        return int(v)

    def loaded_modules(self) -> int:
        return int(self.lib.hipstub_loaded_modules())

    def last_reject(self) -> str:
        return (self.lib.hipstub_last_reject() or b"").decode()

    def clear(self) -> None:
        """Forget the launch and memset logs (modules, streams and counters stay)."""
        self.lib.hipstub_clear()

    def create_stream(self) -> int:
        s = ctypes.c_void_p()
        err = self.lib.hipStreamCreate(ctypes.byref(s))
        if err:
            raise RuntimeError(f"hipStreamCreate failed: {err}")
        return int(s.value)


def build_test_code_object(out: Path, *, mcpu: str = "gfx950", only_fill: bool = False,
                           hidden_args: bool = False) -> bytes:
    """``kernels.cl`` compiled by clang (zig's) into a real code object for ``mcpu``; returns its bytes.
    ``hidden_args`` adds ``sized``, a kernel whose kernarg segment holds hidden arguments."""
    out = Path(out)
    obj = out.with_suffix(".o")
    zig = [sys.executable, "-m", "ziglang"]
    steps = [
        zig + ["clang", "-x", "cl", "-cl-std=CL2.0", "-Xclang", "-fdeclare-opencl-builtins", "-cl-no-stdinc",
               "--target=amdgcn-amd-amdhsa", f"-mcpu={mcpu}", "-nogpulib", "-mcode-object-version=6", "-O2",
               *(["-DONLY_FILL"] if only_fill else []),
               *(["-DHIDDEN_ARGS"] if hidden_args else []), "-c", str(HERE / "kernels.cl"), "-o", str(obj)],
        zig + ["ld.lld", "-shared", str(obj), "-o", str(out)],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise BuildError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return out.read_bytes()
