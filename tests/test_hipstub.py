"""The HIP runtime test double (tests/hipstub) and the REAL ctypes HipDriver running against it.

The code objects here are real gfx950 code objects compiled by clang from
``tests/hipstub/kernels.cl`` (well under a second, no FlyDSL), so this runs in the
fast tier. What the double knows about each kernel (name, kernarg segment size,
argument offsets, reqd/max workgroup size) it reads from the code object's own
metadata note, in C.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hipstub as hs
from gemmar_aot.runtime.driver import KernArgs
from gemmar_aot.runtime.artifact_errors import HipError
from gemmar_aot.runtime.hip import HipDriver


@pytest.fixture()
def driver(hip_stub, hipstub_lib):
    hip_stub.clear()
    return HipDriver(str(hipstub_lib))


def _fill_args(ptr: int, value: int, n: int) -> KernArgs:
    args = KernArgs(24)  # fill(global int*, int, long): 8 + 4 (+4 pad) + 8
    struct.pack_into("<Qi4xq", args.buf, 0, ptr, value, n)
    return args


# ---------------------------------------------------------------------------
# the library itself
# ---------------------------------------------------------------------------


def test_flydsl_runtime_binds_every_hip_import_to_the_double(hipstub_lib):
    """RTLD_NOW binds every symbol libfly_jit_runtime.so imports, version node (hip_4.2) included."""
    import flydsl

    runtime = Path(flydsl.__file__).parent / "_mlir" / "_mlir_libs" / "libfly_jit_runtime.so"
    code = (f"import ctypes, os\n"
            f"ctypes.CDLL({str(runtime)!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)\n"
            f"maps = open('/proc/self/maps').read()\n"
            f"print('libamdhip64' in maps and {str(Path(hipstub_lib).parent)!r} in maps)\n")
    env = {**os.environ, "LD_LIBRARY_PATH": str(Path(hipstub_lib).parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    # the control: without the double on the search path the runtime cannot load here at all
    env.pop("LD_LIBRARY_PATH")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0 and "libamdhip64.so.7" in out.stderr


def test_device_properties_report_gfx950(driver):
    # CPU torch has no GPU, so the driver asks HIP itself (hipGetDevicePropertiesR0600)
    assert driver.device_arch(torch.device("cpu")) == "gfx950:sramecc+:xnack-"


# ---------------------------------------------------------------------------
# the real HipDriver: module load, function lookup, launch, memset, sync
# ---------------------------------------------------------------------------


def test_hipdriver_loads_launches_and_records_the_argument_bytes(driver, hip_stub, test_co):
    loads = hip_stub.counter("module_load")
    mod = driver.load_module(test_co)
    fn = driver.get_function(mod, "fill")
    assert hip_stub.counter("module_load") == loads + 1
    out = (ctypes.c_int32 * 256)()
    stream = hip_stub.create_stream()
    args = _fill_args(ctypes.addressof(out), 7, 256)
    driver.launch(fn, (4, 1, 1), (64, 1, 1), args, stream)
    (rec,) = hip_stub.launches()
    assert rec.digest == hashlib.sha256(test_co).hexdigest()
    assert (rec.kernel, rec.grid, rec.block, rec.shared_mem, rec.stream) == ("fill", (4, 1, 1), (64, 1, 1), 0, stream)
    assert rec.via_extra and rec.kernarg == args.tobytes()
    # the extra array is built once per buffer and re-reads the buffer: a repack shows up in the next launch
    assert args.driver_data is not None
    struct.pack_into("<Qi4xq", args.buf, 0, ctypes.addressof(out), 9, 128)
    driver.launch(fn, (2, 1, 1), (64, 1, 1), args, stream)
    last = hip_stub.launches()[-1]
    assert struct.unpack("<Qi4xq", last.kernarg) == (ctypes.addressof(out), 9, 128) and last.grid == (2, 1, 1)
    syncs = hip_stub.counter("stream_synchronize")
    driver.synchronize(stream)
    assert hip_stub.counter("stream_synchronize") == syncs + 1
    driver.unload_module(mod)


def test_hipdriver_memset_fills_host_memory_and_synchronises(driver, hip_stub):
    buf = (ctypes.c_uint8 * 4096)()
    dsyncs = hip_stub.counter("device_synchronize")
    driver.memset(ctypes.addressof(buf), 0x5A, 4000)
    assert bytes(buf[:4000]) == b"\x5a" * 4000 and bytes(buf[4000:]) == b"\0" * 96
    assert hip_stub.memsets()[-1] == (ctypes.addressof(buf), 0x5A, 4000)
    assert hip_stub.counter("device_synchronize") == dsyncs + 1


def test_hipdriver_unknown_kernel_name_is_refused(driver, test_co):
    mod = driver.load_module(test_co)
    with pytest.raises(HipError, match=r"hipModuleGetFunction\('fil'\).*hipErrorNotFound.*no kernel named fil"):
        driver.get_function(mod, "fil")
    driver.unload_module(mod)


def test_hipdriver_kernarg_size_must_be_the_segment_size(driver, hip_stub, test_co):
    mod = driver.load_module(test_co)
    fn = driver.get_function(mod, "fill")
    short = KernArgs(16)
    with pytest.raises(HipError, match="hipErrorInvalidValue.*16 bytes, the kernarg segment is 24"):
        driver.launch(fn, (1, 1, 1), (64, 1, 1), short, 0)
    assert hip_stub.launches() == []
    driver.unload_module(mod)


def test_hipdriver_block_must_fit_the_code_object(driver, test_co):
    mod = driver.load_module(test_co)
    fill, axpy = driver.get_function(mod, "fill"), driver.get_function(mod, "axpy")
    with pytest.raises(HipError, match=r"block 32x2x1 is not .reqd_workgroup_size 64x1x1"):
        driver.launch(fill, (1, 1, 1), (32, 2, 1), _fill_args(0, 0, 0), 0)
    with pytest.raises(HipError, match=r"block 128x1x1 exceeds .max_flat_workgroup_size 64"):
        driver.launch(fill, (1, 1, 1), (128, 1, 1), _fill_args(0, 0, 0), 0)
    with pytest.raises(HipError, match=r"block 512x1x1 exceeds .max_flat_workgroup_size 256"):
        driver.launch(axpy, (1, 1, 1), (512, 1, 1), KernArgs(24), 0)
    driver.launch(axpy, (1, 1, 1), (256, 1, 1), KernArgs(24), 0)
    driver.unload_module(mod)


def test_hipdriver_refuses_unloaded_modules_and_dead_streams(driver, test_co):
    mod = driver.load_module(test_co)
    fn = driver.get_function(mod, "fill")
    driver.unload_module(mod)
    with pytest.raises(HipError, match="hipModuleLaunchKernel.*not loaded"):
        driver.launch(fn, (1, 1, 1), (64, 1, 1), _fill_args(0, 0, 0), 0)
    with pytest.raises(HipError, match="hipModuleUnload"):
        driver.unload_module(mod)
    with pytest.raises(HipError, match="hipModuleGetFunction.*not a loaded module"):
        driver.get_function(mod, "fill")
    with pytest.raises(HipError, match="hipStreamSynchronize.*hipErrorInvalidHandle"):
        driver.synchronize(0xDEAD000)


def test_hipdriver_refuses_code_objects_for_another_gpu_or_not_at_all(driver, gfx942_co, test_co):
    with pytest.raises(HipError, match="hipErrorNoBinaryForGpu.*not for gfx950"):
        driver.load_module(gfx942_co)
    with pytest.raises(HipError, match="hipErrorInvalidImage"):
        driver.load_module(b"\x7fELF" + b"\0" * 60)
    # a code object whose metadata note is cut short
    elf = bytearray(test_co)
    note = elf.find(b"amdhsa.kernels")
    elf[note:note + 14] = b"\xff" * 14
    with pytest.raises(HipError, match="hipErrorInvalidImage.*metadata"):
        driver.load_module(bytes(elf))


# ---------------------------------------------------------------------------
# the paths HipDriver does not take: kernelParams (FlyDSL's) and malformed extra
# ---------------------------------------------------------------------------


def _raw_launch(lib, fn, block, params, extra):
    lib.hipModuleLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return lib.hipModuleLaunchKernel(fn, 1, 1, 1, block, 1, 1, 0, None, params, extra)


def test_kernel_params_are_packed_at_the_metadata_offsets(driver, hip_stub, test_co):
    mod = driver.load_module(test_co)
    fn = driver.get_function(mod, "axpy")
    y, x, a, n = ctypes.c_uint64(0x1111), ctypes.c_uint64(0x2222), ctypes.c_float(2.5), ctypes.c_int32(-3)
    params = (ctypes.c_void_p * 4)(*(ctypes.addressof(v) for v in (y, x, a, n)))
    assert _raw_launch(hip_stub.lib, fn, 64, params, None) == 0
    rec = hip_stub.launches()[-1]
    assert not rec.via_extra
    assert rec.kernarg == struct.pack("<QQfi", 0x1111, 0x2222, 2.5, -3)
    driver.unload_module(mod)


def test_malformed_extra_is_refused(driver, hip_stub, test_co):
    mod = driver.load_module(test_co)
    fn = driver.get_function(mod, "axpy")
    buf = ctypes.create_string_buffer(24)
    size = ctypes.c_size_t(24)
    no_end = (ctypes.c_void_p * 16)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), *([0x77] * 12))
    assert _raw_launch(hip_stub.lib, fn, 64, None, no_end) == hs.HIP_ERROR_INVALID_VALUE
    assert "no HIP_LAUNCH_PARAM_END" in hip_stub.last_reject()
    no_size = (ctypes.c_void_p * 3)(1, ctypes.addressof(buf), 3)
    assert _raw_launch(hip_stub.lib, fn, 64, None, no_size) == hs.HIP_ERROR_INVALID_VALUE
    ok = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 3)
    params = (ctypes.c_void_p * 4)()
    assert _raw_launch(hip_stub.lib, fn, 64, params, ok) == hs.HIP_ERROR_INVALID_VALUE  # both at once
    assert _raw_launch(hip_stub.lib, fn, 64, None, None) == hs.HIP_ERROR_INVALID_VALUE  # neither
    assert _raw_launch(hip_stub.lib, None, 64, None, ok) == hs.HIP_ERROR_INVALID_HANDLE  # null function
    assert hip_stub.launches() == []
    assert _raw_launch(hip_stub.lib, fn, 64, None, ok) == 0
    driver.unload_module(mod)


@pytest.fixture(scope="module")
def sized_co(tmp_path_factory) -> bytes:
    """kernels.cl with ``sized``, whose kernarg segment holds hidden arguments past its explicit ones."""
    return hs.build_test_code_object(tmp_path_factory.mktemp("co-hidden") / "kernels.co", hidden_args=True)


def _extra(buf, size: int):
    n = ctypes.c_size_t(size)
    return (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(n), 3), n


def test_jitv2_extra_buffer_holds_the_explicit_arguments_not_the_hidden_ones(driver, hip_stub, sized_co):
    """mori's JIT v2 launches pass sizeof(EpArgs) through ``extra``, short of the kernarg segment (the
    hidden arguments come after). Real HIP reads each explicit argument at its offset from that buffer
    and fills the hidden ones itself: the double accepts any buffer reaching the end of the last explicit
    argument, records those arguments at their offsets (padding and hidden arguments zero), and refuses
    a shorter one with hipErrorInvalidValue."""
    from note_oracle import read_note

    kern = read_note(sized_co).kernel("sized")
    end = max(a.offset + a.size for a in kern.explicit_args)
    assert (end, kern.kernarg_size) == (12, 272)  # out (8) + value (4); the hidden ones run to 272
    fn = driver.get_function(driver.load_module(sized_co), "sized")
    buf = ctypes.create_string_buffer(b"\xee" * kern.kernarg_size)
    struct.pack_into("<Qi", buf, 0, 0x7F0000001000, 7)
    want = struct.pack("<Qi", 0x7F0000001000, 7) + bytes(kern.kernarg_size - 12)
    for size in (12, 16, 200, kern.kernarg_size):
        extra, _n = _extra(buf, size)
        assert _raw_launch(hip_stub.lib, fn, 64, None, extra) == 0, hip_stub.last_reject()
        rec = hip_stub.launches()[-1]
        assert rec.via_extra and rec.kernarg == want
    for size in (11, 8, 0):
        extra, _n = _extra(buf, size)
        assert _raw_launch(hip_stub.lib, fn, 64, None, extra) == hs.HIP_ERROR_INVALID_VALUE
        assert f"extra's argument buffer is {size} bytes, the kernarg segment is 272 and its explicit arguments " \
               f"end at 12" in hip_stub.last_reject()
    assert len(hip_stub.launches()) == 4
    # the layout is exactly {BUFFER_POINTER, buf, BUFFER_SIZE, &size, END}, as the real runtime checks it
    n = ctypes.c_size_t(12)
    swapped = (ctypes.c_void_p * 5)(2, ctypes.addressof(n), 1, ctypes.addressof(buf), 3)
    assert _raw_launch(hip_stub.lib, fn, 64, None, swapped) == hs.HIP_ERROR_INVALID_VALUE
    assert "lacks the buffer pointer or size" in hip_stub.last_reject()


def test_null_module_is_refused(hip_stub):
    fn = ctypes.c_void_p()
    lib = hip_stub.lib
    lib.hipModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
    assert lib.hipModuleGetFunction(ctypes.byref(fn), None, b"fill") == hs.HIP_ERROR_INVALID_HANDLE
    lib.hipModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
    assert lib.hipModuleLoadData(ctypes.byref(fn), None) == hs.HIP_ERROR_INVALID_VALUE
