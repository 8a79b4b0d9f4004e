"""A manifest's closure in the remote cache: everything its lock names, in one request.

A fresh runner pointed at a warm remote used to fetch each kernel by key: two requests a
kernel, one small object each; over a link with a long round trip that adds up to seconds
(``bench/bench_closure.py`` measures it), and the CAS copies are raw code objects. But the lock already names the whole
closure of a manifest, so after a build we upload one more action-cache entry:

    /ac/<closure key>   an ActionResult whose outputs are
                        gemmar-aot/closure.pack       one pack (:mod:`.store.pack`): every code
                                                      object the lock names (dictionary-compressed,
                                                      as an artifact wheel ships them), the launcher
                                                      each record names (with a dictionary of their
                                                      own), the lock's canonical bytes and its record
                                                      index, each under its own sha256
                        gemmar-aot/closure/lock.json  the lock (its plain bytes), and
                        gemmar-aot/closure/records.zst its record index, for other clients
    /ac/<latest key>    the same ActionResult: the newest closure of this manifest name,
                        toolchain and profile, for a manifest that changed since

The **closure key** hashes what the lock is a function of: the manifest (name and sha256),
the toolchain profile and digest, every action key, the derive code (records name it) and
the lock and index schemas. A build asks for it before its per-key look-ups: on a hit it
unpacks, checks the lock against the manifest it is building (manifest digest, toolchain,
the very set of action keys), takes every record from the index (each verified against the
lock's record digest) and every code object and launcher from the pack (each verified against
its digest), writes them into the local store, and has nothing left to look up: two requests
(the entry, which is also the build's probe, and the pack). A manifest that differs from the latest closure by a few
tuples takes what that closure has of it and looks up only the rest, one key at a time.

Nothing in a closure is trusted: a pack whose bytes do not match its digest, that does not
decode, whose lock was built from another manifest or toolchain, or whose record or code
object does not match the lock is refused, its bytes quarantined, and the build goes on
with per-key look-ups as before.

The launchers travel so that a store filled from a closure is whole: it can derive every
entry again offline when the derive code changes (compiling nothing), and ``verify`` finds
nothing degraded. They add ~2 KB of MLIR text a kernel before compression (schema 2; a schema-1
closure, which lacked them, is no longer asked for).

The remote's per-key entries stay as they are (other clients, partial hits); the pack is one
more ``/cas/`` object. bazel-remote's ``/ac/`` validation accepts the entry: its outputs are
uploaded to ``/cas/`` first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from gemmar_aot.builder.compile_vouch import FIELD, vouches
from gemmar_aot.model.lock import Lock
from gemmar_aot.model.schema import LOCK_SCHEMA
from gemmar_aot.model.types import Digest
from gemmar_aot.model.spec import canonical_json
from gemmar_aot.util.filedigest import sha256_hex

#: Bump when what a closure entry holds, or how its key is made, changes.
CLOSURE_SCHEMA = 2
PACK_PATH = "gemmar-aot/closure.pack"
LOCK_PATH = "gemmar-aot/closure/lock.json"
INDEX_PATH = "gemmar-aot/closure/records.zst"
#: Who vouched for each record (``builder.compile_vouch``): canonical JSON, action key -> the
#: signatures its producer's record carried. Optional: a closure of unsigned records has none.
VOUCHES_PATH = "gemmar-aot/closure/vouched.json"


def closure_key(*, manifest: Mapping[str, str], profile: str, toolchain_digest: str, keys: Iterable[str],
                derive_code: str) -> str:
    """The action key of a manifest's closure entry (see the module docstring)."""
    from gemmar_aot.store.record_index import INDEX_SCHEMA

    return sha256_hex(canonical_json({
        "what": "gemmar-aot closure", "schema": CLOSURE_SCHEMA, "lock_schema": LOCK_SCHEMA,
        "index_schema": INDEX_SCHEMA, "manifest": {"name": manifest["name"], "sha256": manifest["sha256"]},
        "profile": profile, "toolchain": toolchain_digest, "derive_code": derive_code,
        "keys": sorted(set(keys))}).encode())


