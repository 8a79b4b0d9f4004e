"""Kernels as the runtime holds them: verified code objects and pre-packed launches.

Two steps, kept apart so a bad artifact is refused before anything is acquired:

1. :func:`verify_code_object` -- the code object's own metadata note (parsed by
   :func:`gemmar_aot.codeobject.parse_code_object`, the independent oracle) must
   agree with the launch record FlyDSL produced: target arch, exactly one kernel,
   its name, every explicit argument at the offset and size the record's types
   give at natural alignment *and of the kind they give* (a pointer is a
   ``global_buffer``, a length or scalar ``by_value``: a record that feeds a
   pointer slot an integer, or the reverse, is refused even when the sizes
   agree), the kernarg segment exactly that long, the block the record launches
   with the workgroup size the kernel was compiled for (``reqd_workgroup_size``,
   else at most ``max_flat_workgroup_size``), and its static LDS within the
   device's. A wrong block on a GPU is not an error HIP always reports: it is a
   kernel whose barriers and tile indexing assume threads that do not exist.
2. :class:`PreparedLaunch` -- everything a launch needs, resolved once: the
   function handle, grid and block (from the record's program), a
   :class:`~gemmar_aot.runtime.driver.KernArgs` buffer and a precompiled
   ``struct.Struct`` laid out at the metadata's offsets. Phase kernels take
   ``(dev_comm, win)``, which never change, so their buffer is packed once. The
   GEMM's buffer is re-packed per call, in place, with the four operand pointers
   and element counts; everything else in it (the window's input region, c_m,
   c_n, dev_comm, win) is fixed per M and sits in a template list.

The record's grid/block programs are checked to depend only on the per-M
parameters, and every kernel argument to be either a plain host parameter or a
value computed from per-M parameters only -- so nothing has to be evaluated per
call, and a record that would need it is refused at construction rather than
launched wrongly.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Sequence

from gemmar_aot.codeobject import CodeObject, KernelMetadata
from gemmar_aot.launch import PARAM_SIZES, LaunchRecord, LaunchRecordError

from .driver import KernArgs
from .errors import ArtifactMismatchError

#: struct codes per host-parameter type: pointers unsigned, lengths and i32 signed.
_CODES = {"ptr": "Q", "len32": "i", "i32": "i", "i64": "q"}
#: The metadata note's value kind for each host-parameter type.
_VALUE_KINDS = {"ptr": "global_buffer", "len32": "by_value", "i32": "by_value", "i64": "by_value"}
#: LDS per workgroup on the targets we build for (gfx950: 160 KiB).
MAX_LDS_BYTES = {"gfx950": 160 * 1024}


def natural_offsets(types: Sequence[str]) -> list[int]:
    """Offset of each explicit argument at natural alignment (the AMDGPU kernarg ABI)."""
    out, off = [], 0
    for t in types:
        size = PARAM_SIZES[t]
        off = (off + size - 1) // size * size
        out.append(off)
        off += size
    return out


def explicit_args(kernel: KernelMetadata):
    return [a for a in kernel.args if not a.value_kind.startswith("hidden_")]


def verify_code_object(code: CodeObject, record: LaunchRecord, *, arch: str, where: str) -> KernelMetadata:
    """The kernel's metadata, after checking it against the launch record. Raises ArtifactMismatchError."""
    def bad(why: str) -> ArtifactMismatchError:
        return ArtifactMismatchError(f"{where}: {why}; the artifact does not match its launch record "
                                     f"-- rebuild it (gemmar-aot build)")

    if code.arch != arch:
        raise bad(f"code object is for {code.arch}, the artifacts say {arch}")
    if len(code.kernels) != 1:
        raise bad(f"code object holds {len(code.kernels)} kernels, expected exactly one")
    if code.undefined_symbols:
        raise bad(f"code object has undefined symbols {list(code.undefined_symbols)} (cco bitcode not linked?)")
    kern = code.kernels[0]
    if kern.name != record.kernel:
        raise bad(f"kernel is {kern.name!r}, the launch record names {record.kernel!r}")
    args = explicit_args(kern)
    types = record.kernel_arg_types
    if len(args) != len(types):
        raise bad(f"kernel has {len(args)} explicit arguments, the launch record {len(types)}")
    for i, (a, t, off) in enumerate(zip(args, types, natural_offsets(types))):
        if a.size != PARAM_SIZES[t] or a.offset != off:
            raise bad(f"argument {i} is {a.size} bytes at offset {a.offset}, the record's {t} needs "
                      f"{PARAM_SIZES[t]} bytes at {off}")
        if a.value_kind != _VALUE_KINDS[t]:
            raise bad(f"argument {i} is a {a.value_kind} in the code object, the record passes a {t} "
                      f"({_VALUE_KINDS[t]})")
    if kern.kernarg_size != record.packed_size():
        raise bad(f"kernarg segment is {kern.kernarg_size} bytes, the record packs {record.packed_size()}")
    limit = MAX_LDS_BYTES.get(arch)
    if limit is not None and kern.lds_bytes > limit:
        raise bad(f"kernel needs {kern.lds_bytes} bytes of LDS, {arch} has {limit}")
    if all(isinstance(b, int) for b in record.block):
        why = block_mismatch(kern, tuple(record.block))
        if why:
            raise bad(why)
    return kern


