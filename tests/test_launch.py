"""Launch records: FlyDSL's host IR read into a record, and the record replayed."""

from __future__ import annotations

import pytest

from gemmar_aot.compiler.hostir import HostIRError, read_launch_record
from gemmar_aot.model.launch import LaunchRecord, LaunchRecordError

# The host function FlyDSL 0.4.2 lowers the fused GEMM launcher to (kernel renamed).
GEMM_HOST_IR = """module attributes {gpu.container_module} {
  llvm.func @launch(%arg0: !llvm.ptr<1>, %arg1: !llvm.struct<packed (struct<packed (i32)>)>, %arg2: !llvm.ptr<1>, %arg3: !llvm.struct<packed (struct<packed (i32)>)>, %arg4: !llvm.ptr<1>, %arg5: !llvm.struct<packed (struct<packed (i32)>)>, %arg6: !llvm.ptr<1>, %arg7: !llvm.struct<packed (struct<packed (i32)>)>, %arg8: !llvm.ptr<1>, %arg9: !llvm.struct<packed (struct<packed (i32)>)>, %arg10: i32, %arg11: i32, %arg12: i64, %arg13: i64, %arg14: !llvm.ptr) attributes {llvm.emit_c_interface} {
    %0 = llvm.mlir.constant(-1 : i32) : i32
    %1 = llvm.mlir.constant(false) : i1
    %2 = llvm.mlir.constant(0 : i32) : i32
    %3 = llvm.mlir.constant(255 : i32) : i32
    %4 = llvm.mlir.constant(512 : index) : i64
    %5 = llvm.mlir.constant(1 : index) : i64
    %6 = llvm.mlir.constant(256 : i32) : i32
    %7 = llvm.mlir.constant(128 : i32) : i32
    %8 = llvm.mlir.constant(127 : i32) : i32
    %9 = llvm.add %arg10, %8 : i32
    %10 = llvm.sdiv %9, %7 : i32
    %11 = llvm.mul %10, %7 : i32
    %12 = llvm.icmp "ne" %9, %11 : i32
    %13 = llvm.icmp "slt" %9, %2 : i32
    %14 = llvm.icmp "ne" %13, %1 : i1
    %15 = llvm.and %12, %14 : i1
    %16 = llvm.add %10, %0 : i32
    %17 = llvm.select %15, %16, %10 : i1, i32
    %18 = llvm.add %arg11, %3 : i32
    %19 = llvm.sdiv %18, %6 : i32
    %20 = llvm.mul %19, %6 : i32
    %21 = llvm.icmp "ne" %18, %20 : i32
    %22 = llvm.icmp "slt" %18, %2 : i32
    %23 = llvm.icmp "ne" %22, %1 : i1
    %24 = llvm.and %21, %23 : i1
    %25 = llvm.add %19, %0 : i32
    %26 = llvm.select %24, %25, %19 : i1, i32
    %27 = llvm.mul %17, %26 : i32
    %28 = llvm.sext %27 : i32 to i64
    gpu.launch_func <%arg14 : !llvm.ptr> @kernels::@fused_kernel blocks in (%28, %5, %5) threads in (%4, %5, %5) : i64 args(%arg0 : !llvm.ptr<1>, %arg1 : !llvm.struct<packed (struct<packed (i32)>)>, %arg2 : !llvm.ptr<1>, %arg3 : !llvm.struct<packed (struct<packed (i32)>)>, %arg4 : !llvm.ptr<1>, %arg5 : !llvm.struct<packed (struct<packed (i32)>)>, %arg6 : !llvm.ptr<1>, %arg7 : !llvm.struct<packed (struct<packed (i32)>)>, %arg8 : !llvm.ptr<1>, %arg9 : !llvm.struct<packed (struct<packed (i32)>)>, %arg10 : i32, %arg11 : i32, %arg12 : i64, %arg13 : i64)
    llvm.return
  }
}
"""

