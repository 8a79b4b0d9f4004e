"""Kernel launches as every op holds them: one :class:`Launch` type, resolved at construction.

A :class:`Launch` is everything one launch needs, fixed before the first call: the function
handle, a :class:`~gemmar_aot.runtime.driver.KernArgs` buffer and a precompiled
``struct.Struct`` laid out at the metadata note's offsets, the template of explicit argument
values, and the grid and block. A call hands it the values of its *per-call* host parameters
(pointers, element counts, M: whatever the op's launcher takes per call), in the order the
launch was prepared with; :meth:`Launch.pack` writes them into their argument slots and packs
the buffer in place. Nothing is allocated per call but Python integers.

* The collective op's kernels are resolved per M: its GEMM takes four pointers per call, its
  phase kernels nothing (their buffers are packed once and shared by every M that resolves to
  the same arguments).
* The standalone ops' kernels take M at run time: their grid is the record's own program,
  evaluated once per distinct value of the per-call parameters it reads and kept.

:func:`prepare_launch` checks what can be checked before a call: every host parameter has a
value or comes per call; no kernel argument is *computed* from a per-call parameter (the
runtime packs per-call values as they are); every pointer given per call reaches an argument,
the grid or the block; and a grid and block that are known now are a workgroup the kernel was
compiled for (a block known only per call is checked when first evaluated).
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

from gemmar_aot.model.codeobject import KernelMetadata
from gemmar_aot.model.launch import LaunchRecord, LaunchRecordError

from .driver import KernArgs
from .artifact_errors import ArtifactMismatchError
from .record_binding import record_key
from .kernel_checks import block_mismatch, explicit_args

#: struct codes per host-parameter type: pointers unsigned, lengths and i32 signed.
_CODES = {"ptr": "Q", "len32": "i", "i32": "i", "i64": "q"}


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


def to_signed(value: int, t: str) -> int:
    """A value as the struct code for ``t`` takes it (i64 handles may come unsigned)."""
    if t == "i64" and value >= 1 << 63:
        return value - (1 << 64)
    return int(value)


def dependencies(record: LaunchRecord) -> dict[str, set[int]]:
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


def operand_deps(x: Any, deps: dict[str, set[int]]) -> set[int]:
    """The host parameters operand ``x`` of a record's program depends on (``deps``: :func:`dependencies`)."""
    if isinstance(x, int):
        return set()
    if x.startswith("p"):
        return {int(x[1:])}
    return deps.get(x, set())


def mismatch(where: str, why: str) -> ArtifactMismatchError:
    return ArtifactMismatchError(f"{where}: {why}; the artifact does not match its launch record -- "
                                 f"rebuild it (gemmar-aot build)")


class _Shapes:
    """A grid and block that depend on per-call parameters: the record's program, run once per
    distinct value of the per-call parameters it reads (``reads``: positions in a call's values)."""

    __slots__ = ("program", "params", "per_call", "reads", "kernel", "where", "known")

    #: Distinct shapes kept per launch; past it the cache starts over.
    MAX_SHAPES = 4096

    def __init__(self, program: Any, params: list[int], per_call: tuple[int, ...], reads: tuple[int, ...],
                 kernel: KernelMetadata, where: str):
        self.program, self.params, self.per_call, self.reads = program, params, per_call, reads
        self.kernel, self.where = kernel, where
        self.known: dict[tuple, tuple] = {}

    def of(self, values: Sequence[int]) -> tuple:
        key = tuple([values[j] for j in self.reads])
        got = self.known.get(key)
        if got is None:
            p = self.params
            for j in self.reads:
                p[self.per_call[j]] = values[j]
            try:
                grid, block, _ = self.program.run(p)
            except LaunchRecordError as exc:
                raise mismatch(self.where, str(exc)) from None
            got = (tuple(int(g) for g in grid), tuple(int(b) for b in block))
            why = block_mismatch(self.kernel, got[1])
            if why:
                raise mismatch(self.where, why)
            if len(self.known) >= self.MAX_SHAPES:
                self.known.clear()
            self.known[key] = got
        return got


