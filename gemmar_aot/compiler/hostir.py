"""Read a launch record out of the host function FlyDSL lowered for a launcher.

The lowered module holds ``gpu.binary @kernels [...]`` and one ``llvm.func`` whose
body computes grid and block from its parameters and ends in
``gpu.launch_func <stream> @kernels::@name blocks in (...) threads in (...) args(...)``.
We copy that computation -- not re-derive it -- into a :class:`LaunchRecord`.
Anything we do not understand is an error: a silent guess here would launch a
kernel with the wrong grid.
"""

from __future__ import annotations

import re

from gemmar_aot.model.launch import LaunchRecord, RuntimeArg

_FUNC = re.compile(r"^\s*llvm\.func @(?P<name>[\w.$-]+)\((?P<sig>.*)\)(?: attributes \{.*\})? \{\s*$")
_ASSIGN = re.compile(r"^\s*(?P<res>%\d+) = (?P<op>[\w.]+)(?P<rest>.*)$")
_LAUNCH = re.compile(
    r"^\s*gpu\.launch_func <(?P<stream>%\w+) : !llvm\.ptr> @kernels::@(?P<kernel>[\w.$-]+) "
    r"blocks in \((?P<grid>[^)]*)\) threads in \((?P<block>[^)]*)\) : i64"
    r"(?: args\((?P<args>.*)\))?\s*$"
)

TYPE_KINDS = {
    "!llvm.ptr<1>": "ptr",
    "!llvm.struct<packed (struct<packed (i32)>)>": "len32",
    "i32": "i32",
    "i64": "i64",
    "!llvm.ptr": "stream",
}


class HostIRError(ValueError):
    """The host IR has a shape this reader does not know; the record cannot be trusted."""


def _split_top(s: str) -> list[str]:
    """Split on commas that are not inside (), <> or []."""
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _host_function(ir_text: str) -> tuple[str, list[str], list[str]]:
    lines = ir_text.splitlines()
    for i, line in enumerate(lines):
        m = _FUNC.match(line)
        if not m:
            continue
        sig = []
        for part in _split_top(m.group("sig")):
            name, _, ty = part.partition(":")
            sig.append(ty.strip())
        body = []
        for line2 in lines[i + 1 :]:
            if line2.strip() == "}":
                break
            body.append(line2)
        return m.group("name"), sig, body
    raise HostIRError("no llvm.func host launcher found in the lowered module")


_BINOPS = {"llvm.add": "add", "llvm.sub": "sub", "llvm.mul": "mul", "llvm.sdiv": "sdiv",
           "llvm.srem": "srem", "llvm.and": "and", "llvm.or": "or", "llvm.xor": "xor"}


def read_launch_record(ir_text: str, arg_names: list[str], arg_kinds: list[tuple[str, str]]) -> LaunchRecord:
    """Build the record for the single launch in ``ir_text``.

    ``arg_names``/``arg_kinds`` describe the Python-level launcher's arguments in
    call order (kind in "tensor", "int", "stream", with the tensor dtype); each is
    matched against the host function's parameter types, which is a check, not
    an assumption: a mismatch raises.
    """
    _name, sig, body = _host_function(ir_text)
    params = []
    for ty in sig:
        kind = TYPE_KINDS.get(ty)
        if kind is None:
            raise HostIRError(f"host parameter type {ty!r} is not one this reader knows")
        params.append(kind)
    args = _launcher_args(params, arg_names, arg_kinds)
    values: dict[str, str | int] = {f"%arg{i}": f"p{i}" for i in range(len(params))}
    program, launch = _evaluate(body, values)

    def ref(tok: str):
        tok = tok.strip()
        if tok not in values:
            raise HostIRError(f"launch operand {tok} is not defined in the host function")
        return values[tok]

    grid = tuple(ref(t) for t in launch.group("grid").split(","))
    block = tuple(ref(t) for t in launch.group("block").split(","))
    kargs, ktypes = [], []
    for part in _split_top(launch.group("args") or ""):
        tok, _, ty = part.partition(" : ")
        kind = TYPE_KINDS.get(ty.strip())
        if kind is None or kind == "stream":
            raise HostIRError(f"kernel argument type {ty!r} is not one this reader knows")
        kargs.append(ref(tok))
        ktypes.append(kind)
    stream_ref = ref(launch.group("stream"))
    if not (isinstance(stream_ref, str) and stream_ref.startswith("p")):
        raise HostIRError("the launch stream is not a host parameter")

    program = _live_slice(program, list(grid) + list(block) + kargs)
    return LaunchRecord(
        kernel=launch.group("kernel"),
        params=tuple(params),
        args=tuple(args),
        kernel_args=tuple(kargs),  # type: ignore[arg-type]
        kernel_arg_types=tuple(ktypes),
        program=tuple(program),
        grid=grid,  # type: ignore[arg-type]
        block=block,  # type: ignore[arg-type]
        stream_param=int(stream_ref[1:]),
    )