PHASE_HOST_IR = """module attributes {gpu.container_module} {
  llvm.func @go(%arg0: i64, %arg1: i64, %arg2: !llvm.ptr) attributes {llvm.emit_c_interface} {
    %0 = llvm.mlir.constant(1 : index) : i64
    %1 = llvm.mlir.constant(64 : index) : i64
    gpu.launch_func <%arg2 : !llvm.ptr> @kernels::@push_0 blocks in (%0, %0, %0) threads in (%1, %0, %0) : i64 args(%arg0 : i64, %arg1 : i64)
    llvm.return
  }
}
"""

GEMM_ARGS = ["a", "b", "c", "a_scale", "b_scale", "c_m", "c_n", "dev_comm", "win", "stream"]
GEMM_KINDS = [("tensor", "int8")] * 2 + [("tensor", "bfloat16"), ("tensor", "float32"), ("tensor", "float32")] + [("int", "")] * 4 + [("stream", "")]


def _gemm():
    return read_launch_record(GEMM_HOST_IR, GEMM_ARGS, GEMM_KINDS)


def _params(rec, m, n):
    vals = [(0x100 * (i + 1), 1000 + i) for i in range(5)] + [m, n, 77, 88, 99]
    return rec.host_params(vals)


@pytest.mark.parametrize("m,n", [(512, 1024), (4096, 7168), (16384, 7168), (1, 1), (129, 257)])
def test_gemm_grid_is_ceildiv_product(m, n):
    rec = _gemm()
    grid, block, kargs = rec.resolve(_params(rec, m, n))
    assert grid == (-(-m // 128) * -(-n // 256), 1, 1)
    assert block == (512, 1, 1)
    # Explicit kernel arguments are the host parameters, in order, minus the stream.
    assert kargs == (0x100, 1000, 0x200, 1001, 0x300, 1002, 0x400, 1003, 0x500, 1004, m, n, 77, 88)


def test_gemm_record_shape():
    rec = _gemm()
    assert rec.kernel == "fused_kernel"
    assert [a.kind for a in rec.args] == ["tensor"] * 5 + ["i32", "i32", "i64", "i64", "stream"]
    assert rec.packed_size() == 104  # 5 x (ptr 8 + len 4, padded to 16) + 2 x i32 + 2 x i64
    assert rec.stream_param == 14
    assert not rec.is_constant_launch()


def test_round_trip_json():
    rec = _gemm()
    again = LaunchRecord.from_json(rec.to_json())
    assert again == rec
    assert again.resolve(_params(again, 4096, 7168)) == rec.resolve(_params(rec, 4096, 7168))


def test_phase_record_is_constant():
    rec = read_launch_record(PHASE_HOST_IR, ["dev_comm", "win", "stream"], [("int", ""), ("int", ""), ("stream", "")])
    assert rec.is_constant_launch()
    assert tuple(rec.grid) == (1, 1, 1) and tuple(rec.block) == (64, 1, 1)
    assert rec.packed_size() == 16
    assert rec.resolve(rec.host_params([5, 6, 7]))[2] == (5, 6)


def test_argument_kinds_are_checked_against_the_host_signature():
    with pytest.raises(HostIRError, match="tensor"):
        read_launch_record(PHASE_HOST_IR, ["x", "win", "stream"], [("tensor", "int8"), ("int", ""), ("stream", "")])
    with pytest.raises(HostIRError, match="fill"):
        read_launch_record(PHASE_HOST_IR, ["dev_comm", "win"], [("int", ""), ("int", "")])
    with pytest.raises(HostIRError, match="stream"):
        read_launch_record(PHASE_HOST_IR, ["dev_comm", "stream"], [("int", ""), ("stream", "")])


def test_unknown_host_ops_are_refused():
    bad = PHASE_HOST_IR.replace("%1 = llvm.mlir.constant(64 : index) : i64", "%1 = llvm.udiv %0, %0 : i64".replace("%", "%"))
    with pytest.raises(HostIRError, match="udiv"):
        read_launch_record(bad, ["dev_comm", "win", "stream"], [("int", ""), ("int", ""), ("stream", "")])


def test_wrong_argument_count_is_an_error():
    rec = _gemm()
    with pytest.raises(LaunchRecordError, match="arguments given"):
        rec.host_params([1, 2, 3])


def _program_record(program, out):
    return LaunchRecord.from_json({"kernel": "k", "params": ["i64", "i64"], "args": [], "kernel_args": [out],
                                   "kernel_arg_types": ["i64"], "program": program, "grid": [out, 1, 1],
                                   "block": [64, 1, 1], "stream_param": 0})


def _truncating(x, y):  # C's / and %, which LLVM's sdiv and srem are, computed on exact integers
    q = abs(x) // abs(y) * (1 if (x >= 0) == (y >= 0) else -1)
    return q, x - y * q


@pytest.mark.parametrize("x,y", [(7, 2), (-7, 2), (7, -2), (-7, -2), (2**62 + 3, 56), (-(2**62) - 3, 56),
                                 (2**63 - 1, 3), (-(2**63), 7), (2**53 + 1, 2)])
def test_sdiv_and_srem_are_exact_on_64_bit_values(x, y):
    # 64-bit values are exact: no floating-point step rounds a quotient above 2^53
    q, r = _truncating(x, y)
    assert _program_record([["v0", "sdiv", "p0", "p1", "i64"]], "v0").resolve([x, y])[2] == (q,)
    assert _program_record([["v0", "srem", "p0", "p1", "i64"]], "v0").resolve([x, y])[2] == (r,)


def test_results_wrap_to_their_width_and_comparisons_do_not():
    rec = _program_record([["v0", "add", "p0", "p1", "i32"], ["v1", "icmp_slt", "v0", 0, "i1"],
                           ["v2", "zext", "v1", "i1", "i64"], ["v3", "trunc", "p0", "i8"],
                           ["v4", "select", "v1", "v3", "v2", "i64"]], "v4")
    grid, _block, (v4,) = rec.resolve([2**31 - 1, 1])  # wraps to -2^31: negative, so v4 = trunc(p0) to i8 = -1
    assert v4 == -1 and grid == (-1, 1, 1)
    assert rec.resolve([5, 1])[2] == (0,)  # 6 is not negative: v4 = zext(0) = 0


@pytest.mark.parametrize("program,out,why", [
    ([["v0", "add", "p0", "v9", "i64"]], "v0", "operand 'v9'"),
    ([["v0", "add", "p0", "p2", "i64"]], "v0", "operand 'p2'"),
    ([["v0", "add", "p0", "p-1", "i64"]], "v0", "operand 'p-1'"),
    ([["v0", "udiv", "p0", "p1", "i64"]], "v0", "unknown op 'udiv'"),
    ([["v0", "add", "p0", "p1", "i7"]], "v0", "result width 'i7'"),
    ([["v0", "add", "p0", "i64"]], "v0", "add takes 2 operands"),
    ([["v0", "zext", "p0", "i64"]], "v0", "zext takes a value and its source width"),
    ([["v0", "add", "p0", "p1", "i64"], ["v0", "add", "p0", "p1", "i64"]], "v0", "defined twice"),
    ([["v0", "add", "p0", "p1", "i64"]], "v1", "operand 'v1'"),
])
def test_a_malformed_program_is_refused_at_its_first_resolve_whatever_the_parameters(program, out, why):
    # the old interpreter failed only on the values that reached a bad operand, with a KeyError or
    # an IndexError (or read params[-1] for "p-1"); a record is now checked whole, once
    rec = _program_record(program, out)
    with pytest.raises(LaunchRecordError, match=why):
        rec.resolve([1, 1])


def test_division_by_zero_is_a_launch_record_error():
    with pytest.raises(LaunchRecordError, match="division by zero"):
        _program_record([["v0", "sdiv", "p0", "p1", "i64"]], "v0").resolve([1, 0])