class Launch:
    """One kernel launch, resolved: ``driver.launch(function, grid, block, args, stream)``.

    ``grid`` and ``block`` are None when they depend on per-call parameters (then
    :meth:`shape` evaluates them). ``writes`` says where a call's values go: (argument index,
    position in the call's values)."""

    __slots__ = ("kind", "kernel", "digest", "function", "grid", "block", "args", "struct", "values", "writes",
                 "_shapes")

    def __init__(self, *, kind: str, kernel: str, digest: str, function: Any, grid, block, args: KernArgs,
                 st: struct.Struct, values: list, writes: tuple[tuple[int, int], ...] = (),
                 shapes: _Shapes | None = None):
        self.kind, self.kernel, self.digest, self.function = kind, kernel, digest, function
        self.grid, self.block, self.args, self.struct = grid, block, args, st
        self.values, self.writes, self._shapes = values, writes, shapes

    def pack(self, values: Sequence[int]) -> None:
        """Write a call's per-call values into their argument slots and pack the buffer in place."""
        v = self.values
        for i, j in self.writes:
            v[i] = values[j]
        self.struct.pack_into(self.args.buf, 0, *v)

    def shape(self, values: Sequence[int] = ()) -> tuple:
        """(grid, block) of a call with these per-call values."""
        if self._shapes is None:
            return self.grid, self.block
        return self._shapes.of(values)

    def launch(self, driver: Any, stream: int, values: Sequence[int] = ()) -> None:
        """Pack ``values`` (when the launch takes any) and queue the launch on ``stream``."""
        if self.writes:
            self.pack(values)
        grid, block = self.shape(values)
        driver.launch(self.function, grid, block, self.args, stream)


def _launch_shape(record: LaunchRecord, per_call: tuple[int, ...], where: str) -> tuple:
    """What :func:`prepare_launch` derives from a launch record alone: (writes, the positions of the
    per-call values the grid and block read). Raises ArtifactMismatchError."""
    deps = dependencies(record)
    position = {p: j for j, p in enumerate(per_call)}
    varying = set(per_call) | {record.stream_param}
    writes, reached = [], set()
    for i, x in enumerate(record.kernel_args):
        if isinstance(x, str) and x.startswith("p") and int(x[1:]) in position:
            writes.append((i, position[int(x[1:])]))
            reached.add(int(x[1:]))
        elif operand_deps(x, deps) & varying:
            raise mismatch(where, f"argument {i} of {record.kernel} is computed from per-call parameters; "
                                  f"the runtime packs only plain parameters per call")
    shape_reads = set()
    for x in (*record.grid, *record.block):
        d = operand_deps(x, deps)
        if record.stream_param in d:
            raise mismatch(where, f"the grid or block of {record.kernel} depends on the stream")
        shape_reads |= d & set(per_call)
    # a pointer the kernel never sees is a record that does not describe this kernel (a length
    # nothing reads is harmless: FlyDSL passes one with every tensor)
    unused = [p for p in per_call if p not in reached and p not in shape_reads and record.params[p] == "ptr"]
    if unused:
        raise mismatch(where, f"per-call pointers {unused} of {record.kernel} reach no kernel argument, grid "
                              f"or block")
    return tuple(writes), tuple(sorted(position[p] for p in shape_reads))


def _struct_for(kernel: KernelMetadata, types: tuple[str, ...], cache: dict) -> struct.Struct:
    """:func:`kernarg_struct`, shared by kernels of one argument layout (``cache``: per construction;
    found by the metadata object first: the phases of every M share one, and their layout is
    worked out once)."""
    got = cache.get(("struct", id(kernel), types))
    if got is not None and got[0] is kernel:
        return got[1]
    layout = (types, kernel.kernarg_size, tuple((a.offset, a.size) for a in explicit_args(kernel)))
    st = cache.get(layout)
    if st is None:
        st = cache[layout] = kernarg_struct(kernel, types)
    cache[("struct", id(kernel), types)] = (kernel, st)
    return st


