"""Launch sequences in a form two processes can compare, and the comparison.

A launch as the HIP double recorded it carries raw addresses. Each explicit
argument (offset, size, kind from the code object's own metadata note, read by
the double) is decoded from the argument bytes; every 8-byte value that lies in
a named region of that side's address map (window, operands) becomes
``"region+offset"``, and one equal to a named handle (dev comm, window handle)
becomes its name. Global-buffer pointers that map nowhere stay raw, so they can
never compare equal across processes by accident. The argument bytes are then
compared with those fields masked, so padding and every by-value byte count too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CanonicalLaunch:
    digest: str
    kernel: str
    grid: tuple
    block: tuple
    shared_mem: int
    stream: str
    args: tuple  # per explicit argument: an int, or a symbol ("window+6016", "dev_comm", "a@256+0")
    masked_kernarg: str  # hex of the argument bytes with the symbolised fields zeroed

    def short(self) -> str:
        return (f"{self.kernel} [{self.digest[:12]}] grid={list(self.grid)} block={list(self.block)} "
                f"lds={self.shared_mem} stream={self.stream} args={list(self.args)}")


def launch_json(rec) -> dict:
    """A hipstub.Launch as JSON (what the oracle process writes and the candidate side builds alike)."""
    return {"digest": rec.digest, "kernel": rec.kernel, "grid": list(rec.grid), "block": list(rec.block),
            "shared_mem": rec.shared_mem, "stream": rec.stream, "via_extra": rec.via_extra,
            "kernarg": rec.kernarg.hex(), "args": [list(a) for a in rec.args]}


def symbol(value: int, amap: dict, *, pointer: bool) -> str | None:
    for name, handle in amap["handles"].items():
        if name != "stream" and value == handle and not pointer:
            return name
    for name, (base, size) in amap["regions"].items():
        if base <= value < base + size:
            return f"{name}+{value - base}"
    return None


def canonical(launch: dict, amap: dict) -> CanonicalLaunch:
    kernarg = bytearray.fromhex(launch["kernarg"])
    args: list[Any] = []
    for off, size, kind in launch["args"]:
        if kind == "hidden":
            continue
        raw = int.from_bytes(kernarg[off:off + size], "little")
        sym = symbol(raw, amap, pointer=kind == "global_buffer") if size == 8 else None
        if sym is not None:
            kernarg[off:off + size] = bytes(size)
            args.append(sym)
        elif kind == "global_buffer":
            args.append(f"unmapped pointer {raw:#x}")
        else:
            args.append(raw)
    stream = launch["stream"]
    stream_sym = ("current stream" if stream == amap["handles"]["stream"] else
                  "null stream" if stream == 0 else f"unknown stream {stream:#x}")
    return CanonicalLaunch(launch["digest"], launch["kernel"], tuple(launch["grid"]), tuple(launch["block"]),
                           int(launch["shared_mem"]), stream_sym, tuple(args), bytes(kernarg).hex())


def canonical_sequence(result: dict) -> list[CanonicalLaunch]:
    return [canonical(launch, result["address_map"]) for launch in result["launches"]]


def differences(oracle: list[CanonicalLaunch], candidate: list[CanonicalLaunch]) -> list[tuple[int, list[str]]]:
    """Per differing launch index: what differs (field names), in order."""
    out = []
    for i in range(max(len(oracle), len(candidate))):
        if i >= len(oracle) or i >= len(candidate):
            out.append((i, ["missing"]))
            continue
        a, b = oracle[i], candidate[i]
        fields = [f for f in ("digest", "kernel", "grid", "block", "shared_mem", "stream", "args", "masked_kernarg")
                  if getattr(a, f) != getattr(b, f)]
        if fields:
            out.append((i, fields))
    return out


def explain(oracle: list[CanonicalLaunch], candidate: list[CanonicalLaunch], limit: int = 6) -> str:
    diffs = differences(oracle, candidate)
    if not diffs:
        return "identical"
    lines = [f"{len(diffs)} of {max(len(oracle), len(candidate))} launches differ "
             f"(oracle {len(oracle)}, candidate {len(candidate)} launches):"]
    for i, fields in diffs[:limit]:
        lines.append(f"  #{i}: {', '.join(fields)}")
        lines.append(f"    oracle:    {oracle[i].short() if i < len(oracle) else '-'}")
        lines.append(f"    candidate: {candidate[i].short() if i < len(candidate) else '-'}")
    if len(diffs) > limit:
        lines.append(f"  ... and {len(diffs) - limit} more")
    return "\n".join(lines)