def latest_key(*, manifest_name: str, profile: str, toolchain_digest: str) -> str:
    """The action key of the newest closure of a manifest name (for a manifest that changed), per
    lock and index schema: a builder of another gemmar-aot never overwrites this one's."""
    from gemmar_aot.store.record_index import INDEX_SCHEMA

    return sha256_hex(canonical_json({
        "what": "gemmar-aot closure, latest of a manifest", "schema": CLOSURE_SCHEMA, "lock_schema": LOCK_SCHEMA,
        "index_schema": INDEX_SCHEMA, "manifest": manifest_name, "profile": profile,
        "toolchain": toolchain_digest}).encode())


@dataclass
class ClosureFetch:
    """What asking the remote for a closure gave: ``status`` is "hit" (the exact closure),
    "partial" (the latest closure of the manifest name, holding ``len(records)`` of the keys),
    "miss" or "refused" (``problem`` says why); ``records``: key -> record now in the local store."""

    status: str
    records: dict[str, dict] = field(default_factory=dict)
    source: str | None = None  # "exact" or "latest"
    problem: str | None = None
    pack_bytes: int = 0
    seconds: float = 0.0

    def summary(self) -> dict:
        return {"status": self.status, "source": self.source, "entries": len(self.records),
                "pack_bytes": self.pack_bytes, "problem": self.problem, "seconds": round(self.seconds, 3)}


class ClosureRefused(Exception):
    """A closure entry that cannot be used (bytes, format, or another manifest's): a miss."""


class ClosureOfAnotherSchema(ClosureRefused):
    """A closure whose lock or record index another gemmar-aot wrote (another schema): intact, not
    this one's to read; a plain miss, never quarantined."""


def _decode_entry(data: bytes, key: str) -> tuple[Digest, Digest, Digest, Digest | None]:
    from gemmar_aot.store.remote import reapi

    try:
        ar = reapi.decode_action_result(data)
    except reapi.ProtobufError as e:
        raise ClosureRefused(f"/ac/{key} is not an ActionResult: {e}") from None
    out = []
    for path in (PACK_PATH, LOCK_PATH, INDEX_PATH):
        f = ar.file(path)
        if f is None:
            raise ClosureRefused(f"/ac/{key} has no output file {path}: not a gemmar-aot closure")
        out.append(f.digest)
    vouched = ar.file(VOUCHES_PATH)
    return out[0], out[1], out[2], None if vouched is None else vouched.digest


