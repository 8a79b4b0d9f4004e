"""Synthetic, valid lock files (typed) for tests that need a lock but no compile.

The blobs are whatever the caller stored (e.g. random bytes); the launch records are
small but well-formed; windows come from ``window_layout``.
"""

from __future__ import annotations

import hashlib

from gemmar_aot.model.layout import window_layout
from gemmar_aot.model.layout import CallLayout, WindowLayout
from gemmar_aot.model.lock import Lock
from gemmar_aot.model.types import Digest, LaunchEntry, LockTuple, ManifestRef, RankLaunches, ToolchainInfo, TupleId
from gemmar_aot.model.launch import LaunchRecord

PHASE_RECORD = {
    "kernel": "phase_0", "params": ["i64", "i64", "stream"],
    "args": [{"name": "dev_comm", "kind": "i64", "params": [0], "dtype": ""},
             {"name": "win", "kind": "i64", "params": [1], "dtype": ""},
             {"name": "stream", "kind": "stream", "params": [2], "dtype": ""}],
    "kernel_args": ["p0", "p1"], "kernel_arg_types": ["i64", "i64"], "program": [],
    "grid": [4, 1, 1], "block": [512, 1, 1], "stream_param": 2,
}


def launch_record(kernel: str = "phase_0") -> LaunchRecord:
    return LaunchRecord.from_json({**PHASE_RECORD, "kernel": kernel})


def window(world: int, n: int, m_max: int, m: int, gather_dtype: str = "bf16",
           gather_transport: str = "lsa") -> WindowLayout:
    lay = window_layout(world, n, m_max, 128, gather_dtype, gather_transport, m_pad=m)
    if isinstance(lay, WindowLayout):
        return lay
    call_fields = set(CallLayout.__dataclass_fields__)
    shared = {k: v for k, v in lay.items() if k not in call_fields}
    return WindowLayout(**shared, call=CallLayout(**{k: lay[k] for k in call_fields}))


def entry(n: int, blob: Digest | None = None, kind: str = "reduce") -> LaunchEntry:
    """A launch entry whose action key and record digest are derived from ``n``."""
    h = lambda s: hashlib.sha256(f"{s}{n}".encode()).hexdigest()  # noqa: E731
    return LaunchEntry(kind=kind, key=h("key"), blob=blob or Digest(h("blob"), 100 + n),
                       launch=launch_record(f"{kind}_{n % 3}"), record=Digest(h("record"), 1000 + n))


def synthetic_lock(blobs: list[Digest] | None = None, *, ms=(256, 512), world: int = 2, n: int = 1024,
                   k: int = 256, wires=(("bf16", "lsa"), ("fp8", "lsa")), name: str = "synth",
                   manifest_sha256: str = "ab" * 32) -> Lock:
    """A lock with one tuple per (wire, M), ``world`` ranks of 3 launches and 2 self-test kernels.

    Launch entries cycle through ``blobs`` when given (so blobs are shared, as in a real lock).
    """
    tuples, i = [], 0
    for gd, gt in wires:
        if gd == "fp8" and n % 1024:
            continue
        for m in ms:
            ranks = []
            for r in range(world):
                es = []
                for _ in range(5):
                    b = blobs[i % len(blobs)] if blobs else None
                    es.append(entry(i, b, kind="gemm" if not es else "reduce"))
                    i += 1
                ranks.append(RankLaunches(r, tuple(es[:3]), tuple(es[3:])))
            tid = TupleId("fused-sdma", m, n, k, world, "blockscale", gd, gt)
            tuples.append(LockTuple(tid, f"{name}.toml:tuple[0] (line 3)", window(world, n, max(ms), m, gd, gt),
                                    tuple(ranks)))
    return Lock(
        manifest=ManifestRef(name, "gfx950", manifest_sha256), arch="gfx950", code_object_version=5,
        toolchain=ToolchainInfo("cd" * 32, {"toolchain": {"python": "3.11.7"}, "generator": {}, "compiler": {}}),
        env={"MORI_GEMM_AR_PULL_BLOCKS": None}, tuples=tuple(tuples))
