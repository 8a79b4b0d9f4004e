"""A lock's ``jitv2`` items: the code objects of mori's JIT v2 kernels the build made
(:mod:`gemmar_aot.model.jitv2`), each the plan, where it serves, mori's cache entry for it and its
kernel. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gemmar_aot.model.hipcc import ARCHS, NICS, CodeObjectEntry
from gemmar_aot.model.jitv2 import PLANS, JitV2Variant, cache_tag


@dataclass(frozen=True)
class LockJitV2:
    """One built JIT v2 code object: the plan, where it serves, mori's cache entry for it (relative to
    ``$MORI_JIT_CACHE_DIR``), the ``[[ep]]`` entry that asked for it, and its kernel."""

    plan: str
    variant: JitV2Variant
    cache_entry: str  # "<arch>_<nic>[_ccqe]/kernel.<plan>.<key24>"
    identity: str  # the hipcc --version line mori keyed it with
    source: str  # "manifest.toml:ep[0] (line 3)"
    entry: CodeObjectEntry

    def describe(self) -> str:
        return f"mori JIT v2 {self.plan} ({self.entry.symbols[0] if self.entry.symbols else '?'}) for " \
               f"{self.variant.describe()}"

    def to_json(self) -> dict:
        e = self.entry
        return {"plan": self.plan, "arch": self.variant.arch, "nic": self.variant.nic,
                "cache_entry": self.cache_entry, "identity": self.identity, "origin": self.source,
                "key": e.key, "blob": e.blob.to_json(), "record": e.record.to_json(), "symbols": list(e.symbols)}


#: The members of a lock's ``jitv2`` item.
LOCK_KEYS = ("plan", "arch", "nic", "cache_entry", "identity", "origin", "key", "blob", "record", "symbols")


def cache_entry_problem(plan: str, arch: str, nic: str, entry: str) -> str | None:
    """Why ``entry`` is not a cache entry mori would publish for ``plan`` on ``arch``/``nic`` (None: it is)."""
    tag, _, leaf = entry.partition("/")
    head, _, key = leaf.rpartition(".")
    if tag != cache_tag(arch, nic) or head != f"kernel.{plan}" or len(key) != 24 \
            or any(c not in "0123456789abcdef" for c in key):
        return f"is {entry!r}, not {cache_tag(arch, nic)}/kernel.{plan}.<24 hex digits>"
    return None


def read_lock_jitv2(reader: Any, v: Any, path: str) -> LockJitV2:
    """One ``jitv2`` item of a lock, checked with the lock reader's own checks (``reader``)."""
    reader.obj(v, path, LOCK_KEYS)
    plan, arch, nic = (reader.str(v[k], f"{path}.{k}") for k in ("plan", "arch", "nic"))
    for k, got, allowed in (("plan", plan, PLANS), ("arch", arch, ARCHS), ("nic", nic, NICS)):
        if got not in allowed:
            raise reader.fail(f"{path}.{k}", f"is {got!r}, none of {sorted(allowed)}")
    cache_entry = reader.str(v["cache_entry"], f"{path}.cache_entry")
    why = cache_entry_problem(plan, arch, nic, cache_entry)
    if why:
        raise reader.fail(f"{path}.cache_entry", why)
    syms = reader.list(v["symbols"], f"{path}.symbols")
    for i, s in enumerate(syms):
        reader.str(s, f"{path}.symbols[{i}]")
    entry = CodeObjectEntry(plan, reader.hex64(v["key"], f"{path}.key"), reader.digest(v["blob"], f"{path}.blob"),
                            reader.digest(v["record"], f"{path}.record"), tuple(syms))
    return LockJitV2(plan, JitV2Variant(arch, nic), cache_entry, reader.str(v["identity"], f"{path}.identity"),
                     reader.str(v["origin"], f"{path}.origin", empty=True), entry)
