"""The launch record: how to launch one compiled kernel, as FlyDSL's host code does it.

FlyDSL lowers every ``@flyc.jit`` launcher to a host function whose body computes
the grid and block and ends in ``gpu.launch_func``. The compiler side reads that
host IR (``gemmar_aot.compiler.hostir``) into a :class:`LaunchRecord`; the runtime
replays it: it maps the caller's arguments onto the host function's parameters,
evaluates the grid/block programs (a few integer ops copied from the IR, e.g. the
GEMM's ``ceildiv(c_m, BM) * ceildiv(c_n, BN)``), and packs the kernel's explicit
arguments at the offsets the code object's metadata gives.

Runtime-side module: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping, Sequence

#: Host-parameter types FlyDSL emits, and their kernarg size.
PARAM_SIZES = {"ptr": 8, "len32": 4, "i32": 4, "i64": 8, "stream": 8}


class LaunchRecordError(ValueError):
    """A launch record is malformed or does not fit the arguments it is given."""


@dataclass(frozen=True)
class RuntimeArg:
    """One argument of the Python-level launcher, in call order.

    kind: "tensor" (a device pointer followed by its int32 element count),
    "i32", "i64" or "stream". ``params`` are the host-function parameter
    indices it fills.
    """

    name: str
    kind: str
    params: tuple[int, ...]
    dtype: str = ""  # tensors: the element dtype the launcher was traced with

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "params": list(self.params), "dtype": self.dtype}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RuntimeArg":
        return cls(d["name"], d["kind"], tuple(d["params"]), d.get("dtype", ""))


#: One instruction of a grid/block program: (result, op, operands...). Operands are
#: "p<N>" (host parameter N), "v<N>" (an earlier result) or an int literal.
Instr = tuple


@dataclass(frozen=True)
class LaunchRecord:
    kernel: str  # symbol in the code object (not unique across kernels: never a key)
    params: tuple[str, ...]  # host parameter types, in order ("ptr", "len32", "i32", "i64", "stream")
    args: tuple[RuntimeArg, ...]  # the launcher's arguments, in call order
    kernel_args: tuple[str, ...]  # per explicit kernel argument: "p<N>" or "v<N>"
    kernel_arg_types: tuple[str, ...]
    program: tuple[Instr, ...]  # computes every "v<N>" used by grid/block/kernel_args
    grid: tuple[str | int, str | int, str | int]
    block: tuple[str | int, str | int, str | int]
    stream_param: int

    # ---- evaluation ----

    @cached_property
    def _compiled(self) -> "Program":
        # a cached_property: the record's fields are frozen, and equality and hashing see them alone
        return Program(self)

    def compiled(self) -> "Program":
        """The grid/block program, compiled (once per record object); records with equal
        fields may share one (:func:`~gemmar_aot.runtime.launches.prepare_launch` does)."""
        return self._compiled

    def resolve(self, params: Sequence[int]) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, ...]]:
        """(grid, block, explicit kernel-argument values) for these host parameters."""
        return self._compiled.run(params)

    def host_params(self, values: Sequence[Any]) -> list[int]:
        """Flatten launcher-level values (tensor = (ptr, numel)) into host parameters.

        ``values`` holds, per runtime argument: for tensors a (pointer, element
        count) pair, for scalars an int, for the stream a handle (int).
        """
        if len(values) != len(self.args):
            raise LaunchRecordError(
                f"{self.kernel}: {len(values)} arguments given, the launcher takes "
                f"{len(self.args)} ({[a.name for a in self.args]})"
            )
        out = [0] * len(self.params)
        for a, v in zip(self.args, values):
            if a.kind == "tensor":
                ptr, numel = v
                out[a.params[0]], out[a.params[1]] = int(ptr), int(numel)
            else:
                out[a.params[0]] = int(v)
        return out

    def packed_size(self) -> int:
        """Bytes the explicit arguments take at natural alignment (the ABI's rule)."""
        off = 0
        for t in self.kernel_arg_types:
            size = PARAM_SIZES[t]
            off = (off + size - 1) // size * size + size
        return off

    # ---- (de)serialisation ----

    def to_json(self) -> dict:
        return {
            "kernel": self.kernel,
            "params": list(self.params),
            "args": [a.to_json() for a in self.args],
            "kernel_args": list(self.kernel_args),
            "kernel_arg_types": list(self.kernel_arg_types),
            "program": [list(i) for i in self.program],
            "grid": list(self.grid),
            "block": list(self.block),
            "stream_param": self.stream_param,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "LaunchRecord":
        try:
            return cls(
                kernel=d["kernel"],
                params=tuple(d["params"]),
                args=tuple(RuntimeArg.from_json(a) for a in d["args"]),
                kernel_args=tuple(d["kernel_args"]),
                kernel_arg_types=tuple(d["kernel_arg_types"]),
                program=tuple(tuple(i) for i in d["program"]),
                grid=tuple(d["grid"]),  # type: ignore[arg-type]
                block=tuple(d["block"]),  # type: ignore[arg-type]
                stream_param=int(d["stream_param"]),
            )
        except (KeyError, TypeError) as exc:
            raise LaunchRecordError(f"malformed launch record: {exc!r}") from exc

    def is_constant_launch(self) -> bool:
        return all(isinstance(x, int) for x in self.grid + self.block)


_WIDTH = {"i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64}


def _sdiv(x: int, y: int) -> int:
    """Signed division truncating toward zero (LLVM's ``sdiv``), on exact integers."""
    if y == 0:
        raise LaunchRecordError("division by zero in a grid program")
    q = abs(x) // abs(y)
    return q if (x >= 0) == (y >= 0) else -q


def _srem(x: int, y: int) -> int:
    """The remainder of :func:`_sdiv` (LLVM's ``srem``: the sign of the dividend)."""
    return x - y * _sdiv(x, y)


#: The two-operand ops, by name: what each computes before its result is wrapped to its width.
_BINARY = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "sdiv": _sdiv,
    "srem": _srem,
    "and": lambda x, y: x & y,
    "or": lambda x, y: x | y,
    "xor": lambda x, y: x ^ y,
}
#: icmp predicates; a comparison's result is 0 or 1, never wrapped.
_ICMP = {
    "eq": lambda x, y: int(x == y), "ne": lambda x, y: int(x != y),
    "slt": lambda x, y: int(x < y), "sle": lambda x, y: int(x <= y),
    "sgt": lambda x, y: int(x > y), "sge": lambda x, y: int(x >= y),
}


class Program:
    """A record's grid/block program, compiled once: every operand becomes an index into one
    value list (the host parameters, then the program's literals, then its results in order),
    every instruction a function of that list. Checked as it is compiled, so a malformed
    program is a :class:`LaunchRecordError` at its first resolve, whatever the parameters.

    Evaluating it is what :meth:`LaunchRecord.resolve` does: ops, widths and wrap-around as
    in the IR (``_BINARY``, ``_ICMP``, ``select``, ``sext``/``trunc``/``zext``)."""

    __slots__ = ("kernel", "nparams", "consts", "steps", "outputs")

    def __init__(self, rec: "LaunchRecord"):
        n = self.nparams = len(rec.params)
        self.kernel = rec.kernel
        where = f"{rec.kernel}: grid program"
        outputs = (rec.grid, rec.block, rec.kernel_args)
        literals = sorted({x for i in rec.program for x in i[2:] if _is_literal(x)}
                          | {x for part in outputs for x in part if _is_literal(x)})
        at = {x: n + j for j, x in enumerate(literals)}  # literals after the parameters
        for j in range(n):
            at[f"p{j}"] = j

        def index(x) -> int:
            got = at.get(x) if isinstance(x, (int, str)) and not isinstance(x, bool) else None
            if got is None:
                raise LaunchRecordError(f"{where}: operand {x!r} is neither a literal, a host parameter "
                                        f"p0..p{n - 1} nor an earlier result")
            return got

        steps = []
        for instr in rec.program:
            if len(instr) < 3:
                raise LaunchRecordError(f"{where}: instruction {list(instr)} has no operands")
            dst, op, *xs, ty = instr
            bits = _WIDTH.get(ty) if isinstance(ty, str) else None
            if bits is None:
                raise LaunchRecordError(f"{where}: {op} names result width {ty!r}, not one of {sorted(_WIDTH)}")
            if op == "zext":
                src = _WIDTH.get(xs[1]) if len(xs) == 2 and isinstance(xs[1], str) else None
                if src is None:
                    raise LaunchRecordError(f"{where}: zext takes a value and its source width, got {xs}")
                steps.append((_ZEXT, None, index(xs[0]), 0, 0, (1 << src) - 1, *_wrap_of(bits)))
            else:
                icmp = isinstance(op, str) and op.startswith("icmp_")
                arity = 3 if op == "select" else 1 if op in ("sext", "trunc") else 2
                kind = _SELECT_STEP if arity == 3 else _UNARY if arity == 1 else _BINARY_STEP
                fn = (_ICMP.get(op[5:]) if icmp else _BINARY.get(op)) if arity == 2 else None
                if arity == 2 and fn is None:
                    raise LaunchRecordError(f"unknown op {op!r} in a grid program")
                if len(xs) != arity:
                    raise LaunchRecordError(f"{where}: {op} takes {arity} operands, got {len(xs)}")
                ix = [index(x) for x in xs] + [0] * (3 - arity)
                steps.append((kind, fn, *ix, 0, *_wrap_of(0 if icmp else bits)))
            if not isinstance(dst, str) or dst in at:
                raise LaunchRecordError(f"{where}: result {dst!r} is defined twice or names a parameter")
            at[dst] = n + len(literals) + len(steps) - 1  # results after the literals, in order
        self.consts = tuple(literals)
        self.steps = tuple(steps)
        self.outputs = tuple(tuple(index(x) for x in part) for part in outputs)

    def run(self, params: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(grid, block, explicit kernel-argument values) for these host parameters."""
        if len(params) != self.nparams:
            raise LaunchRecordError(f"{self.kernel}: {len(params)} host parameters given, record has {self.nparams}")
        v = [*params, *self.consts]
        append = v.append
        # one branch per operand count: no argument list built per step (a GEMM's grid is 20 steps)
        for kind, fn, a, b, c, extra, mask, top in self.steps:
            if kind == _BINARY_STEP:
                r = fn(v[a], v[b])
            elif kind == _UNARY:  # sext, trunc: the value, wrapped to the result width
                r = v[a]
            elif kind == _SELECT_STEP:
                r = v[b] if v[a] & 1 else v[c]
            else:  # zext: the value masked to its source width, then wrapped
                r = v[a] & extra
            if mask:  # two's-complement wrap to the result width and read back as signed
                r &= mask
                if r & top:
                    r -= mask + 1
            append(r)
        grid, block, kargs = self.outputs
        return (tuple([v[i] for i in grid]), tuple([v[i] for i in block]),  # type: ignore[return-value]
                tuple([v[i] for i in kargs]))


def _wrap_of(bits: int) -> tuple[int, int]:
    """(mask, sign bit) of a result ``bits`` wide (0: an icmp's 0 or 1, never wrapped; a 1-bit
    result is masked, never negative)."""
    if not bits:
        return 0, 0
    return (1 << bits) - 1, (1 << (bits - 1)) if bits > 1 else 0


def _is_literal(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# What a compiled step does (Program.run branches on it, most common first).
_BINARY_STEP = 0  # fn(x, y): an op of _BINARY or _ICMP
_UNARY = 1  # sext, trunc: the value, wrapped to the result width
_SELECT_STEP = 2  # select(c, x, y): x if c & 1 else y
_ZEXT = 3  # the value masked to its source width (``extra``), then wrapped
