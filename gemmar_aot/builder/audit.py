"""Audit by reproduction: recompile a sample of what a cache served and compare the bytes.

A remote cache entry maps an action key to a record and a code object. Its digests prove the
bytes are the ones the entry names, not that they are what that key compiles to: a writer of
the cache can put a valid code object of another kernel, with a record claiming the key, under
any key, and every digest agrees. Bazel has no answer to that. Our builds are byte-reproducible
across machines and Pythons, so we have one: compile the key again, here, and compare.

- :func:`audit_tasks` compiles tasks in a scratch store (the store under audit is never
  written by the compile) and compares each fresh code object and record digest with what
  the entry claims. A difference is a :class:`Finding`: the key, both digests, and where the
  entry came from.
- :func:`sample` picks the keys to audit: a seeded, reported sample, so a run can be replayed.
- ``gemmar-aot audit LOCK`` audits a lock's kernels against its store; ``gemmar-aot build
  --audit-remote N`` audits N of the build's remote hits before trusting the rest (a finding
  distrusts all of them: they are compiled here, and the summary and the signed provenance
  say so).

Where an entry came from: a build that fetched from a remote appends the keys to the store's
``stats/remote-fetches.jsonl`` (:func:`note_fetches`); audit reports that origin.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from gemmar_aot.store.backend import record_blob
from gemmar_aot.store.record import record_digest

#: Beside the store's build stats: one JSON line per key fetched from a remote cache.
FETCHES_FILE = "remote-fetches.jsonl"


@dataclass(frozen=True)
class Finding:
    """An entry whose bytes are not what its key compiles to (or that could not be compiled)."""

    key: str
    label: str
    origin: str
    claimed_blob: str | None
    rebuilt_blob: str | None
    claimed_record: str | None
    rebuilt_record: str | None
    problem: str
    #: "poisoned": the bytes are not what the key compiles to; "unverifiable": the entry could not be
    #: compared (no readable record, no valid spec, no compile here) -- quarantined alike.
    kind: str = "poisoned"

    def describe(self) -> str:
        return (f"{self.kind.upper()} {self.label} (key {self.key[:16]}, from {self.origin}): {self.problem}; code object "
                f"claimed {str(self.claimed_blob)[:16]}, rebuilt {str(self.rebuilt_blob)[:16]}; record claimed "
                f"{str(self.claimed_record)[:16]}, rebuilt {str(self.rebuilt_record)[:16]}")

    def to_json(self) -> dict:
        return asdict(self)


def sample(keys: Iterable[str], n: int | None, seed: int | None) -> tuple[list[str], int]:
    """(the keys to audit, the seed used): all of them when ``n`` is None or covers them, else ``n``
    picked by ``random.Random(seed)`` over the sorted keys; a fresh seed when none is given."""
    keys = sorted(set(keys))
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "big")
    if n is None or n >= len(keys):
        return keys, seed
    return sorted(random.Random(seed).sample(keys, n)), seed


def audit_tasks(tasks: Sequence[Any], claimed: Mapping[str, Mapping[str, Any]], origins: Mapping[str, str], *,
                executor: Any, costs: Any = None, progress: bool = False,
                scratch_parent: str | os.PathLike | None = None, toolchain: Any = None) -> dict:
    """Compile ``tasks`` (``compiler.scheduler.Task``) into a scratch store and compare each with
    ``claimed[key]``: ``{"blob": sha256, "record": Digest or its hash}``. Returns a report:
    ``audited`` (keys compiled and compared), ``findings`` (:class:`Finding`), ``seconds``."""
    from gemmar_aot.compiler.scheduler import compile_all

    t0 = time.perf_counter()
    findings: list[Finding] = []
    with tempfile.TemporaryDirectory(prefix="gemmar-aot-audit-", dir=scratch_parent) as scratch:
        results = compile_all(tasks, scratch, executor=executor, costs=costs, progress=progress,
                              toolchain=toolchain) if tasks else []
    by_spec = {t.spec: t for t in tasks}
    for spec, res in results:
        task = by_spec[spec]
        want = claimed[task.key]
        want_blob = want.get("blob")
        want_rec = want.get("record")
        want_rec = getattr(want_rec, "hash", want_rec)
        origin = origins.get(task.key, "unknown")
        if not res.ok:
            findings.append(Finding(task.key, spec.label(), origin, want_blob, None, want_rec, None,
                                    f"it does not compile here: {res.error.splitlines()[0] if res.error else '?'}",
                                    "unverifiable"))
            continue
        got_blob = record_blob(res.record).hash
        got_rec = record_digest(res.record).hash
        if got_blob != want_blob or (want_rec is not None and got_rec != want_rec):
            what = ("another code object than this key compiles to" if got_blob != want_blob
                    else "the same code object with another record (launch or metadata)")
            findings.append(Finding(task.key, spec.label(), origin, want_blob, got_blob, want_rec, got_rec, what))
    return {"audited": len(results), "findings": findings, "seconds": round(time.perf_counter() - t0, 3)}


def note_fetches(stats_dir: Path, remote: str, keys: Iterable[str]) -> None:
    """Remember that ``keys`` came from ``remote`` (credentials never in ``remote``: the backend's
    name). Appended, one line per key; a failure to write only loses the origin."""
    keys = list(keys)
    if not keys:
        return
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = "".join(json.dumps({"key": k, "remote": remote, "time": now}, sort_keys=True) + "\n" for k in keys)
    try:
        stats_dir.mkdir(parents=True, exist_ok=True)
        with open(stats_dir / FETCHES_FILE, "a", encoding="utf-8") as f:
            f.write(lines)
    except OSError:
        pass


def fetch_origins(stats_dir: Path) -> dict[str, str]:
    """key -> "remote cache URL (fetched TIME)" for every key a build fetched into this store (the
    latest fetch wins); a key not here was compiled here or arrived otherwise."""
    out: dict[str, str] = {}
    try:
        text = (stats_dir / FETCHES_FILE).read_text(encoding="utf-8")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            d = json.loads(line)
            out[d["key"]] = f"remote cache {d['remote']} (fetched {d['time']})"
        except (ValueError, KeyError, TypeError):
            continue
    return out


def audit_lock(lock_path: str | os.PathLike, *, store: str | os.PathLike | None = None, n: int | None = None,
               seed: int | None = None, jobs: int | None = None, toolchain_root: str | None = None,
               progress: bool = False) -> dict:
    """Recompile ``n`` (None: all) of the kernels the lock at ``lock_path`` names, with the toolchain
    it was built with, in a scratch store, and compare each with the lock's digests. A finding is
    quarantined in ``store`` (default: the lock's own store), so the next build compiles it."""
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.compiler.scheduler import LocalExecutor, Task
    from gemmar_aot.util.errors import GemmarError
    from gemmar_aot.compiler.keys import action_key, ingredients
    from gemmar_aot.model.spec import KernelSpec
    from gemmar_aot.store import Store, default_store_root
    from gemmar_aot.toolchain import load_toolchain

    lock_path = Path(lock_path)
    lock = read_lock(lock_path)
    root = Path(store) if store is not None else (
        lock_path.parent.parent if lock_path.parent.name == "locks" else default_store_root(None))
    st = Store(root)
    tc = load_toolchain(toolchain_root, lock.toolchain.profile)
    fp = tc.fingerprint
    if fp["digest"] != lock.toolchain.digest:
        raise GemmarError(f"{lock_path} was built with toolchain {lock.toolchain.digest[:16]} (profile "
                          f"{lock.toolchain.profile or 'default'}), this machine's is {fp['digest'][:16]}: an audit "
                          f"compares bytes, so it needs the same toolchain (gemmar-aot doctor shows what differs)")
    kernels = lock.kernels()
    picked, seed = sample(kernels, n, seed)
    origins = fetch_origins(st.stats_dir)
    findings: list[Finding] = []
    tasks, claimed = [], {}
    for key in picked:
        e = kernels[key]
        origin = origins.get(key, "this store (compiled here or imported)")
        rec = st.get_record(key, verify=True)
        spec = None
        if rec is not None:
            try:
                spec = KernelSpec.from_json(rec["spec"])
            except Exception as exc:  # noqa: BLE001 - a record that names no valid spec is a finding
                findings.append(Finding(key, e.kind, origin, e.blob.hash, None, e.record.hash, None,
                                        f"its record names no valid kernel spec ({exc})", "unverifiable"))
                continue
        if spec is None:
            findings.append(Finding(key, e.kind, origin, e.blob.hash, None, e.record.hash, None,
                                    "the store holds no readable record for it", "unverifiable"))
            continue
        ingr = ingredients(spec, fp)
        if action_key(ingr) != key:
            findings.append(Finding(key, spec.label(), origin, e.blob.hash, None, e.record.hash, None,
                                    f"its record's spec ({spec.label()}) has another action key, "
                                    f"{action_key(ingr)[:16]}: the record was not made for this key"))
            continue
        tasks.append(Task(spec, key, ingr))
        claimed[key] = {"blob": e.blob.hash, "record": e.record.hash}
    with LocalExecutor(jobs, toolchain_root=toolchain_root) as ex:
        rep = audit_tasks(tasks, claimed, {k: origins.get(k, "this store (compiled here or imported)") for k in claimed},
                          executor=ex, progress=progress, toolchain=tc)
    findings += rep["findings"]
    quarantined = []
    for f in findings:
        if st.record_path(f.key).exists() and st.quarantine(st.record_path(f.key), f.describe()) is not None:
            quarantined.append(f.key)
    return {"lock": str(lock_path), "store": str(root), "kernels": len(kernels), "sampled": len(picked),
            "seed": seed, "audited": rep["audited"], "seconds": rep["seconds"],
            "findings": [f.to_json() for f in findings], "quarantined": quarantined, "ok": not findings}


def audit_remote_hits(found: dict, spec_of: dict, ingr: dict, ids: dict, st, session, *, n: int,
                       seed: int | None, jobs: int | None, toolchain_root: str | None, costs, progress: bool,
                       trace) -> dict:
    """Audit ``n`` of the remote hits ``found`` (key -> record, already in the local store). A
    finding quarantines that entry, and distrusts every remote hit of the build: their local
    copies are quarantined too, so the caller compiles them.

    The audit compiles on this machine in workers of its own, closed after it: a compile
    worker must compile a spec at most once (FlyDSL keeps what it compiled in the process and
    would hand the build's second compile of that spec no artifact)."""
    from gemmar_aot.compiler.scheduler import LocalExecutor, Task
    from gemmar_aot.compiler.trace import maybe_phase

    picked, seed = sample(found, n, seed)
    tasks = [Task(spec_of[k], k, ingr[ids[spec_of[k]]]) for k in picked]
    claimed = {k: {"blob": record_blob(found[k]).hash, "record": record_digest(found[k]).hash} for k in picked}
    origin = f"remote cache {session.backend.name}"
    with maybe_phase(trace, "audit remote hits", kernels=len(tasks)), \
            LocalExecutor(min(jobs or len(tasks), len(tasks)), toolchain_root=toolchain_root, costs=costs) as ex:
        rep = audit_tasks(tasks, claimed, dict.fromkeys(picked, origin), executor=ex, costs=costs,
                          progress=progress)
    distrusted = []
    if rep["findings"]:
        bad = {f.key: f for f in rep["findings"]}
        for k in sorted(found):
            why = (bad[k].describe() if k in bad else
                   f"distrusted: {origin} served a poisoned entry in the same build ({next(iter(bad))[:16]})")
            st.quarantine(st.record_path(k), why)
            distrusted.append(k)
    return {"sampled": len(picked), "of": len(found), "seed": seed, "audited": rep["audited"],
            "seconds": rep["seconds"], "findings": [f.to_json() for f in rep["findings"]],
            "distrusted": len(distrusted), "distrusted_keys": distrusted, "specs": spec_of}