def _launcher_args(params: list[str], arg_names: list[str], arg_kinds: list[tuple[str, str]]) -> list[RuntimeArg]:
    """The launcher's arguments mapped onto the host parameters (a tensor takes a pointer and a
    length); raises HostIRError when one does not fit its parameters' types."""
    args, p = [], 0
    for name, (kind, dtype) in zip(arg_names, arg_kinds):
        if kind == "tensor":
            if params[p : p + 2] != ["ptr", "len32"]:
                raise HostIRError(f"argument {name!r} is a tensor but host params {p}.. are {params[p:p+2]}")
            args.append(RuntimeArg(name, "tensor", (p, p + 1), dtype))
            p += 2
        elif kind == "int":
            if p >= len(params) or params[p] not in ("i32", "i64"):
                raise HostIRError(f"argument {name!r} is an integer but host param {p} is {params[p:p+1]}")
            args.append(RuntimeArg(name, params[p], (p,)))
            p += 1
        elif kind == "stream":
            if p >= len(params) or params[p] != "stream":
                raise HostIRError(f"argument {name!r} is the stream but host param {p} is {params[p:p+1]}")
            args.append(RuntimeArg(name, "stream", (p,)))
            p += 1
        else:
            raise HostIRError(f"argument {name!r} has unknown kind {kind!r}")
    if p != len(params):
        raise HostIRError(f"launcher arguments fill {p} host parameters, the host function has {len(params)}")
    return args


def _evaluate(body: list[str], values: dict[str, str | int]) -> tuple[list[tuple], re.Match]:
    """The host function's body as a program (``values`` gains each result's name) and its one
    launch; raises HostIRError on anything else."""
    program: list[tuple] = []
    launch = None
    for line in body:
        s = line.strip()
        if not s or s == "llvm.return":
            continue
        lm = _LAUNCH.match(line)
        if lm:
            if launch is not None:
                raise HostIRError("more than one gpu.launch_func in the host function")
            launch = lm
            continue
        am = _ASSIGN.match(line)
        if not am:
            raise HostIRError(f"unexpected host IR line: {s[:160]}")
        res, op, rest = am.group("res"), am.group("op"), am.group("rest").strip()
        if op == "llvm.mlir.constant":
            cm = re.match(r"^\((?P<v>-?\d+|true|false)(?: : \w+)?\) : (?P<t>\w+)$", rest)
            if not cm:
                raise HostIRError(f"unsupported constant: {s[:160]}")
            v = cm.group("v")
            values[res] = 1 if v == "true" else 0 if v == "false" else int(v)
            continue
        vid = f"v{len(program)}"
        program.append(_instruction(vid, op, rest, values, s))
        values[res] = vid
    if launch is None:
        raise HostIRError("no gpu.launch_func in the host function")
    return program, launch


def _instruction(vid: str, op: str, rest: str, values: dict, line: str) -> tuple:
    """One host IR operation as a program instruction writing ``vid``."""
    if op in _BINOPS:
        m = re.match(r"^(%\w+), (%\w+) : (\w+)$", rest)
        if not m:
            raise HostIRError(f"unsupported operands: {line[:160]}")
        return (vid, _BINOPS[op], values[m.group(1)], values[m.group(2)], m.group(3))
    if op == "llvm.icmp":
        m = re.match(r'^"(\w+)" (%\w+), (%\w+) : (\w+)$', rest)
        if not m or m.group(1) not in ("eq", "ne", "slt", "sle", "sgt", "sge"):
            raise HostIRError(f"unsupported compare: {line[:160]}")
        return (vid, f"icmp_{m.group(1)}", values[m.group(2)], values[m.group(3)], "i1")
    if op == "llvm.select":
        m = re.match(r"^(%\w+), (%\w+), (%\w+) : i1, (\w+)$", rest)
        if not m:
            raise HostIRError(f"unsupported select: {line[:160]}")
        return (vid, "select", values[m.group(1)], values[m.group(2)], values[m.group(3)], m.group(4))
    if op in ("llvm.sext", "llvm.zext", "llvm.trunc"):
        m = re.match(r"^(%\w+) : (\w+) to (\w+)$", rest)
        if not m:
            raise HostIRError(f"unsupported cast: {line[:160]}")
        if op == "llvm.zext":
            return (vid, "zext", values[m.group(1)], m.group(2), m.group(3))
        return (vid, op[5:], values[m.group(1)], m.group(3))
    raise HostIRError(f"host op {op!r} is not one this reader evaluates: {line[:160]}")


def _live_slice(program: list[tuple], roots: list) -> list[tuple]:
    """Keep only the instructions the launch actually uses."""
    need = {r for r in roots if isinstance(r, str) and r.startswith("v")}
    keep = []
    for ins in reversed(program):
        if ins[0] in need:
            keep.append(ins)
            need.update(o for o in ins[2:] if isinstance(o, str) and o.startswith("v"))
    return list(reversed(keep))