def prepare_launch(*, kind: str, digest: str, record: LaunchRecord, kernel: KernelMetadata, function: Any,
                   fixed: dict[int, int], per_call: Sequence[int] = (), where: str,
                   cache: dict | None = None) -> Launch:
    """Resolve a launch whose host parameters are ``fixed`` (index -> value) except ``per_call``
    (their values come with each call, in this order). The stream parameter is neither: it is
    passed to the driver, never packed.

    Raises ArtifactMismatchError (naming ``where``) when the record does not fit: an argument would
    need per-call evaluation, a parameter has no value, a pointer given per call reaches nothing,
    the program is malformed, or a block known now is not one the kernel was compiled for. ``cache`` (a dict kept for one construction) shares what depends on the record's program
    and the kernel's argument layout alone between the launches that have them in common (a GEMM
    per M); launches without per-call parameters that resolve to the same arguments for the same
    kernel metadata (the phases of every M) share one packed argument buffer, never written again.
    """
    n = len(record.params)
    per_call = tuple(per_call)
    stream = record.stream_param
    missing = [i for i in range(n) if i not in fixed and i not in per_call and i != stream]
    if missing:
        raise mismatch(where, f"host parameters {missing} of {record.kernel} have no value")
    if cache is None:
        cache = {}
    rkey = record_key(record, cache)
    shape_key = (rkey, per_call)
    derived = cache.get(shape_key)
    if derived is None:
        derived = cache[shape_key] = _launch_shape(record, per_call, where)
    writes, shape_reads = derived
    # per-call parameters stand at 1 here (their slots are written per call, and only the fixed
    # arguments are taken from this evaluation): a program that divides by M resolves
    params = tuple([fixed.get(i, 1 if i in per_call else 0) for i in range(n)])
    program = cache.get((rkey, "program"))
    if program is None:
        # one compiled program per distinct record: the GEMMs of every M share theirs
        try:
            program = cache[(rkey, "program")] = record.compiled()
        except LaunchRecordError as exc:
            raise mismatch(where, str(exc)) from None
    st = _struct_for(kernel, record.kernel_arg_types, cache)
    shapes = None
    if shape_reads:
        shapes = _Shapes(program, list(params), per_call, shape_reads, kernel, where)
    # what the program computes depends on the record's program and these values alone: the
    # phases of every M (and of kernels sharing a record) resolve to the same values
    resolved_key = (rkey, params)
    built_key = (resolved_key, id(kernel))
    built = cache.get(built_key) if not per_call else None
    if built is None or built[0] is not kernel:
        resolved = cache.get(resolved_key)
        if resolved is None:
            try:
                resolved = cache[resolved_key] = program.run(params)
            except LaunchRecordError as exc:
                raise mismatch(where, str(exc)) from None
        grid, block, kvals = resolved
        if shapes is None:
            grid, block = tuple(int(g) for g in grid), tuple(int(b) for b in block)
            why = block_mismatch(kernel, block)
            if why:
                raise mismatch(where, why)
        else:
            grid = block = None
        per_call_args = {i for i, _j in writes}
        values = [0 if i in per_call_args else to_signed(v, t)
                  for i, (v, t) in enumerate(zip(kvals, record.kernel_arg_types))]
        args = KernArgs(kernel.kernarg_size)
        st.pack_into(args.buf, 0, *values)
        built = (kernel, grid, block, args, values)
        if not per_call:
            cache[built_key] = built
    _k, grid, block, args, values = built
    return Launch(kind=kind, kernel=record.kernel, digest=digest, function=function, grid=grid, block=block,
                  args=args, st=st, values=values, writes=writes, shapes=shapes)
