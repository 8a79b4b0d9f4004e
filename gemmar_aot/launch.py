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

    def _eval(self, params: Sequence[int]) -> dict[str, int]:
        env: dict[str, int] = {}
        for dst, op, *ops in self.program:
            env[dst] = _apply(op, [_operand(o, params, env) for o in ops])
        return env

    def resolve(self, params: Sequence[int]) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, ...]]:
        """(grid, block, explicit kernel-argument values) for these host parameters."""
        if len(params) != len(self.params):
            raise LaunchRecordError(f"{self.kernel}: {len(params)} host parameters given, record has {len(self.params)}")
        env = self._eval(params)
        val = lambda x: _operand(x, params, env)  # noqa: E731

        grid = tuple(val(x) for x in self.grid)
        block = tuple(val(x) for x in self.block)
        kargs = tuple(val(x) for x in self.kernel_args)
        return grid, block, kargs  # type: ignore[return-value]

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


def _operand(x, params: Sequence[int], env: Mapping[str, int]):
    if isinstance(x, int) or x in _WIDTH:
        return x  # a literal, or a type name (ops carry their width)
    if x.startswith("p"):
        return params[int(x[1:])]
    return env[x]


_WIDTH = {"i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64}


def _wrap(v: int, bits: int) -> int:
    """Two's-complement wrap to ``bits`` and read back as signed."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if bits > 1 and v >> (bits - 1) else v


def _apply(op: str, a: list) -> int:
    # Each op carries its result width as the last operand (e.g. ["add", x, y, "i32"]).
    *xs, ty = a
    bits = _WIDTH[ty]
    if op == "add":
        r = xs[0] + xs[1]
    elif op == "sub":
        r = xs[0] - xs[1]
    elif op == "mul":
        r = xs[0] * xs[1]
    elif op == "sdiv":
        if xs[1] == 0:
            raise LaunchRecordError("division by zero in a grid program")
        q = abs(xs[0]) // abs(xs[1])
        r = q if (xs[0] >= 0) == (xs[1] >= 0) else -q
    elif op == "srem":
        if xs[1] == 0:
            raise LaunchRecordError("division by zero in a grid program")
        r = xs[0] - xs[1] * int(xs[0] / xs[1])
    elif op == "and":
        r = xs[0] & xs[1]
    elif op == "or":
        r = xs[0] | xs[1]
    elif op == "xor":
        r = xs[0] ^ xs[1]
    elif op == "select":
        r = xs[1] if xs[0] & 1 else xs[2]
    elif op in ("sext", "trunc"):
        r = xs[0]
    elif op == "zext":
        src_bits = _WIDTH[xs[1]]
        r = xs[0] & ((1 << src_bits) - 1)
    elif op.startswith("icmp_"):
        pred = op[5:]
        x, y = xs[0], xs[1]
        r = int({"eq": x == y, "ne": x != y, "slt": x < y, "sle": x <= y, "sgt": x > y,
                 "sge": x >= y}[pred])
        return r
    else:
        raise LaunchRecordError(f"unknown op {op!r} in a grid program")
    return _wrap(r, bits)
