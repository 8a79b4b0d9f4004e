"""Deliberately broken records, for showing that the runtime or the parity tier refuses them.

Two ways a record can be wrong:

* **the lock alone** is edited (a lock from another build, or hand-edited): it no
  longer agrees with the action-cache record its entry names -- the runtime's job
  (``runtime.record_binding.RecordBinding``);
* **the lock and the store agree on a wrong record** (the compiler side wrote it
  wrongly): only an independent oracle can tell -- the parity tier's job.

:func:`edit_lock` makes the first; :func:`rewrite_store` the second (a copy of the
store with some records rewritten, and the lock pointing at the rewritten records).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from gemmar_aot.model.lock import Lock
from gemmar_aot.model.types import LaunchEntry
from gemmar_aot.store.record import record_digest
from gemmar_aot.model.launch import LaunchRecord

EntryEdit = Callable[[LaunchEntry], LaunchEntry]


def edit_lock(lock: Lock, where: Callable, edit: Callable) -> Lock:
    """``lock`` with ``edit(tuple, rank_launches) -> rank_launches`` applied where ``where(tuple, rank)``."""
    tuples = []
    for t in lock.tuples:
        ranks = tuple(edit(t, r) if where(t, r.rank) else r for r in t.ranks)
        tuples.append(replace(t, ranks=ranks))
    return replace(lock, tuples=tuple(tuples))


def map_entries(fn: EntryEdit, *, kinds: tuple[str, ...]) -> Callable:
    """An ``edit`` for :func:`edit_lock` applying ``fn`` to the launch entries of the given kinds."""
    def edit(_t, r):
        def one(e: LaunchEntry) -> LaunchEntry:
            return fn(e) if e.kind in kinds else e
        return replace(r, launches=tuple(one(e) for e in r.launches), self_test=tuple(one(e) for e in r.self_test))
    return edit


def swap_kernel_args(rec: LaunchRecord, i: int, j: int) -> LaunchRecord:
    ka = list(rec.kernel_args)
    ka[i], ka[j] = ka[j], ka[i]
    return replace(rec, kernel_args=tuple(ka))


def rewrite_store(src_root: Path, dst_root: Path, lock: Lock, rewrite: dict[str, Callable[[dict], dict]]) -> Lock:
    """Copy every kernel ``lock`` names into a new store at ``dst_root``, records of the keys in
    ``rewrite`` passed through their function; return the lock made to agree with the new
    records (their digests, blobs and launch records), as a build that wrote them would."""
    from gemmar_aot.store import Store
    from gemmar_aot.store.backend import RESERVED_FIELDS

    src, dst = Store(src_root, readonly=True), Store(dst_root)
    new: dict[str, LaunchEntry] = {}
    for key, entry in lock.kernels().items():
        rec, code = src.load(key)
        if key in rewrite:
            rec = rewrite[key](dict(rec))
        fields = {k: v for k, v in rec.items() if k not in RESERVED_FIELDS}
        stored = dst.put(key, code, fields, launcher=src.load_blob(rec["launcher"]["hash"], rec["launcher"]["size"]))
        if key in rewrite:
            new[key] = replace(entry, launch=LaunchRecord.from_json(stored["launch"]),
                               record=record_digest(stored))
    return edit_lock(lock, lambda _t, _r: True,
                     lambda _t, r: replace(r, launches=tuple(new.get(e.key, e) for e in r.launches),
                                           self_test=tuple(new.get(e.key, e) for e in r.self_test)))
