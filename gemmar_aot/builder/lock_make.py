"""The lock a build writes: the plan's tuples and EP entries, each rank's launches in order,
made from the action-cache records of their kernels. Deterministic: the same plan, keys,
records and toolchain give the same lock."""

from __future__ import annotations

from pathlib import Path

from gemmar_aot.compiler.keys import toolchain_ingredients
from gemmar_aot.model.hipcc import CodeObjectEntry, LockHipcc
from gemmar_aot.model.jitv2 import HIPCC_IDENTITY, JitV2Variant
from gemmar_aot.model.jitv2_lock import LockJitV2
from gemmar_aot.model.launch import LaunchRecord
from gemmar_aot.model.lock import Lock
from gemmar_aot.model.types import LaunchEntry, LockEp, LockTuple, ManifestRef, RankLaunches, ToolchainInfo
from gemmar_aot.store.backend import record_blob
from gemmar_aot.store.record import record_digest


def launch_entry(kind: str, key: str, rec: dict) -> LaunchEntry:
    """The lock's entry for one kernel, made from its action-cache record ``rec``."""
    return LaunchEntry(kind=kind, key=key, blob=record_blob(rec),
                       launch=LaunchRecord.from_json(rec["launch"]), record=record_digest(rec))


def make_lock(plan, manifest, keys: dict[str, str], records: dict[str, dict], fp: dict) -> Lock:
    """The runtime's entry point: every tuple and rank -> ordered launches. Deterministic."""
    entries: dict[object, LaunchEntry] = {}

    def entry(spec) -> LaunchEntry:
        e = entries.get(spec)  # by the spec itself: its spec_id hashes canonical JSON, once per spec
        if e is None:
            sid = spec.spec_id
            e = entries[spec] = launch_entry(spec.kind, keys[sid], records[sid])
        return e

    tuples = []
    for t in plan.tuples:
        w = t.workload
        tuples.append(LockTuple(
            id=w.identity(),
            source=w.source.replace(str(manifest.path), Path(manifest.path).name),
            layout=None if t.layout is None else t.layout.window,
            ranks=tuple(RankLaunches(r.rank, tuple(entry(s) for s in r.launches),
                                     tuple(entry(s) for s in r.self_test)) for r in t.ranks),
        ))
    eps = tuple(LockEp(config=e.entry.config, source=e.entry.source.replace(str(manifest.path),
                                                                            Path(manifest.path).name),
                       arena=e.arena, ranks=tuple(RankLaunches(r.rank, tuple(entry(s) for s in r.launches), ())
                                                  for r in e.ranks))
                for e in plan.eps)
    hipcc = tuple(LockHipcc(v, h.entry.source.replace(str(manifest.path), Path(manifest.path).name),
                            code_object_entry(v.source, keys[s.spec_id], records[s.spec_id]))
                  for h in plan.hipcc for v, s in zip(h.entry.variants, h.specs))
    jitv2 = tuple(LockJitV2(u["plan"], JitV2Variant(u["arch"], u["nic"]), records[s.spec_id]["mori_cache_entry"],
                            HIPCC_IDENTITY, j.entry.source.replace(str(manifest.path), Path(manifest.path).name),
                            code_object_entry(u["plan"], keys[s.spec_id], records[s.spec_id]))
                  for j in plan.jitv2 for u, s in zip(j.units, j.specs))
    return Lock(
        manifest=ManifestRef(manifest.name, manifest.arch, manifest.sha256),
        arch=manifest.arch,
        code_object_version=fp["target"]["code_object_version"],
        toolchain=ToolchainInfo(fp["digest"], toolchain_ingredients(fp), fp.get("profile")),
        env=dict(plan.env),
        tuples=tuple(tuples),
        eps=eps,
        hipcc=hipcc,
        jitv2=jitv2,
    )


def code_object_entry(kind: str, key: str, rec: dict) -> CodeObjectEntry:
    """The lock's entry for a code object mori loads whole (``kind``: its spec's, mori's source name),
    made from its record."""
    return CodeObjectEntry(kind, key, record_blob(rec), record_digest(rec), tuple(rec["metadata"]["kernels"]))
