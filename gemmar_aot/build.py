"""``gemmar-aot build``: manifest -> plan -> keys -> compile misses -> store -> lock file.

Validation happens before anything is started: the manifest (all errors at once)
and the toolchain (loaded and verified in this process, so a missing piece is one
clear error rather than a broken worker pool). Every spec gets its action key;
keys already in the store (blob present and verified) are hits and are not
compiled. Workers write each finished kernel into the store as it completes, under
a per-key lock, so an interrupted build keeps what it had and concurrent builders
compile each key once. The lock file is written last.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import defaultdict
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Sequence

from gemmar_aot.model.lock import Lock, lock_file_path, write_lock
from gemmar_aot.model.types import Digest, LaunchEntry, LockTuple, ManifestRef, RankLaunches, ToolchainInfo
from gemmar_aot.store.record import record_digest
from gemmar_aot.compiler.derive import DeriveError, is_current, rederive
from gemmar_aot.keys import action_key, ingredients, toolchain_ingredients
from gemmar_aot.launch import LaunchRecord
from gemmar_aot.store.record_index import build_index, index_path, lock_rank_groups, write_index


def _audit_remote_hits(found: dict, spec_of: dict, ingr: dict, ids: dict, st, session, *, n: int,
                       seed: int | None, jobs: int | None, toolchain_root: str | None, costs, progress: bool,
                       trace) -> dict:
    """Audit ``n`` of the remote hits ``found`` (key -> record, already in the local store). A
    finding quarantines that entry, and distrusts every remote hit of the build: their local
    copies are quarantined too, so the caller compiles them.

    The audit compiles on this machine in workers of its own, closed after it: a compile
    worker must compile a spec at most once (FlyDSL keeps what it compiled in the process and
    would hand the build's second compile of that spec no artifact)."""
    from gemmar_aot.audit import audit_tasks, sample
    from gemmar_aot.compiler.driver import LocalExecutor, Task
    from gemmar_aot.compiler.trace import maybe_phase

    picked, seed = sample(found, n, seed)
    tasks = [Task(spec_of[k], k, ingr[ids[spec_of[k]]]) for k in picked]
    claimed = {k: {"blob": found[k]["blob"]["digest"], "record": record_digest(found[k]).hash} for k in picked}
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


def _closure_keys(manifest, sha: str, profile: str, toolchain_digest: str, all_keys: set[str]) -> tuple[str, str]:
    """(exact, latest): the action keys of this build's closure entry and of its manifest's newest."""
    from gemmar_aot.closure import closure_key, latest_key
    from gemmar_aot.keys import derive_code_digest

    return (closure_key(manifest={"name": manifest.name, "sha256": sha}, profile=profile,
                        toolchain_digest=toolchain_digest, keys=all_keys, derive_code=derive_code_digest()),
            latest_key(manifest_name=manifest.name, profile=profile, toolchain_digest=toolchain_digest))


def _closure_lookup(session, closure_keys: tuple[str, str], manifest_sha: str, toolchain_digest: str,
                    all_keys: set[str], missing: list[str]) -> dict:
    """Ask for the closure when anything is missing locally (else only whether the remote holds
    it: then nothing needs backfilling and nothing uploading). The summary's ``closure``."""
    from gemmar_aot.closure import fetch_closure

    exact, latest = closure_keys
    if not missing:  # only whether the remote holds it; the build's first request, so its probe
        present = session.first_request(lambda: session.backend.client.head("ac", exact))
        return {"key": exact, "status": "local", "present": bool(present), "records": {}, "entries": 0}
    got = fetch_closure(session, exact=exact, latest=latest, all_keys=all_keys, need=set(missing),
                        manifest_sha256=manifest_sha,
                        toolchain_digest=toolchain_digest)
    return {"key": exact, **got.summary(), "present": got.status == "hit", "records": got.records}


def _rederive(st, writer, key: str, rec: dict) -> dict | None:
    """``rec`` derived again by this derive code from its blobs in ``st`` (written back through
    ``writer``), or None -- then the kernel is a miss and compiles: no launcher, a missing or
    damaged blob, or blobs this derive code refuses."""
    try:
        return rederive(st, key, rec, writer=writer)
    except DeriveError:
        return None


def launch_entry(kind: str, key: str, rec: dict) -> LaunchEntry:
    """The lock's entry for one kernel, made from its action-cache record ``rec``."""
    return LaunchEntry(kind=kind, key=key, blob=Digest(rec["blob"]["digest"], rec["blob"]["size"]),
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
    text = Path(manifest.path).read_bytes()
    return Lock(
        manifest=ManifestRef(manifest.name, manifest.arch, hashlib.sha256(text).hexdigest()),
        arch=fp["target"]["arch"],
        code_object_version=fp["target"]["code_object_version"],
        toolchain=ToolchainInfo(fp["digest"], toolchain_ingredients(fp), fp.get("profile")),
        env=dict(plan.env),
        tuples=tuple(tuples),
    )


class _EarlyOptimize:
    """``maint.optimize`` (train the zstd dictionary, repack) in a thread of the main process,
    started when 60% of the kernels are done, while the last, short ones compile.

    Workers read the dictionary pointer on every put, so kernels finished after the
    training are written with the dictionary and need no repack; after the last kernel only
    the few written while the training ran are repacked (60% > 1/2, so the final optimize
    does not retrain: see ``maint.optimize``'s retrain factor). Otherwise the whole repack,
    which grows with the number of kernels, sits on the critical path after the compile."""

    def __init__(self, store, trace):
        self.store, self.trace = store, trace
        self.thread = None
        self.info: dict | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        import threading

        self.thread = threading.Thread(target=self._run, name="gemmar-early-optimize", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from gemmar_aot.compiler.trace import maybe_phase
        from gemmar_aot.store import maint

        try:
            with maybe_phase(self.trace, "store optimize (during the last kernels)"):
                self.info = maint.optimize(self.store)
        except BaseException as exc:  # noqa: BLE001 - the final optimize runs anyway and reports
            self.error = exc

    def join(self) -> dict | None:
        if self.thread is not None:
            self.thread.join()
        return self.info


@contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def run_build(manifest_path: Path, *, store: Path | None = None, jobs: int | None = None,
              debug_locations: bool = False, only: tuple[str, ...] = (),
              shard: tuple[int, int] | None = None,
              remote: str | None = None, remote_read_only: bool = False, remote_required: bool = False,
              progress: bool = True, toolchain_root: str | None = None,
              trace_path: str | os.PathLike | None = None, executor=None,
              toolchain_profile: str | None = None, signers: Sequence[Any] = (),
              sign_expires: float | None = None, audit_remote: int = 0, audit_seed: int | None = None) -> dict:
    """Build ``manifest_path`` into the store; returns the summary.

    ``signers`` (:mod:`gemmar_aot.signing`: keys, or anything with ``keyid`` and ``sign``): sign
    the lock, its envelope written beside it; ``sign_expires``: seconds until the signature
    expires (None: never). Load the keys before calling: a bad key is refused before any compile.

    ``audit_remote``: recompile this many of the remote hits (a sample seeded by ``audit_seed``,
    else a fresh seed, reported) in a scratch store before trusting the rest (:mod:`gemmar_aot.audit`).
    An entry that is not what its key compiles to is reported and quarantined, and then no remote
    hit of this build is trusted: all of them are compiled here (and uploaded, replacing the
    poisoned entry).

    ``remote``: a Bazel HTTP cache URL layered behind the local store (read-through and,
    unless ``remote_read_only``, write-through; see :mod:`gemmar_aot.remote_cache`).
    ``remote_required``: a failing remote is an error rather than one warning.

    ``executor``: where compiles run (``compiler.driver.Executor``); default: local worker
    processes, started as soon as the first store miss is seen so their start-up overlaps
    the rest of the key look-ups. ``trace_path``: write a Chrome-trace/Perfetto JSON timeline.
    """
    from gemmar_aot.compiler.driver import (COSTS_FILE, CostModel, LocalExecutor, Task, compile_all,
                                            terminate_as_interrupt)
    from gemmar_aot.compiler.trace import BuildTrace, maybe_phase
    from gemmar_aot.manifest import load_manifest
    from gemmar_aot.plan import make_plan
    from gemmar_aot.remote_cache import FETCH_LEVEL
    from gemmar_aot.store import Store, default_store_root, maint
    from gemmar_aot.toolchain import PROFILE_ENV, load_toolchain

    t_start = time.perf_counter()
    started = datetime.now(timezone.utc)
    trace = BuildTrace() if trace_path is not None else None
    with maybe_phase(trace, "manifest"):
        manifest = load_manifest(manifest_path)
    with maybe_phase(trace, "plan"):
        plan = make_plan(manifest)
    with maybe_phase(trace, "toolchain"):
        tc = load_toolchain(toolchain_root, toolchain_profile)
    fp = tc.fingerprint
    root = default_store_root(str(store) if store is not None else None)
    st = Store(root)
    session = None
    if remote:
        from gemmar_aot.remote_cache import RemoteSession
        from gemmar_aot.store.errors import StoreError
        from gemmar_aot.store.remote import HttpBackend

        try:
            backend = HttpBackend(remote, writable=not remote_read_only)
        except ValueError as e:  # a malformed URL, credentials in it, a bad timeout or netrc
            raise StoreError(f"--remote / $GEMMAR_AOT_REMOTE: {e}") from None
        session = RemoteSession(st, backend, required=remote_required)
        if only or shard is not None:  # else the closure look-up is the first request (build: _closure_lookup)
            with maybe_phase(trace, "remote probe"):
                session.probe()
    costs_path = st.stats_dir / COSTS_FILE
    costs = CostModel.load(costs_path)
    local = None
    if executor is None:
        local = LocalExecutor(jobs, toolchain_root=toolchain_root, debug_locations=debug_locations,
                              costs=costs, trace=trace)
    try:
        # The (spawned) local workers load the same profile: they inherit it from the environment.
        with terminate_as_interrupt(), _env(PROFILE_ENV, tc.profile.name):
            # spec_id is sha256 over canonical JSON (~50 us): computed once per spec here rather
            # than at each of the ~13 uses per spec below (0.2-0.3 s of a 424-spec warm build).
            ids = {s: s.spec_id for s in plan.specs}
            keys: dict[str, str] = {}
            ingr: dict[str, dict] = {}
            with maybe_phase(trace, "keys", specs=len(plan.specs)):
                for s in plan.specs:
                    ingr[ids[s]] = ingredients(s, fp)
                    keys[ids[s]] = action_key(ingr[ids[s]])

            selected = [s for s in plan.specs if not only or s.kind in only]
            if shard is not None:
                from gemmar_aot.shard import select

                selected = select(selected, *shard)
            records: dict[str, dict] = {}
            rederived = []
            rewriter = None
            with maybe_phase(trace, "store look-ups", specs=len(selected)):
                for s in selected:
                    rec = st.get_record(keys[ids[s]], verify=True)
                    if rec is not None and not is_current(rec):
                        if rewriter is None:
                            # Written as the remote's entries are (remote_cache.py): zstd level 3, no
                            # fsync. A torn or lost record is derived again by the next build, and
                            # ``gemmar-aot optimize`` (run by every build that compiles) re-encodes it.
                            rewriter = Store(root, level=FETCH_LEVEL, durable=False, touch=False)
                        rec = _rederive(st, rewriter, keys[ids[s]], rec)
                        if rec is not None:
                            rederived.append(ids[s])
                    if rec is not None:
                        records[ids[s]] = rec
                    elif local is not None and session is None:
                        local.start()  # at the first miss: workers import while the look-ups go on
            local_hits = len(records)
            remote_hits = 0
            audit_report = None
            closure = closure_keys = None
            if session is not None:
                missing = [keys[ids[s]] for s in selected if ids[s] not in records]
                if not only and shard is None:  # a build of the whole manifest: it has a closure
                    all_keys = set(keys.values())
                    sha = hashlib.sha256(Path(manifest.path).read_bytes()).hexdigest()
                    closure_keys = _closure_keys(manifest, sha, tc.profile.name, fp["digest"], all_keys)
                    with maybe_phase(trace, "remote closure"):
                        closure = _closure_lookup(session, closure_keys, sha, fp["digest"], all_keys, missing)
                from_closure = closure["records"] if closure else {}
                session.counts["remote_hits"] += len(from_closure)  # hits, whichever way they came
                rest = [k for k in missing if k not in from_closure]
                before = dict(session.backend.stats)
                with maybe_phase(trace, "remote look-ups", specs=len(rest)):
                    found = session.lookup(rest)
                if closure is not None:
                    after = session.backend.stats
                    closure.update(per_key_lookups=len(rest),
                                   per_key_requests=after["requests"] - before["requests"],
                                   per_key_bytes=after["bytes_down"] - before["bytes_down"])
                found.update(from_closure)
                for s in selected:
                    if keys[ids[s]] in found:
                        records[ids[s]] = found[keys[ids[s]]]
                from gemmar_aot.audit import note_fetches

                note_fetches(st.stats_dir, session.backend.name, found)
                if audit_remote and found:
                    audit_report = _audit_remote_hits(
                        found, {keys[ids[s]]: s for s in selected}, ingr, ids, st, session,
                        n=audit_remote, seed=audit_seed, jobs=local.jobs if local is not None else jobs,
                        toolchain_root=toolchain_root, costs=costs, progress=progress, trace=trace)
                    for k in audit_report["distrusted_keys"]:
                        records.pop(ids[audit_report["specs"][k]], None)
                        found.pop(k)
                    if audit_report["distrusted_keys"]:
                        session.counts["remote_hits"] -= len(audit_report["distrusted_keys"])
                        if closure is not None:
                            closure["present"] = False  # what the remote holds is not trusted: replace it
                remote_hits = len(found)
                if not (closure and closure["present"]):  # the remote holds this closure: it has them all
                    session.backfill({keys[sid]: rec for sid, rec in records.items()
                                      if keys[sid] not in found})
                for sid in rederived:  # the remote's entry predates this derive code: refresh it
                    session.upload(keys[sid], records[sid])
            todo = [Task(s, keys[ids[s]], ingr[ids[s]]) for s in selected if ids[s] not in records]
            if todo and local is not None:
                local.start()
            hits = len(records)

            def uploaded(spec, res) -> None:
                if res.ok and session is not None:
                    session.upload(keys[spec.spec_id], res.record)

            t0 = time.perf_counter()
            early = _EarlyOptimize(st, trace)
            with maybe_phase(trace, "compile (waiting on workers)", kernels=len(todo)):
                results = compile_all(todo, str(root), executor=executor or local, costs=costs,
                                      progress=progress, on_result=uploaded,
                                      on_tail=early.start) if todo else []
            compile_wall = time.perf_counter() - t0
    finally:
        if local is not None:
            local.close()
        early_info = early.join() if "early" in locals() else None

    by_kind: dict[str, dict] = defaultdict(lambda: {"count": 0, "seconds": 0.0, "bytes": 0})
    failures = []
    waited = 0
    for spec, res in results:
        if res.ok:
            records[spec.spec_id] = res.record
            if res.hit:
                waited += 1
                continue
            k = by_kind[f"{spec.recipe}:{spec.kind}"]
            k["count"] += 1
            k["seconds"] += res.seconds
            k["bytes"] += res.record["blob"]["size"]
        else:
            failures.append({"spec_id": spec.spec_id, "key": keys[spec.spec_id],
                             "label": spec.label(), "error": res.error})
    for k in by_kind.values():
        k["mean_seconds"] = round(k["seconds"] / k["count"], 3)
        k["seconds"] = round(k["seconds"], 3)

    compiled = sum(1 for _, r in results if r.ok and not r.hit)
    if compiled:
        costs.update(results)
        try:
            costs.save(costs_path)
        except OSError:
            pass  # a read-only stats dir only costs the next build its ordering
    # Train/refresh the zstd dictionaries (blobs, records) after compiles, or once for a store
    # migrated from format 2 (a code-object dictionary, no record dictionary yet): a no-op one
    # still reads every file head. Most of it ran during the last kernels (_EarlyOptimize); this
    # repacks what it missed. Not after a build that only fetched from the remote cache: training
    # and repacking its entries took 3.8 of a 5.6 s fresh-clone build, and only saves local disk
    # (remote_cache.py); the next build that compiles, or `gemmar-aot optimize`, does it.
    migrated = st.current_dictionary("records") is None and st.current_dictionary("blobs") is not None
    with maybe_phase(trace, "store optimize"):
        optimized = maint.optimize(st) if compiled or migrated else None
    if optimized is not None and early_info and early_info.get("trained") and not optimized.get("trained"):
        optimized = {**optimized, "trained": early_info["trained"], "early": early_info}
    lock_file = None
    if not failures and not only and shard is None:
        with maybe_phase(trace, "lock file"):
            lock = make_lock(plan, manifest, keys, records, fp)
            lock_path = lock_file_path(root, manifest.name, tc.profile.name)
            # The record index first, then the lock: a reader that finds the new index beside the
            # old lock refuses it (another lock's key set), never serves a mix of the two.
            by_key = {keys[sid]: rec for sid, rec in records.items()}
            index = build_index(lock.kernels(), by_key.get, groups=lock_rank_groups(lock))
            write_index(index_path(lock_path), index)
            lock_file = write_lock(lock_path, lock)
    remote_summary = None
    if session is not None:
        if closure is not None:
            closure.pop("records")
            closure["uploaded"] = False
            if lock_file is not None and not closure["present"]:
                from gemmar_aot.closure import upload_closure

                with maybe_phase(trace, "closure upload"):
                    up = upload_closure(session, st, lock, index, exact=closure_keys[0], latest=closure_keys[1])
                closure["uploaded"] = up["uploaded"]
        with maybe_phase(trace, "remote uploads"):
            remote_summary = session.finish()
    signature = None
    if lock_file is not None and signers:
        from gemmar_aot.signing import sign_lock_file

        with maybe_phase(trace, "sign lock"):
            now = datetime.now(timezone.utc)
            expires = None if sign_expires is None else now + timedelta(seconds=sign_expires)
            audit = {"remote": remote_summary is not None, "remote_hits": remote_hits,
                     "audited": audit_report["audited"] if audit_report else 0}
            if audit_report:
                audit.update(seed=audit_report["seed"], findings=len(audit_report["findings"]))
            env_path = sign_lock_file(lock_file, signers, audit=audit, started=started, expires=expires,
                                      lock=lock)
            signature = {"envelope": str(env_path), "keyids": [s.keyid for s in signers],
                         "expires": None if expires is None else expires.strftime("%Y-%m-%dT%H:%M:%SZ")}
    summary = {
        "manifest": manifest.name,
        "warnings": list(manifest.warnings),
        "store": str(root),
        "lock_file": str(lock_file) if lock_file else None,
        "signature": signature,
        "jobs": (local.jobs if local is not None else getattr(executor, "jobs", 0)) if todo else 0,
        "executor": executor.info() if hasattr(executor, "info") else {"name": "local"},
        "kernel_instances": plan.instances,
        "distinct_specs": len(plan.specs),
        "selected_specs": len(selected),
        "shard": None if shard is None else f"{shard[0]}/{shard[1]}",
        "hits": hits + waited,
        "local_hits": local_hits + waited,
        "remote_hits": remote_hits,
        "rederived": len(rederived) + (remote_summary["rederived"] if remote_summary else 0),
        "uploads": remote_summary["uploads"] if remote_summary else 0,
        "remote": remote_summary,
        "closure": closure,
        "audit": None if audit_report is None else {k: v for k, v in audit_report.items()
                                                     if k not in ("specs", "distrusted_keys")},
        "misses": len(todo),
        "compiled": compiled,
        "failed": len(failures),
        "compile_wall_seconds": round(compile_wall, 3),
        "wall_seconds": round(time.perf_counter() - t_start, 3),
        "cpu_seconds": round(sum(r.seconds for _, r in results if not r.hit), 3),
        "worker_cpu_seconds": round(sum(r.cpu_seconds for _, r in results if not r.hit), 3),
        "by_kind": dict(by_kind),
        "failures": sorted(failures, key=lambda f: f["label"]),
        "toolchain": fp["digest"],
        "toolchain_profile": tc.profile.name,
        "store_optimize": optimized,
    }
    st.record_build_stats({k: summary[k] for k in (
        "manifest", "hits", "local_hits", "remote_hits", "uploads", "misses", "compiled", "failed",
        "distinct_specs", "wall_seconds", "remote")})
    if trace is not None:
        summary["trace"] = str(trace.write(trace_path, manifest=manifest.name, jobs=summary["jobs"],
                                           compiled=compiled, wall_seconds=summary["wall_seconds"]))
    return summary