def open_closure(pack: bytes, want: Digest, lock_digest: Digest, index_digest: Digest, where: str):
    """(the lock, its record index, the pack reader) of a closure pack's bytes, each checked:
    the pack against its digest, the lock and index (inside it) against theirs. Raises
    ClosureRefused naming what is wrong."""
    from pathlib import Path

    from gemmar_aot.model.schema import LockSchemaError
    from gemmar_aot.store.blob_codec import BadBlob, SizeMismatch, check_content
    from gemmar_aot.store.pack import PackBackend
    from gemmar_aot.store.record_index import RecordIndex, RecordIndexSchemaError

    try:
        check_content(pack, want.hash, want.size)
    except (BadBlob, SizeMismatch) as e:
        raise ClosureRefused(f"{where}: {e}") from None
    try:
        reader = PackBackend(".", data=pack, where=where)
        lock_bytes = reader.load_blob(lock_digest.hash, lock_digest.size)
        index_bytes = reader.load_blob(index_digest.hash, index_digest.size)
        lock = Lock.from_bytes(lock_bytes, f"{where} (its lock)")
        lock.check_parts()
        index = RecordIndex.from_bytes(index_bytes, Path(f"{where} (its record index)"))
    except (LockSchemaError, RecordIndexSchemaError) as e:
        raise ClosureOfAnotherSchema(f"{where}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a store, index or lock error (GemmarErrors, ValueErrors): a refusal
        raise ClosureRefused(f"{where}: {e}") from None
    return lock, index, reader


def fetch_closure(session: Any, *, exact: str, latest: str, all_keys: set[str], need: set[str],
                  manifest_sha256: str, toolchain_digest: str) -> ClosureFetch:
    """Ask ``session``'s remote for the closure ``exact``, else the ``latest`` of the manifest, and
    write what it holds of ``need`` (the action keys the local store lacks) into the local store.
    ``all_keys``: every action key of the build (the exact closure's lock must name exactly
    these). Never raises for the remote's sake: a failure is a miss or a refusal (its bytes
    quarantined), and the caller looks up per key what is still missing."""
    import time

    from gemmar_aot.store.store_errors import StoreError
    from gemmar_aot.store.record_index import RecordIndexError

    t0 = time.perf_counter()
    backend = session.backend
    if backend.down:
        return ClosureFetch("miss", problem=f"remote down: {backend.down}")
    for source, key in (("exact", exact), ("latest", latest)):
        if source == "exact":  # the build's first request: its probe (a failure is its one warning)
            data = session.first_request(lambda: backend.client.get("ac", key) or b"")
            if data is None:
                return ClosureFetch("miss", problem=f"remote down: {backend.down}", seconds=time.perf_counter() - t0)
        else:
            try:
                data = backend.client.get("ac", key)
            except Exception as e:  # noqa: BLE001 - a failing remote is a miss, never fatal here
                session.problem(f"closure look-up {key[:16]}", e)
                return ClosureFetch("miss", problem=str(e), seconds=time.perf_counter() - t0)
        if not data:
            continue
        where = f"{backend.name}/cas/<closure pack of /ac/{key[:16]}>"
        try:
            pack_d, lock_d, index_d, vouches_d = _decode_entry(data, key)
            where = f"{backend.name}/cas/{pack_d.hash}"
            try:
                pack = backend.client.get("cas", pack_d.hash)
            except Exception as e:  # noqa: BLE001
                session.problem(f"closure pack {pack_d.hash[:16]}", e)
                return ClosureFetch("miss", source=source, problem=str(e), seconds=time.perf_counter() - t0)
            if pack is None:
                continue  # evicted: try the next, then per key
            try:
                lock, index, reader = open_closure(pack, pack_d, lock_d, index_d, where)
                vouched = _vouches(reader, vouches_d, where)
                got = _take(lock, index, reader, session, all_keys, need, source, manifest_sha256,
                            toolchain_digest, where, vouched)
            except ClosureOfAnotherSchema:
                continue  # intact, another gemmar-aot's: try the next, then per key
            except (ClosureRefused, StoreError, RecordIndexError, ValueError) as e:  # a lazily read part, a bad record
                refused = e if isinstance(e, ClosureRefused) else ClosureRefused(f"{where}: {e}")
                session.quarantine_bytes(where, pack, str(refused))
                raise refused from None
        except ClosureRefused as e:
            session.problem("closure", e)
            return ClosureFetch("refused", source=source, problem=str(e), seconds=time.perf_counter() - t0)
        return ClosureFetch("hit" if source == "exact" else "partial", got, source, pack_bytes=len(pack),
                            seconds=time.perf_counter() - t0)
    return ClosureFetch("miss", seconds=time.perf_counter() - t0)


def _vouches(reader: Any, digest: Digest | None, where: str) -> dict[str, list]:
    """The closure's record signatures (action key -> list), from its pack; {} when it has none."""
    import json

    if digest is None:
        return {}
    got = json.loads(reader.load_blob(digest.hash, digest.size))
    if not isinstance(got, dict) or not all(isinstance(v, list) for v in got.values()):
        raise ClosureRefused(f"{where}: its {VOUCHES_PATH} is not a map of action keys to signatures")
    return got


def _take(lock: Lock, index: Any, reader: Any, session: Any, all_keys: set[str], need: set[str], source: str,
          manifest_sha256: str, toolchain_digest: str, where: str, vouched: Mapping[str, list]) -> dict[str, dict]:
    """Every entry of the closure that ``need`` names, verified, into the local store (only those a
    trusted builder vouched for when the session checks: the rest are looked up key by key)."""
    from gemmar_aot.compiler.derive import is_current
    from gemmar_aot.store.backend import record_launcher
    from gemmar_aot.store.store_errors import StoreError

    kernels = lock.kernels()
    if lock.toolchain.digest != toolchain_digest:
        raise ClosureRefused(f"{where}: its lock was built with toolchain {lock.toolchain.digest[:16]}, this "
                             f"build's is {toolchain_digest[:16]}")
    if source == "exact" and (lock.manifest.sha256 != manifest_sha256 or set(kernels) != all_keys):
        raise ClosureRefused(f"{where}: its lock is not this manifest's (manifest sha256 "
                             f"{lock.manifest.sha256[:16]}, {len(kernels)} kernels): the entry was written for "
                             f"another closure")
    take = {k: e for k, e in kernels.items() if k in need}
    if not take:
        return {}
    recs = index.records(((k, e.record, e.blob.hash) for k, e in take.items()), whole=True)
    bad = sorted(k for k, r in recs.items() if not isinstance(r, dict)
                 or r.get("blob") != take[k].blob.to_json())
    if bad or len(recs) != len(take):
        raise ClosureRefused(f"{where}: its record index does not hold the records its lock names (first: "
                             f"{(bad or sorted(set(take) - set(recs)))[0][:16]})")
    recs = {k: ({**r, FIELD: vouched[k]} if vouched.get(k) else r) for k, r in recs.items()}
    check = session.vouch_check
    if check is not None:  # a record no trusted builder signed is not taken from here
        recs = {k: r for k, r in recs.items() if check(k, r, take[k].record) is not None}  # digests verified above
        take = {k: e for k, e in take.items() if k in recs}
        if not take:
            return {}
    local = session.writer.local
    out: dict[str, dict] = {}
    try:
        codes = {k: reader.load_blob(e.blob.hash, e.blob.size) for k, e in take.items()}
        launchers = {}
        for k in take:
            ln = record_launcher(recs[k])
            # A launcher its producer's store lacked is not in the pack: the entry is still
            # served, degraded (``verify`` says so; a remote can mend it).
            if ln is not None and ln.hash not in launchers and reader.contains_blob(ln.hash):
                launchers[ln.hash] = reader.load_blob(ln.hash, ln.size)
    except StoreError as e:
        raise ClosureRefused(f"{where}: {e}") from None
    from gemmar_aot.compiler.derive import whole_object_arch
    from gemmar_aot.compiler.derive_check import derivation_problems, kernel_label

    for k, rec in recs.items():
        ln = record_launcher(rec)
        whole = ln is None and whole_object_arch(rec) is not None  # mori loads it whole: no launcher
        wrong = (derivation_problems(rec, codes[k], None if whole else launchers[ln.hash])
                 if is_current(rec) and (whole or (ln is not None and ln.hash in launchers)) else [])
        if wrong:
            raise ClosureRefused(f"{where}: the record of {kernel_label(rec)} ({k[:16]}) contradicts its own blobs: "
                                 + "; ".join(wrong))
    from gemmar_aot.util.canonical_json import canonical_json_line

    for data in launchers.values():
        local.put_blob(data)

    def put(k: str) -> None:
        local.put_blob(codes[k])  # blobs before record
        # The record's compact canonical JSON (C speed): the indented file form is encoded in pure
        # Python, which was most of taking a closure in. Readers take either form.
        local.put_record_json(k, canonical_json_line(recs[k]), recs[k])

    current = [k for k, rec in recs.items() if is_current(rec)]  # else: the per-key path re-derives it
    # One thread: measured, 2 or 4 writer threads took 1.6x as long on 2 cores (the GIL-held share).
    for k in current:
        put(k)
    for k in current:
        out[k] = recs[k]
    return out


def upload_closure(session: Any, st: Any, lock: Lock, index_bytes: bytes, records: Iterable[Mapping[str, Any]], *,
                   exact: str, latest: str) -> dict:
    """Upload the closure of ``lock`` (its code objects, and the launchers its ``records`` name,
    from the local store ``st``) as ``exact`` and as ``latest``. Returns what was sent; a failure
    is counted by the session, never raised."""
    from gemmar_aot.store.backend import record_launcher
    from gemmar_aot.store.remote import reapi
    from gemmar_aot.store.pack_encode import pack_closure

    backend = session.backend
    if not backend.writable or backend.down:
        return {"uploaded": False}
    try:
        lock_bytes = lock.to_bytes()
        records = list(records)
        signed = {r["key"]: v for r in records if (v := vouches(r))}
        vouched = canonical_json(signed).encode() if signed else None
        raws = {e.blob.hash: st.load_blob(e.blob.hash) for e in lock.kernels().values()}
        lns = {ln.hash: ln.size for ln in map(record_launcher, records) if ln is not None}
        launchers = {d: st.load_blob(d, size) for d, size in lns.items() if st.has_blob(d)}
        lock_d, index_d = Digest.of(lock_bytes), Digest.of(index_bytes)
        extra = {lock_d.hash: lock_bytes, index_d.hash: index_bytes}
        outputs = [(LOCK_PATH, lock_d, lock_bytes), (INDEX_PATH, index_d, index_bytes)]
        if vouched is not None:
            vouched_d = Digest.of(vouched)
            extra[vouched_d.hash] = vouched
            outputs.append((VOUCHES_PATH, vouched_d, vouched))
        pack = pack_closure(raws, extra, launchers=launchers)
        pack_d = Digest.of(pack)
        outputs.insert(0, (PACK_PATH, pack_d, pack))
        for _path, d, data in outputs:
            backend.client.put("cas", d.hash, data)  # outputs before the entry that names them
        ar = reapi.encode_action_result(reapi.ActionResult(tuple(reapi.OutputFile(path, d)
                                                                 for path, d, _data in outputs)))
        backend.client.put("ac", exact, ar)
        backend.client.put("ac", latest, ar)
    except Exception as e:  # noqa: BLE001 - a failed upload costs the next runner a per-key build
        session.problem("closure upload", e)
        return {"uploaded": False, "problem": str(e)}
    return {"uploaded": True, "pack_bytes": len(pack), "pack": pack_d.hash, "launchers": len(launchers),
            "launchers_missing": len(lns) - len(launchers), "vouched": len(signed)}


def closure_keys(manifest, sha: str, profile: str, toolchain_digest: str, all_keys: set[str]) -> tuple[str, str]:
    """(exact, latest): the action keys of this build's closure entry and of its manifest's newest."""
    from gemmar_aot.compiler.keys import derive_code_digest

    return (closure_key(manifest={"name": manifest.name, "sha256": sha}, profile=profile,
                        toolchain_digest=toolchain_digest, keys=all_keys, derive_code=derive_code_digest()),
            latest_key(manifest_name=manifest.name, profile=profile, toolchain_digest=toolchain_digest))


def closure_lookup(session, closure_keys: tuple[str, str], manifest_sha: str, toolchain_digest: str,
                    all_keys: set[str], missing: list[str]) -> dict:
    """Ask for the closure when anything is missing locally (else only whether the remote holds
    it: then nothing needs backfilling and nothing uploading). The summary's ``closure``."""
    exact, latest = closure_keys
    if not missing:  # only whether the remote holds it; the build's first request, so its probe
        present = session.first_request(lambda: session.backend.client.head("ac", exact))
        return {"key": exact, "status": "local", "present": bool(present), "records": {}, "entries": 0}
    got = fetch_closure(session, exact=exact, latest=latest, all_keys=all_keys, need=set(missing),
                        manifest_sha256=manifest_sha,
                        toolchain_digest=toolchain_digest)
    # present: the remote's closure serves this build whole (one that held entries no trusted builder
    # signed is not: this build uploads its own over it)
    present = got.status == "hit" and len(got.records) == len(missing)
    return {"key": exact, **got.summary(), "present": present, "records": got.records}