def block_mismatch(kernel: KernelMetadata, block: tuple[int, ...]) -> str | None:
    """Why ``block`` is not a workgroup ``kernel`` was compiled for, or None."""
    if len(block) != 3 or any(int(b) < 1 for b in block):
        return f"block {list(block)} is not three positive sizes"
    reqd = kernel.reqd_workgroup_size
    if reqd and tuple(reqd) != tuple(block):
        return (f"the record launches block {list(block)}, the kernel was compiled for exactly "
                f"{list(reqd)} (reqd_workgroup_size)")
    flat = block[0] * block[1] * block[2]
    if flat > kernel.max_flat_workgroup_size:
        return (f"the record launches block {list(block)} ({flat} threads), the kernel was compiled for at most "
                f"{kernel.max_flat_workgroup_size} (max_flat_workgroup_size)")
    return None


def kernarg_struct(kernel: KernelMetadata, types: Sequence[str]) -> struct.Struct:
    """A Struct writing the explicit arguments at the metadata's offsets, padded to kernarg_size."""
    fmt, pos = ["<"], 0
    for a, t in zip(explicit_args(kernel), types):
        if a.offset > pos:
            fmt.append(f"{a.offset - pos}x")
        fmt.append(_CODES[t])
        pos = a.offset + a.size
    if kernel.kernarg_size > pos:
        fmt.append(f"{kernel.kernarg_size - pos}x")
    s = struct.Struct("".join(fmt))
    assert s.size == kernel.kernarg_size, (s.format, kernel.kernarg_size)
    return s


def _to_signed(value: int, t: str) -> int:
    """A value as the struct code for ``t`` takes it (i64 handles may come unsigned)."""
    if t == "i64" and value >= 1 << 63:
        return value - (1 << 64)
    return int(value)


def _dependencies(record: LaunchRecord) -> dict[str, set[int]]:
    """For each program value ``v<N>``, the host parameters it is computed from."""
    deps: dict[str, set[int]] = {}
    for dst, _op, *ops in record.program:
        d: set[int] = set()
        for o in ops:
            if isinstance(o, str) and o.startswith("p") and o[1:].isdigit():
                d.add(int(o[1:]))
            elif isinstance(o, str) and o in deps:
                d |= deps[o]
        deps[dst] = d
    return deps


def _operand_deps(x: Any, deps: dict[str, set[int]]) -> set[int]:
    if isinstance(x, int):
        return set()
    if x.startswith("p"):
        return {int(x[1:])}
    return deps.get(x, set())


@dataclass
class PreparedLaunch:
    """One kernel launch, resolved: call ``driver.launch(function, grid, block, args, stream)``.

    For a kernel with per-call parameters, ``values`` is the template of explicit
    argument values and ``slots[i]`` the template index each per-call host
    parameter ``i`` (in ``per_call`` order) goes to; :meth:`pack` writes them.
    """

    kind: str
    kernel: str
    digest: str
    function: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: KernArgs
    struct: struct.Struct
    values: list
    slots: tuple[int, ...] = ()

    def pack(self) -> None:
        self.struct.pack_into(self.args.buf, 0, *self.values)


def prepare_launch(*, kind: str, digest: str, record: LaunchRecord, kernel: KernelMetadata, function: Any,
                   fixed: dict[int, int], per_call: Sequence[int], where: str) -> PreparedLaunch:
    """Resolve a launch whose host parameters are ``fixed`` (index -> value) except ``per_call``.

    The stream parameter is neither: it is passed to the driver, never packed.
    Raises LaunchRecordError when grid, block or an argument would need per-call
    evaluation, or a parameter is left unassigned.
    """
    n = len(record.params)
    per_call = tuple(per_call)
    stream = record.stream_param
    missing = [i for i in range(n) if i not in fixed and i not in per_call and i != stream]
    if missing:
        raise LaunchRecordError(f"{where}: host parameters {missing} of {record.kernel} have no value")
    deps = _dependencies(record)
    varying = set(per_call) | {stream}
    for what, xs in (("grid", record.grid), ("block", record.block)):
        for x in xs:
            if _operand_deps(x, deps) & varying:
                raise LaunchRecordError(f"{where}: the {what} of {record.kernel} depends on per-call "
                                        f"parameters; the runtime resolves it once per M")
    params = [fixed.get(i, 0) for i in range(n)]
    grid, block, kvals = record.resolve(params)
    why = block_mismatch(kernel, tuple(int(b) for b in block))
    if why:
        raise ArtifactMismatchError(f"{where}: {why}; the artifact does not match its launch record -- rebuild "
                                    f"it (gemmar-aot build)")
    values: list = []
    slot_of: dict[int, int] = {}
    for i, (x, t) in enumerate(zip(record.kernel_args, record.kernel_arg_types)):
        d = _operand_deps(x, deps)
        if isinstance(x, str) and x.startswith("p") and int(x[1:]) in per_call:
            slot_of[int(x[1:])] = i
            values.append(0)
        elif d & varying:
            raise LaunchRecordError(f"{where}: argument {i} of {record.kernel} is computed from per-call "
                                    f"parameters; the runtime packs only plain parameters per call")
        else:
            values.append(_to_signed(kvals[i], t))
    unused = [p for p in per_call if p not in slot_of]
    if unused:
        raise LaunchRecordError(f"{where}: per-call parameters {unused} of {record.kernel} reach no kernel argument")
    st = kernarg_struct(kernel, record.kernel_arg_types)
    args = KernArgs(kernel.kernarg_size)
    launch = PreparedLaunch(kind=kind, kernel=record.kernel, digest=digest, function=function,
                            grid=tuple(int(g) for g in grid), block=tuple(int(b) for b in block),
                            args=args, struct=st, values=values,
                            slots=tuple(slot_of[p] for p in per_call))
    launch.pack()
    return launch

