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

import os
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from gemmar_aot.builder.local_lookup import LocalLookup
from gemmar_aot.builder.lock_make import make_lock
from gemmar_aot.builder.manifest import Manifest, load_manifest
from gemmar_aot.model.lock import Lock
from gemmar_aot.model.bundle import LockBundle
from gemmar_aot.store.backend import record_blob
from gemmar_aot.compiler.keys import OWN_COMPILE, action_key, ingredients
from gemmar_aot.store.blob_index import build_blob_index
from gemmar_aot.store.record_index import build_index, lock_rank_groups


class _EarlyOptimize:
    """``dictionaries.optimize`` (train the zstd dictionary, repack) in a thread of the main process,
    started when 60% of the kernels are done, while the last, short ones compile.

    Workers read the dictionary pointer on every put, so kernels finished after the
    training are written with the dictionary and need no repack; after the last kernel only
    the few written while the training ran are repacked (60% > 1/2, so the final optimize
    does not retrain: see ``dictionaries.optimize``'s retrain factor). Otherwise the whole repack,
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
        from gemmar_aot.store import dictionaries

        try:
            with maybe_phase(self.trace, "store optimize (during the last kernels)"):
                self.info = dictionaries.optimize(self.store)
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


@dataclass(frozen=True)
class Built:
    """What a build made, in memory, for the step after it (the wheel): the summary, the lock
    (None when the build wrote none: a failure, a shard), the record index it wrote beside the
    lock, the store it wrote into (one handle), the manifest as read, and the blobs it read."""

    summary: dict
    lock: Lock | None
    record_index: bytes | None
    store: Any
    manifest: Manifest
    blobs: Mapping[str, bytes]  # digest -> verified bytes, every code object the lock names among them


def build(manifest: "Path | Manifest", *, store: Path | None = None, jobs: int | None = None,
              debug_locations: bool = False, only: tuple[str, ...] = (),
              shard: tuple[int, int] | None = None,
              remote: str | None = None, remote_read_only: bool = False, remote_required: bool = False,
              progress: bool = True, toolchain_root: str | None = None,
              trace_path: str | os.PathLike | None = None, executor=None,
              toolchain_profile: str | None = None, signers: Sequence[Any] = (),
              sign_expires: float | None = None, audit_remote: int = 0, audit_seed: int | None = None,
              compile_key: Any = None, trusted_compile_keys: Any = None) -> Built:
    """Build ``manifest`` (a path, or the :class:`~gemmar_aot.builder.manifest.Manifest` read from one:
    each input is read once) into the store; returns what it made (:class:`Built`), the summary
    among it (:func:`run_build` returns that alone).

    ``signers`` (:mod:`gemmar_aot.trust`: keys, or anything with ``keyid`` and ``sign``): sign
    the lock, its envelope written beside it; ``sign_expires``: seconds until the signature
    expires (None: never). Load the keys before calling: a bad key is refused before any compile.

    ``audit_remote``: recompile this many of the remote hits (a sample seeded by ``audit_seed``,
    else a fresh seed, reported) in a scratch store before trusting the rest (:mod:`gemmar_aot.builder.audit`).
    An entry that is not what its key compiles to is reported and quarantined, and then no remote
    hit of this build is trusted: all of them are compiled here (and uploaded, replacing the
    poisoned entry).

    ``remote``: a Bazel HTTP cache URL layered behind the local store (read-through and,
    unless ``remote_read_only``, write-through; see :mod:`gemmar_aot.builder.remote_session`).
    ``remote_required``: a failing remote is an error rather than one warning.

    ``compile_key`` (a Signer, :mod:`gemmar_aot.builder.compile_vouch`): sign each entry this build
    compiles (in the local store and as uploaded). ``trusted_compile_keys`` (a TrustSet): take a
    remote entry only when a trusted, unrevoked compile key signed it; the rest is compiled here.

    ``executor``: where compiles run (``compiler.scheduler.Executor``); default: local worker
    processes, started as soon as the first store miss is seen so their start-up overlaps
    the rest of the key look-ups. ``trace_path``: write a Chrome-trace/Perfetto JSON timeline.
    """
    run = _BuildRun(manifest if isinstance(manifest, Manifest) else Path(manifest), _BuildOptions(
        store=store, jobs=jobs, debug_locations=debug_locations, only=only, shard=shard, remote=remote,
        remote_read_only=remote_read_only, remote_required=remote_required, progress=progress,
        toolchain_root=toolchain_root, trace_path=trace_path, executor=executor,
        toolchain_profile=toolchain_profile, signers=tuple(signers), sign_expires=sign_expires,
        audit_remote=audit_remote, audit_seed=audit_seed, compile_key=compile_key,
        trusted_compile_keys=trusted_compile_keys))
    summary = run.run()
    return Built(summary, run.lock if run.lock_file else None, run.index if run.lock_file else None, run.st,
                 run.manifest, run.found.blobs)




def run_build(manifest: "Path | Manifest", **options: Any) -> dict:
    """Build ``manifest`` into the store (:func:`build`'s arguments); returns the summary."""
    return build(manifest, **options).summary


@dataclass(frozen=True)
class _BuildOptions:
    """:func:`run_build`'s keywords, as one value."""

    store: Path | None
    jobs: int | None
    debug_locations: bool
    only: tuple[str, ...]
    shard: tuple[int, int] | None
    remote: str | None
    remote_read_only: bool
    remote_required: bool
    progress: bool
    toolchain_root: str | None
    trace_path: str | os.PathLike | None
    executor: Any
    toolchain_profile: str | None
    signers: tuple
    sign_expires: float | None
    audit_remote: int
    audit_seed: int | None
    compile_key: Any = None
    trusted_compile_keys: Any = None

    @property
    def whole(self) -> bool:
        """Whether the build covers the whole manifest (no --only, no --shard): then it writes a lock
        and has a closure."""
        return not self.only and self.shard is None


class _BuildRun:
    """One :func:`run_build`, in its phases, in order: ``prepare`` (manifest, plan, toolchain,
    store, remote session, executor), ``compute_keys``, ``look_up_locally`` (re-deriving stale
    records), ``look_up_remote`` (the closure, then key by key, the audit, the backfill),
    ``compile``, ``tally``, ``optimize``, ``write_lock``, ``finish_remote`` (the closure upload),
    ``sign``, ``summary``. The state they hand on is this object's attributes."""

    def __init__(self, manifest: "Path | Manifest", o: _BuildOptions):
        self.given, self.o = manifest, o
        self.t_start = time.perf_counter()
        self.started = datetime.now(timezone.utc)
        self.session = self.local = self.early = self.early_info = None
        self.closure = self.closure_keys = self.audit_report = None
        self.lock = self.index = self.lock_file = None
        self.records: dict[str, dict] = {}
        self.remote_hits = 0
        self.signed: dict[str, dict] = {}  # spec id -> the record this build compiled and signed
        self.results: list = []
        self.todo: list = []
        self.compile_wall = 0.0

    def run(self) -> dict:
        from gemmar_aot.compiler.scheduler import terminate_as_interrupt
        from gemmar_aot.toolchain import PROFILE_ENV

        self.prepare()
        try:
            # The (spawned) local workers load the same profile: they inherit it from the environment.
            with terminate_as_interrupt(), _env(PROFILE_ENV, self.tc.profile.name):
                self.compute_keys()
                self.look_up_locally()
                if self.session is not None:
                    self.look_up_remote()
                self.compile()
        finally:
            if self.local is not None:
                self.local.close()
            self.early_info = self.early.join() if self.early is not None else None
        self.tally()
        self.optimize()
        self.write_lock()
        self.finish_remote()
        self.sign()
        return self.summary()

    def prepare(self) -> None:
        from gemmar_aot.compiler.scheduler import COSTS_FILE, CostModel, LocalExecutor
        from gemmar_aot.compiler.trace import BuildTrace
        from gemmar_aot.builder.plan import make_plan
        from gemmar_aot.store import Store, default_store_root
        from gemmar_aot.toolchain import load_toolchain
        from gemmar_aot.toolchain.profiles import get_profile

        o = self.o
        self.trace = BuildTrace() if o.trace_path is not None else None
        with self.phase("manifest"):
            given = self.given
            self.manifest = given if isinstance(given, Manifest) else load_manifest(given)
        self.root = default_store_root(str(o.store) if o.store is not None else None)
        with self.phase("plan"):
            # EP specs carry the factory keywords of the profile's mori (pinned: no set-up needed);
            # HIP-backend EP entries are planned by the profile's mori itself (its toolchain)
            tc = load_toolchain(o.toolchain_root, o.toolchain_profile) if self.manifest.ep_hip else None
            self.plan = make_plan(self.manifest, mori_version=get_profile(o.toolchain_profile).mori.version,
                                  profile=o.toolchain_profile, toolchain=tc)
        with self.phase("toolchain"):
            self.tc = tc or load_toolchain(o.toolchain_root, o.toolchain_profile)
        self.fp = self.tc.fingerprint
        self.st = Store(self.root)
        self.found = LocalLookup(self.st, self.root)
        if o.remote:
            from gemmar_aot.builder.remote_session import RemoteSession
            from gemmar_aot.store.store_errors import StoreError
            from gemmar_aot.store.remote.remote_backend import HttpBackend

            try:
                backend = HttpBackend(o.remote, writable=not o.remote_read_only)
            except ValueError as e:  # a malformed URL, credentials in it, a bad timeout or netrc
                raise StoreError(f"--remote / $GEMMAR_AOT_REMOTE: {e}") from None
            check = None
            if o.trusted_compile_keys is not None:
                from gemmar_aot.builder.compile_vouch import VouchCheck

                check = VouchCheck(o.trusted_compile_keys)
            self.session = RemoteSession(self.st, backend, required=o.remote_required, vouch_check=check,
                                         signer=o.compile_key)
            if not o.whole:  # else the closure look-up is the first request (_closure_lookup)
                with self.phase("remote probe"):
                    self.session.probe()
        self.costs_path = self.st.stats_dir / COSTS_FILE
        self.costs = CostModel.load(self.costs_path)
        if o.executor is None:
            self.local = LocalExecutor(o.jobs, toolchain_root=o.toolchain_root, debug_locations=o.debug_locations,
                                       costs=self.costs, trace=self.trace)

    def phase(self, name: str, **args):
        from gemmar_aot.compiler.trace import maybe_phase

        return maybe_phase(self.trace, name, **args)

    def compute_keys(self) -> None:
        # spec_id is sha256 over canonical JSON: computed once per spec here rather than at each
        # of its uses below (a warm build is mostly look-ups, and those uses were a visible part).
        specs = self.plan.specs
        self.ids = ids = {s: s.spec_id for s in specs}
        self.keys: dict[str, str] = {}
        self.ingr: dict[str, dict] = {}
        with self.phase("keys", specs=len(specs)):
            for s in specs:
                self.ingr[ids[s]] = ingredients(s, self.fp)
                self.keys[ids[s]] = action_key(self.ingr[ids[s]])
        selected = [s for s in specs if not self.o.only or s.kind in self.o.only]
        if self.o.shard is not None:
            from gemmar_aot.builder.shard import select

            selected = select(selected, *self.o.shard)
        self.selected = selected

    def look_up_locally(self) -> None:
        from gemmar_aot.compiler.keys import schema3_key

        ids, keys, ingr, found = self.ids, self.keys, self.ingr, self.found
        with self.phase("store look-ups", specs=len(self.selected)):
            for s in self.selected:
                sid = ids[s]
                rec = found.find(keys[sid], ingr[sid]["spec"], lambda: schema3_key(ingr[sid]))
                if rec is not None:
                    self.records[sid] = rec
                elif self.local is not None and self.session is None and s.recipe not in OWN_COMPILE:
                    self.local.start()  # at the first miss: workers import while the look-ups go on
        self.local_hits = len(self.records)

    def look_up_remote(self) -> None:
        """What the local store lacked, from the remote: the manifest's closure first (a whole
        build), then key by key; the audit of what came; the backfill of what the remote lacks."""
        from gemmar_aot.builder.audit import note_fetches

        ids, keys, session, selected = self.ids, self.keys, self.session, self.selected
        missing = [keys[ids[s]] for s in selected if ids[s] not in self.records]
        if self.o.whole:  # a build of the whole manifest: it has a closure
            all_keys = set(keys.values())
            sha = self.manifest.sha256
            from gemmar_aot.builder.closure import closure_keys, closure_lookup

            self.closure_keys = closure_keys(self.manifest, sha, self.tc.profile.name, self.fp["digest"], all_keys)
            with self.phase("remote closure"):
                self.closure = closure_lookup(session, self.closure_keys, sha, self.fp["digest"], all_keys, missing)
        from_closure = self.closure["records"] if self.closure else {}
        session.counts["remote_hits"] += len(from_closure)  # hits, whichever way they came
        rest = [k for k in missing if k not in from_closure]
        before = dict(session.backend.stats)
        with self.phase("remote look-ups", specs=len(rest)):
            found = session.lookup(rest)
        if self.closure is not None:
            after = session.backend.stats
            self.closure.update(per_key_lookups=len(rest), per_key_requests=after["requests"] - before["requests"],
                                per_key_bytes=after["bytes_down"] - before["bytes_down"])
        found.update(from_closure)
        for s in selected:
            if keys[ids[s]] in found:
                self.records[ids[s]] = found[keys[ids[s]]]
        note_fetches(self.st.stats_dir, session.backend.name, found)
        if self.o.audit_remote and found:
            self.audit(found)
        self.remote_hits = len(found)
        by_key = {keys[sid]: rec for sid, rec in self.records.items()}
        refresh = set(self.found.rederived)  # the remote's entry predates this derive code: refresh it
        if not (self.closure and self.closure["present"]):  # the remote holds this closure: it has them all
            session.backfill({k: rec for k, rec in by_key.items() if k not in found and k not in refresh})
        spec_ids = {keys[sid]: sid for sid in self.records}
        for key in sorted(refresh):  # uploaded once each (the backfill leaves them to this)
            rec = session.refresh(key, by_key[key])
            if rec != by_key[key]:  # its stale signatures dropped, or signed anew: kept so
                self.st.put_record(key, rec)
                self.records[spec_ids[key]] = rec

    def audit(self, found: dict) -> None:
        """Recompile a sample of the remote hits ``found``; one finding distrusts them all (each
        is dropped from ``found`` and the records, to be compiled here)."""
        from gemmar_aot.builder.audit import audit_remote_hits

        o, ids, keys = self.o, self.ids, self.keys
        report = self.audit_report = audit_remote_hits(
            found, {keys[ids[s]]: s for s in self.selected}, self.ingr, ids, self.st, self.session,
            n=o.audit_remote, seed=o.audit_seed, jobs=self.local.jobs if self.local is not None else o.jobs,
            toolchain_root=o.toolchain_root, costs=self.costs, progress=o.progress, trace=self.trace)
        for k in report["distrusted_keys"]:
            self.records.pop(ids[report["specs"][k]], None)
            found.pop(k)
        if report["distrusted_keys"]:
            self.session.counts["remote_hits"] -= len(report["distrusted_keys"])
            if self.closure is not None:
                self.closure["present"] = False  # what the remote holds is not trusted: replace it

    def compile(self) -> None:
        from gemmar_aot.compiler.scheduler import Task, compile_all

        ids, keys, session = self.ids, self.keys, self.session
        self.todo = todo = [Task(s, keys[ids[s]], self.ingr[ids[s]]) for s in self.selected
                            if ids[s] not in self.records]
        if self.local is not None and any(t.spec.recipe not in OWN_COMPILE for t in todo):
            self.local.start()
        self.hits = len(self.records)

        def finished(spec, res) -> None:
            if not res.ok:
                return
            rec = res.record
            if self.o.compile_key is not None and not res.hit:  # compiled here: this build vouches for it
                from gemmar_aot.builder.compile_vouch import vouch

                rec = self.signed[spec.spec_id] = vouch(keys[spec.spec_id], rec, self.o.compile_key)  # stored in tally
            if session is not None:
                session.upload(keys[spec.spec_id], rec)

        t0 = time.perf_counter()
        self.early = _EarlyOptimize(self.st, self.trace)
        with self.phase("compile (waiting on workers)", kernels=len(todo)):
            self.results = compile_all(todo, str(self.root), executor=self.o.executor or self.local,
                                       costs=self.costs, progress=self.o.progress, on_result=finished,
                                       on_tail=self.early.start, toolchain=self.tc) if todo else []
        self.compile_wall = time.perf_counter() - t0

    def tally(self) -> None:
        """The compiles' records kept, their time and size by kind, the failures; the cost model updated.
        The records this build signed replace the unsigned ones its workers stored: here, after the
        early repack, which re-encodes records in place and could write an unsigned one back over it."""
        for spec_id, rec in self.signed.items():
            self.st.put_record(self.keys[spec_id], rec)
        self.by_kind: dict[str, dict] = defaultdict(lambda: {"count": 0, "seconds": 0.0, "bytes": 0})
        self.failures = []
        self.waited = 0
        for spec, res in self.results:
            if res.ok:
                self.records[spec.spec_id] = self.signed.get(spec.spec_id, res.record)
                if res.hit:
                    self.waited += 1
                    continue
                k = self.by_kind[f"{spec.recipe}:{spec.kind}"]
                k["count"] += 1
                k["seconds"] += res.seconds
                k["bytes"] += record_blob(res.record).size
            else:
                self.failures.append({"spec_id": spec.spec_id, "key": self.keys[spec.spec_id],
                                      "label": spec.label(), "error": res.error})
        for k in self.by_kind.values():
            k["mean_seconds"] = round(k["seconds"] / k["count"], 3)
            k["seconds"] = round(k["seconds"], 3)
        self.compiled = sum(1 for _, r in self.results if r.ok and not r.hit)
        if self.compiled:
            self.costs.update(self.results)
            try:
                self.costs.save(self.costs_path)
            except OSError:
                pass  # a read-only stats dir only costs the next build its ordering

    def optimize(self) -> None:
        # Train/refresh the zstd dictionaries (blobs, records) after compiles, or once for a store
        # migrated from format 2 (a code-object dictionary, no record dictionary yet): a no-op one
        # still reads every file head. Most of it ran during the last kernels (_EarlyOptimize); this
        # repacks what it missed. Not after a build that only fetched from the remote cache: training
        # and repacking its entries took most of a fresh-clone build, and only saves local disk
        # (remote_session.py); the next build that compiles, or `gemmar-aot optimize`, does it.
        from gemmar_aot.store import dictionaries

        st = self.st
        migrated = st.current_dictionary("records") is None and st.current_dictionary("blobs") is not None
        with self.phase("store optimize"):
            optimized = dictionaries.optimize(st) if self.compiled or migrated else None
        early = self.early_info
        if optimized is not None and early and early.get("trained") and not optimized.get("trained"):
            optimized = {**optimized, "trained": early["trained"], "early": early}
        self.optimized = optimized

    def write_lock(self) -> None:
        if self.failures or not self.o.whole:
            return
        with self.phase("lock file"):
            self.lock = make_lock(self.plan, self.manifest, self.keys, self.records, self.fp)
            bundle = LockBundle.in_store(self.root, self.manifest.name, self.tc.profile.name)
            by_key = {self.keys[sid]: rec for sid, rec in self.records.items()}
            self.index = build_index(self.lock.kernels(), by_key.get, groups=lock_rank_groups(self.lock))
            self.lock_file = bundle.write(self.lock, record_index=self.index,
                                          blob_index=build_blob_index(self.lock, self.found.load_blob))

    def finish_remote(self) -> None:
        """The closure uploaded when the remote lacks it, then the session's uploads finished."""
        self.remote_summary = None
        if self.session is None:
            return
        closure = self.closure
        if closure is not None:
            closure.pop("records")
            closure["uploaded"] = False
            if self.lock_file is not None and not closure["present"]:
                from gemmar_aot.builder.closure import upload_closure

                with self.phase("closure upload"):
                    up = upload_closure(self.session, self.st, self.lock, self.index, self.records.values(),
                                        exact=self.closure_keys[0], latest=self.closure_keys[1])
                closure["uploaded"] = up["uploaded"]
                closure["launchers"] = up.get("launchers", 0)
        with self.phase("remote uploads"):
            self.remote_summary = self.session.finish()

    def sign(self) -> None:
        self.signature = None
        o, report = self.o, self.audit_report
        if self.lock_file is None or not o.signers:
            return
        from gemmar_aot.trust.envelope import sign_lock_file

        with self.phase("sign lock"):
            now = datetime.now(timezone.utc)
            expires = None if o.sign_expires is None else now + timedelta(seconds=o.sign_expires)
            audit = {"remote": self.remote_summary is not None, "remote_hits": self.remote_hits,
                     "audited": report["audited"] if report else 0}
            keys = self._compile_keys()
            if keys is not None:  # which compile keys vouched for the remote hits
                audit["compile_keys"] = keys
            if report:
                audit.update(seed=report["seed"], findings=len(report["findings"]))
            env_path = sign_lock_file(self.lock_file, o.signers, audit=audit, started=self.started,
                                      expires=expires, lock=self.lock)
            self.signature = {"envelope": str(env_path), "keyids": [s.keyid for s in o.signers],
                              "expires": None if expires is None else expires.strftime("%Y-%m-%dT%H:%M:%SZ")}

    def _compile_keys(self) -> dict | None:
        """Who signed what this build compiled, and who vouched for what it took from the remote
        (None: neither a compile key nor trusted compile keys)."""
        check = self.session.vouch_check if self.session is not None else None
        key = self.o.compile_key
        if key is None and check is None:
            return None
        return {"signer": None if key is None else key.keyid, "signed": len(self.signed),
                **({} if check is None else check.summary())}

    def summary(self) -> dict:
        o, remote, results = self.o, self.remote_summary, self.results
        executor = o.executor
        summary = {
            "manifest": self.manifest.name,
            "warnings": list(self.manifest.warnings),
            "store": str(self.root),
            "lock_file": str(self.lock_file) if self.lock_file else None,
            "signature": self.signature,
            "jobs": (self.local.jobs if self.local is not None else getattr(executor, "jobs", 0)) if self.todo else 0,
            "executor": executor.info() if hasattr(executor, "info") else {"name": "local"},
            "kernel_instances": self.plan.instances,
            "distinct_specs": len(self.plan.specs),
            "selected_specs": len(self.selected),
            "shard": None if o.shard is None else f"{o.shard[0]}/{o.shard[1]}",
            "hits": self.hits + self.waited,
            "local_hits": self.local_hits + self.waited,
            "remote_hits": self.remote_hits,
            "rederived": len(self.found.rederived) + (remote["rederived"] if remote else 0),
            "relabelled": len(self.found.relabelled),
            "contradicted": self.found.contradicted,
            "uploads": remote["uploads"] if remote else 0,
            "remote": remote,
            "closure": self.closure,
            "compile_keys": self._compile_keys(),
            "audit": None if self.audit_report is None else {
                k: v for k, v in self.audit_report.items() if k not in ("specs", "distrusted_keys")},
            "misses": len(self.todo),
            "compiled": self.compiled,
            "failed": len(self.failures),
            "compile_wall_seconds": round(self.compile_wall, 3),
            "wall_seconds": round(time.perf_counter() - self.t_start, 3),
            "cpu_seconds": round(sum(r.seconds for _, r in results if not r.hit), 3),
            "worker_cpu_seconds": round(sum(r.cpu_seconds for _, r in results if not r.hit), 3),
            "by_kind": dict(self.by_kind),
            "failures": sorted(self.failures, key=lambda f: f["label"]),
            "toolchain": self.fp["digest"],
            "toolchain_profile": self.tc.profile.name,
            "store_optimize": self.optimized,
        }
        self.st.record_build_stats({k: summary[k] for k in (
            "manifest", "hits", "local_hits", "remote_hits", "uploads", "misses", "compiled", "failed",
            "distinct_specs", "wall_seconds", "remote")})
        if self.trace is not None:
            summary["trace"] = str(self.trace.write(o.trace_path, manifest=self.manifest.name, jobs=summary["jobs"],
                                                    compiled=self.compiled, wall_seconds=summary["wall_seconds"]))
        return summary
