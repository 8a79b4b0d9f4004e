"""The artifact store: never a stale, partial or corrupt kernel; writes atomic; each key compiled once."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemmar_aot.model.lock import Lock
from gemmar_aot.model.types import LaunchEntry, LockTuple, RankLaunches, TupleId
from gemmar_aot.store.record import record_digest
from gemmar_aot.util.errors import GemmarError
from gemmar_aot.store import Digest, STORE_FORMAT, BlobNotFoundError, CorruptArtifactError, LockFileError, Store, StoreFormatError, default_store_root
from gemmar_aot.model.lock import read_lock, write_lock
from gemmar_aot.model.schema import LOCK_SCHEMA
from gemmar_aot.store import blobfmt, dictionaries, gc, inventory, transfer

REPO = Path(__file__).resolve().parents[1]


def key_of(name: str) -> str:
    return hashlib.sha256(f"key:{name}".encode()).hexdigest()


def code_object(i: int, size: int = 6000) -> bytes:
    """Near-identical fake code objects: one body, a few patched "immediates" per i."""
    body = bytearray(random.Random(1234).randbytes(size))
    rng = random.Random(i)
    for _ in range(8):
        off = rng.randrange(size - 4)
        body[off:off + 4] = rng.randbytes(4)
    return b"\x7fELF" + bytes(body)


def fields(i: int) -> dict:
    return {"metadata": {"name": f"k{i}", "vgpr_count": 64}, "launch": {"kernel": f"k{i}", "grid": [1, 1, 1]},
            "ingredients": {"spec": f"s{i}", "toolchain": "t"}}


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    off = len(data) // 2 if offset is None else offset
    data[off] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "store", durable=False)


# ---- basics ----

def test_put_get_round_trip(store):
    k = key_of("a")
    assert store.get_record(k) is None
    assert store.load(k) is None
    code = code_object(1)
    rec = store.put(k, code, fields(1))
    assert rec["blob"] == {"hash": hashlib.sha256(code).hexdigest(), "size": len(code)}
    got = Store(store.root).get_record(k)  # a fresh instance (another process's view)
    assert got == rec
    assert got["metadata"] == fields(1)["metadata"] and got["ingredients"] == fields(1)["ingredients"]
    assert store.load_blob(rec["blob"]["hash"], rec["blob"]["size"]) == code
    assert store.load(k) == (rec, code)
    assert (store.root / "STORE_FORMAT").read_text() == f"{STORE_FORMAT}\n"
    # The layout: fanned out by the first two hex digits.
    assert store.record_path(k) == store.root / "ac" / k[:2] / f"{k}.json.zst"
    assert store.blob_path(rec["blob"]["hash"]).parent.name == rec["blob"]["hash"][:2]


def test_a_record_of_schema_1_is_read_as_a_stale_record_of_schema_2_and_never_written(store):
    """Record schema 1 spelled a record's blobs ``{"digest", "size"}``; schema 2 spells every digest
    as the lock does. A schema-1 record in a user's store is not damage: it reads as schema 2 with
    its derive stamp cleared (a build derives it again, zero compiles), verify and export take it,
    and no backend writes one."""
    from gemmar_aot.compiler.derive import is_current
    from gemmar_aot.store.backend import BadRecord, RECORD_SCHEMA

    k = key_of("old")
    new = store.put(k, code_object(1), fields(1), launcher=b"launcher bytes")
    assert new["schema"] == RECORD_SCHEMA == 2 and set(new["blob"]) == set(new["launcher"]) == {"hash", "size"}
    old = {**new, "schema": 1, "derive": {"code": "c" * 64, "key": "d" * 64},
           "blob": {"digest": new["blob"]["hash"], "size": new["blob"]["size"]},
           "launcher": {"digest": new["launcher"]["hash"], "size": new["launcher"]["size"]}}
    store.local.write_file(store.record_path(k), store.local.encode_record(old))  # as gemmar-aot 20a7e08 wrote it
    got = Store(store.root).get_record(k, verify=True)
    assert got == {**new, "derive": {"code": None, "key": "d" * 64}} and not is_current(got)
    health = inventory.verify(Store(store.root))
    assert health.damage == [] and store.record_path(k).is_file(), health.damage
    with pytest.raises(BadRecord, match="record schema 1, expected 2"):
        store.local.put_record(k, old)
    # anything else is what it was: a record of another key, or of another schema, is damage
    store.local.write_file(store.record_path(k), store.local.encode_record({**old, "key": key_of("other")}))
    assert Store(store.root).get_record(k) is None
    store.local.write_file(store.record_path(k), store.local.encode_record({**old, "schema": 3}))
    assert Store(store.root).get_record(k) is None


def test_reading_never_creates_a_store(tmp_path):
    s = Store(tmp_path / "nothing")
    assert s.get_record(key_of("x")) is None
    assert not (tmp_path / "nothing").exists()
    with pytest.raises(BlobNotFoundError, match="not in the store"):
        s.load_blob("0" * 64)


def test_identical_outputs_are_stored_once(store):
    code = code_object(7)
    r1 = store.put(key_of("one"), code, fields(1))
    r2 = store.put(key_of("two"), code, fields(2))
    assert r1["blob"] == r2["blob"]
    st = inventory.stats(store)
    assert st["entries"] == 2 and st["blobs"] == 1 and st["raw_bytes"] == len(code)
    assert len(list((store.root / "blobs").rglob("*.zst"))) == 1


def test_reserved_fields_and_bad_keys_are_refused(store):
    with pytest.raises(ValueError, match="reserved"):
        store.put(key_of("a"), b"x", {"blob": 1})
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.get_record("../../etc/passwd")
    with pytest.raises(ValueError, match="not JSON-able"):
        store.put(key_of("a"), b"x", {"metadata": {1.5j}})


def test_claim_hit_and_miss(store):
    k = key_of("c")
    with store.claim(k) as c:
        assert c.hit is None
        c.put(code_object(3), fields(3))
    with store.claim(k) as c:
        assert c.hit is not None and c.hit["key"] == k
    assert store.counters["misses"] == 1 and store.counters["hits"] == 1


# ---- concurrency ----

def _builder(root: str, keys: list[str], markers: str, seed: int) -> None:
    store = Store(root)
    order = list(keys)
    random.Random(seed).shuffle(order)
    for k in order:
        with store.claim(k) as c:
            if c.hit is None:
                # "compile": leave a marker per compile, take a little while.
                Path(markers, f"{k}.{os.getpid()}").write_text("compiled")
                time.sleep(0.02)
                i = keys.index(k)
                c.put(code_object(i % 5), fields(i))  # some keys share outputs


def test_concurrent_builders_compile_each_key_once(tmp_path):
    root = tmp_path / "store"
    markers = tmp_path / "markers"
    markers.mkdir()
    keys = [key_of(f"conc{i}") for i in range(12)]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_builder, args=(str(root), keys, str(markers), seed)) for seed in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    compiled = sorted(m.name.split(".")[0] for m in markers.iterdir())
    assert compiled == sorted(keys), "every key compiled exactly once"
    store = Store(root)
    assert inventory.verify(store).clean
    for i, k in enumerate(keys):
        rec, code = store.load(k)
        assert code == code_object(i % 5)
    assert inventory.stats(store)["blobs"] == 5


def _killed_writer(root: str, key: str, stage: str, flag: str) -> None:
    """Start a put and hang at ``stage`` (after telling the parent) until SIGKILLed."""
    import gemmar_aot.store._fs as fs

    real_fsync, real_replace = os.fsync, os.replace

    def hang():
        Path(flag).write_text(stage)
        time.sleep(600)

    def fsync(fd):  # mid-write of the blob: temp file written, not yet renamed
        if stage == "blob" and ".zst." in os.readlink(f"/proc/self/fd/{fd}"):
            hang()
        real_fsync(fd)

    def replace(src, dst):  # blob published, record not yet
        if stage == "record" and str(dst).endswith(".json.zst"):
            hang()
        real_replace(src, dst)

    store = Store(root)
    store.init()
    fs.os.fsync = fsync  # (fs.os is os: the patch is process-wide, this process does nothing else)
    fs.os.replace = replace
    store.put(key, code_object(42, size=2_000_000), fields(42))


@pytest.mark.parametrize("stage", ["blob", "record"])
def test_sigkill_mid_write_leaves_no_partial_entry(tmp_path, stage):
    root = tmp_path / "store"
    flag = tmp_path / "flag"
    k = key_of("killed")
    p = mp.get_context("spawn").Process(target=_killed_writer, args=(str(root), k, stage, str(flag)))
    p.start()
    deadline = time.time() + 60
    while not flag.exists():
        assert time.time() < deadline and p.is_alive(), "writer never reached the kill point"
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert p.exitcode == -signal.SIGKILL

    store = Store(root)
    assert store.get_record(k) is None
    assert inventory.ls(store) == []
    assert inventory.verify(store).clean  # temp debris is not an entry, so not a problem
    temps = [f for f in root.rglob("*.tmp")]
    # The kill hit where it was meant to: the blob's temp file, or the record's after the blob.
    assert [t.name.split(".")[2] for t in temps] == ["zst" if stage == "blob" else "json"]
    digest = hashlib.sha256(code_object(42, size=2_000_000)).hexdigest()
    assert store.has_blob(digest) == (stage == "record")
    # A subsequent build completes the entry.
    with store.claim(k) as c:
        assert c.hit is None
        c.put(code_object(42, size=2_000_000), fields(42))
    assert store.load(k)[1] == code_object(42, size=2_000_000)
    lock_file = root / "locks" / "smoke.lock.json"  # the build keeps its lock files here
    from synth_lock import synthetic_lock

    write_lock(lock_file, synthetic_lock())
    report = gc.gc(store, keep_blobs=set(), stale_s=0)
    assert report["removed_temp_files"] == len(temps)
    assert report["removed_claim_files"] == 1 and lock_file.exists()  # the per-key build claim only
    assert not list((root / "locks").glob("??/*")) and not list((root / "claims").rglob("*.claim"))
    assert not list(root.rglob("*.tmp"))
    assert store.load(k) is not None


def test_a_killed_builds_compile_directories_are_not_damage_and_gc_removes_the_stale_ones(tmp_path):
    """work/ holds a directory per compile in flight; one a build killed outright left (the whole
    tree killed at once) is debris: verify stays clean, gc removes it once stale, never a fresh one."""
    root = tmp_path / "store"
    store = Store(root)
    store.put(key_of("kept"), code_object(1), fields(1))
    old, fresh = store.work_dir / "hipcc-ep_intranode-abc", store.work_dir / "hipcc-cast_kernel-def"
    for d in (old, fresh):
        (d / ".stage-x").mkdir(parents=True)
        (d / ".stage-x" / "ep.o").write_bytes(b"half a clang temporary")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert inventory.verify(store).clean
    assert gc.gc(store, keep_blobs=set(), dry_run=True)["removed_temp_files"] == 1 and old.is_dir()
    report = gc.gc(store, keep_blobs=set())
    assert report["removed_temp_files"] == 1
    assert not old.exists() and fresh.is_dir() and store.load(key_of("kept")) is not None


# ---- corruption ----

def test_flipped_byte_is_detected_quarantined_and_becomes_a_miss(store):
    k = key_of("flip")
    code = code_object(5)
    rec = store.put(k, code, fields(5))
    path = store.blob_path(rec["blob"]["hash"])
    flip_byte(path)
    with pytest.raises(CorruptArtifactError) as ei:
        store.load_blob(rec["blob"]["hash"], rec["blob"]["size"])
    assert str(path) in str(ei.value)
    assert isinstance(ei.value, GemmarError)
    assert not path.exists()
    q = [f for f in (store.root / "quarantine").iterdir()]
    assert any(f.name.endswith(".zst") for f in q) and any(f.name.endswith(".reason") for f in q)
    assert store.get_record(k) is None  # the record is a miss now
    with store.claim(k) as c:  # so the next build recompiles
        assert c.hit is None
        c.put(code, fields(5))
    assert store.load(k)[1] == code


def test_valid_zstd_of_other_bytes_is_caught_by_the_digest(store):
    rec = store.put(key_of("swap"), code_object(1), fields(1))
    path = store.blob_path(rec["blob"]["hash"])
    other = code_object(2)
    path.write_bytes(blobfmt.compressor(3).compress(other))  # decodes fine, wrong content
    with pytest.raises(CorruptArtifactError, match="sha256"):
        store.load_blob(rec["blob"]["hash"], rec["blob"]["size"])
    assert store.get_record(key_of("swap")) is None


def _streamed(raw: bytes, max_size: int):
    """The oracle: what zstd's streaming decoder reads from ``raw`` -- the first frame and the bytes
    after it -- or why it refuses (the kinds of ``blobfmt.FrameError``)."""
    try:
        p = zstandard.get_frame_parameters(raw)
        if not p.has_checksum or p.content_size in (0, zstandard.CONTENTSIZE_UNKNOWN) or p.content_size > max_size:
            return "unchecked"
        d = zstandard.ZstdDecompressor().decompressobj()
        text = d.decompress(raw)
        return (text, d.unused_data) if d.eof and len(text) == p.content_size else "truncated"
    except zstandard.ZstdError:
        return "damaged"


def test_a_frame_is_read_as_the_streaming_decoder_reads_it_without_streaming(monkeypatch):
    """``checked_frame`` finds the frame by its block headers and decodes it in one call: for any
    bytes -- several blocks, raw and RLE blocks, another frame or bytes after it, truncated, one
    byte changed anywhere (block headers too) -- it gives what zstd's streaming decoder gives, or
    refuses with the kind it would. A whole frame, with or without bytes after it, never streams."""
    rng = random.Random(7)
    cctx = zstandard.ZstdCompressor(level=19, write_checksum=True, write_content_size=True)
    bodies = {"text": bytes(range(256)) * 600 + b"tail" * 1000, "zeros": bytes(300_000),
              "random": rng.randbytes(200_000), "mixed": rng.randbytes(5000) + bytes(140_000) + b"ab" * 9000}
    cases = {}
    for name, body in bodies.items():
        frame = cctx.compress(body)
        cases[name] = frame
        cases[name + "+bytes"] = frame + b"next"
        cases[name + "+frame"] = frame + cctx.compress(b"second")
        cases[name + " truncated"] = frame[:-7]
        cases[name + " header only"] = frame[:12]
        for i in range(40):
            b = bytearray(frame)
            b[rng.randrange(min(len(frame), 64)) if i % 2 else rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
            cases[f"{name} flip {i}"] = bytes(b)
    cases["unchecked"] = zstandard.ZstdCompressor(write_checksum=False).compress(b"x" * 1000)
    cases["too large"] = cctx.compress(b"x" * 5000)
    for name, raw in cases.items():
        max_size = 4000 if name == "too large" else 1 << 20
        try:
            got = blobfmt.checked_frame(raw, max_size)
        except blobfmt.FrameError as exc:
            got = exc.kind
        assert got == _streamed(raw, max_size), name
    streamed = []
    real = zstandard.ZstdDecompressor.decompressobj
    monkeypatch.setattr(zstandard.ZstdDecompressor, "decompressobj",
                        lambda self, *a, **k: streamed.append(1) or real(self, *a, **k))
    for name in bodies:
        for raw in (cases[name], cases[name + "+bytes"], cases[name + "+frame"]):
            blobfmt.checked_frame(raw, 1 << 20)
    assert not streamed


def test_wrong_size_from_the_caller_is_refused_without_harming_the_blob(store):
    rec = store.put(key_of("size"), code_object(1), fields(1))
    with pytest.raises(CorruptArtifactError, match="intact"):
        store.load_blob(rec["blob"]["hash"], rec["blob"]["size"] + 1)
    assert store.load_blob(rec["blob"]["hash"], rec["blob"]["size"]) == code_object(1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=4096))
def test_any_bytes_round_trip(store, data):
    rec = store.put(hashlib.sha256(b"h" + data).hexdigest(), data, {"n": len(data)})
    assert Store(store.root).load_blob(rec["blob"]["hash"], len(data)) == data


def test_claim_verifies_a_hit_and_recompiles_a_corrupt_one(store):
    k = key_of("claimcorrupt")
    rec = store.put(k, code_object(9), fields(9))
    flip_byte(store.blob_path(rec["blob"]["hash"]))
    with store.claim(k) as c:
        assert c.hit is None


def test_unreadable_record_is_quarantined_and_a_miss(store):
    k = key_of("badjson")
    store.put(k, code_object(1), fields(1))
    store.record_path(k).write_text('{"schema": 1, "key": ')
    assert store.get_record(k) is None
    assert not store.record_path(k).exists()
    assert any("ac-" in f.name for f in (store.root / "quarantine").iterdir())


def test_verify_reports_and_quarantines_every_bad_blob(store):
    recs = [store.put(key_of(f"v{i}"), code_object(i), fields(i)) for i in range(4)]
    assert inventory.verify(store).clean
    bad = store.blob_path(recs[2]["blob"]["hash"])
    flip_byte(bad)
    problems = inventory.verify(store).damage
    assert [(p["kind"], p["path"]) for p in problems] == [
        ("blob", str(bad)), ("record", str(store.record_path(key_of("v2"))))]
    assert problems[0]["quarantined_to"] and "missing" in problems[1]["problem"]
    assert store.get_record(key_of("v2")) is None
    assert store.get_record(key_of("v1")) is not None
    # The dangling record stays reported (it is a miss) until gc removes it.
    assert [p["kind"] for p in inventory.verify(store).damage] == ["record"]
    assert gc.gc(store, keep_blobs=set())["removed_record_reasons"] == {"blob missing": 1}
    assert inventory.verify(store).clean


# ---- gc ----

def test_gc_keeps_every_referenced_entry_and_removes_the_rest(store):
    recs = {i: store.put(key_of(f"g{i}"), code_object(i), fields(i)) for i in range(6)}
    keep_keys = {key_of("g0"), key_of("g1")}
    keep_blobs = {recs[2]["blob"]["hash"]}  # a lock needs g2's blob (not its record)
    report = gc.gc(store, keep_blobs=keep_blobs, keep_keys=keep_keys)
    assert report["removed_records"] == 4 and report["removed_blobs"] == 3
    assert {r["key"] for r in inventory.ls(store)} == keep_keys
    for i in (0, 1, 2):
        assert store.load_blob(recs[i]["blob"]["hash"]) == code_object(i)
    for i in (3, 4, 5):
        assert not store.has_blob(recs[i]["blob"]["hash"])
    assert inventory.verify(store).clean


def test_gc_lru_cap_and_age(store):
    recs = {i: store.put(key_of(f"l{i}"), code_object(i, size=20000), fields(i)) for i in range(5)}
    now = time.time()
    for i in range(5):  # l0 is the least recently used
        os.utime(store.record_path(key_of(f"l{i}")), (now - 86400 * (10 - i), now - 86400 * (10 - i)))
    protected = recs[0]["blob"]["hash"]
    report = gc.gc(store, keep_blobs={protected}, max_age_days=7.5, now=now)  # l0..l2 are older than 7.5 days
    assert report["removed_record_reasons"] == {"unused for more than 7.5 days": 2}
    assert store.get_record(key_of("l0")) is not None  # protected by keep_blobs
    assert store.get_record(key_of("l1")) is None and store.get_record(key_of("l2")) is None
    one = inventory.stats(store)["total_bytes"] // 3
    report = gc.gc(store, keep_blobs={protected}, max_bytes=2 * one, now=now)
    assert report["removed_records"] == 1 and not report["over_budget"]
    assert store.get_record(key_of("l3")) is None  # the LRU unprotected one went first
    assert store.get_record(key_of("l4")) is not None
    dry = gc.gc(store, keep_blobs=set(), keep_keys=set(), dry_run=True)
    assert dry["removed_records"] == 2 and len(inventory.ls(store)) == 2


def test_get_record_hit_refreshes_the_lru_clock(store):
    k = key_of("touch")
    store.put(k, code_object(1), fields(1))
    old = time.time() - 86400
    os.utime(store.record_path(k), (old, old))
    Store(store.root).get_record(k)
    assert store.record_path(k).stat().st_mtime > old + 3600
    os.utime(store.record_path(k), (old, old))
    Store(store.root, touch=False).get_record(k)
    assert store.record_path(k).stat().st_mtime == pytest.approx(old)


# ---- dictionary ----

def test_dictionary_training_repack_and_verified_loads(store):
    recs = [store.put(key_of(f"d{i}"), code_object(i), fields(i)) for i in range(40)]
    plain = inventory.stats(store)["compressed_bytes"]
    report = dictionaries.optimize(store)
    assert report["trained"] and report["repacked"] == 40
    st = inventory.stats(store)
    assert st["dictionaries"] == 1 and st["compressed_bytes"] + st["dictionary_bytes"] < plain / 2
    fresh = Store(store.root)
    for i, r in enumerate(recs):
        assert fresh.load_blob(r["blob"]["hash"], r["blob"]["size"]) == code_object(i)
        data = fresh.blob_path(r["blob"]["hash"]).read_bytes()
        assert blobfmt.split(data)[0] == report["trained"]  # each blob names its dictionary
    assert st["total_bytes"] == (st["compressed_bytes"] + st["dictionary_bytes"] + st["dictionary_spare_bytes"]
                                 + st["record_bytes"])
    # New blobs use the dictionary; gc keeps it even with nothing else referenced.
    new = store.put(key_of("d-new"), code_object(99), fields(99))
    assert blobfmt.split(store.blob_path(new["blob"]["hash"]).read_bytes())[0] == report["trained"]
    gc.gc(store, keep_blobs={new["blob"]["hash"]}, keep_keys=set())
    assert Store(store.root).load_blob(new["blob"]["hash"]) == code_object(99)
    assert inventory.verify(store).clean
    assert dictionaries.optimize(store)["repacked"] == 0  # nothing to do the second time


def _big_fields(i: int) -> dict:
    """Record fields shaped like a build's: a large shared part (toolchain ingredients, launch
    record layout) and a few values that differ per kernel."""
    shared = {f"ingredient_{j:03d}": hashlib.sha256(f"tool{j}".encode()).hexdigest() for j in range(60)}
    return {"ingredients": {**shared, "spec": key_of(f"spec{i}")},
            "metadata": {"name": f"kernel_{i}", "sgpr": 40 + i % 7, "vgpr": 128, "lds": 65536},
            "launch": {"kernel": f"kernel_{i}", "args": [{"kind": "tensor", "index": j} for j in range(12)]},
            "compile_seconds": 0.5 + i / 100}


def test_records_get_a_dictionary_of_their_own(store):
    recs = [store.put(key_of(f"rd{i}"), code_object(i), _big_fields(i)) for i in range(40)]
    before = inventory.stats(store)["record_bytes"]
    report = dictionaries.optimize(store)
    assert report["trained_records"] and report["records_repacked"] == 40
    st = inventory.stats(store)
    assert st["record_bytes"] < before / 3 and st["current_record_dictionary"] == report["trained_records"]
    fresh = Store(store.root)
    for i, r in enumerate(recs):
        assert fresh.get_record(key_of(f"rd{i}")) == r
        assert blobfmt.split(fresh.record_path(key_of(f"rd{i}")).read_bytes())[0] == report["trained_records"]
    # new records use it; gc keeps it (records name it); verify finds nothing wrong
    new = fresh.put(key_of("rd-new"), code_object(77), _big_fields(77))
    assert blobfmt.split(fresh.record_path(key_of("rd-new")).read_bytes())[0] == report["trained_records"]
    gc.gc(fresh, keep_blobs={new["blob"]["hash"]}, keep_keys={key_of("rd-new")})
    assert Store(store.root).get_record(key_of("rd-new")) == new and inventory.verify(Store(store.root)).clean
    assert dictionaries.optimize(Store(store.root))["records_repacked"] == 0


def test_one_damaged_dictionary_copy_costs_nothing(store):
    recs = [store.put(key_of(f"sp{i}"), code_object(i), fields(i)) for i in range(40)]
    digest = dictionaries.optimize(store)["trained"]
    spare = store.local.spare_path(digest)
    assert spare.read_bytes() == store.blob_path(digest).read_bytes()
    flip_byte(store.blob_path(digest), 30)  # the copy every load reads first
    fresh = Store(store.root)  # cold dictionary cache: it must read the damaged copy
    for i, r in enumerate(recs):
        assert fresh.load_blob(r["blob"]["hash"], r["blob"]["size"]) == code_object(i)
    assert fresh.local.counters["dictionaries_restored"] == 1
    assert spare.read_bytes() == store.blob_path(digest).read_bytes()  # restored from the spare
    assert inventory.verify(Store(store.root)).clean
    # A damaged spare costs nothing either; verify finds it and rewrites it from the blob.
    flip_byte(spare, 30)
    assert Store(store.root).load_blob(recs[1]["blob"]["hash"]) == code_object(1)
    problems = inventory.verify(Store(store.root)).damage
    assert [p["kind"] for p in problems] == ["dictionary spare"]
    assert inventory.verify(Store(store.root)).clean


def test_corrupt_dictionary_makes_its_blobs_misses(store):
    """Both copies of the dictionary damaged: its blobs are misses, the next build recompiles."""
    for i in range(40):
        store.put(key_of(f"cd{i}"), code_object(i), fields(i))
    digest = dictionaries.optimize(store)["trained"]
    flip_byte(store.blob_path(digest), 30)
    flip_byte(store.local.spare_path(digest), 30)
    fresh = Store(store.root)
    rec = fresh.get_record(key_of("cd3"))
    with pytest.raises(CorruptArtifactError, match="dictionary"):
        fresh.load_blob(rec["blob"]["hash"])
    assert fresh.get_record(key_of("cd3")) is None
    assert fresh.current_dictionary() is None  # new blobs are written plain again
    r = fresh.put(key_of("cd3"), code_object(3), fields(3))
    assert Store(store.root).load_blob(r["blob"]["hash"]) == code_object(3)
    # The next build recompiles what the lost dictionary took with it, and retrains.
    for i in range(40):
        with fresh.claim(key_of(f"cd{i}")) as c:
            if c.hit is None:
                c.put(code_object(i), fields(i))
    # Training is deterministic: the same samples give the same (content-addressed) dictionary.
    assert dictionaries.optimize(fresh)["trained"] == digest
    assert fresh.has_blob(digest) and inventory.verify(Store(store.root)).clean
    assert Store(store.root).load(key_of("cd7"))[1] == code_object(7)


# ---- export / import ----

def _lock_for(recs: dict[str, dict], extra: tuple = ()) -> Lock:
    """A (gemm-only) lock launching the kernels of ``recs`` (key -> record), then ``extra`` entries."""
    from synth_lock import launch_record, synthetic_lock

    entries = tuple(LaunchEntry(kind="gemm", key=k, blob=Digest(r["blob"]["hash"], r["blob"]["size"]),
                                launch=launch_record(), record=record_digest(r))
                    for k, r in recs.items()) + tuple(extra)
    t = LockTuple(TupleId("gemm-only", 128, 1024, 256, 2, "mxfp8", block_m=256), "", None,
                  (RankLaunches(0, entries, ()),))
    return replace(synthetic_lock(), tuples=(t,))


@pytest.mark.parametrize("with_dictionary", [False, True])
def test_export_import_round_trip(tmp_path, store, with_dictionary):
    recs = {key_of(f"e{i}"): store.put(key_of(f"e{i}"), code_object(i), fields(i)) for i in range(40)}
    if with_dictionary:
        assert dictionaries.optimize(store)["trained"]
    wanted = dict(list(recs.items())[:5])
    lock = _lock_for(wanted)
    report = transfer.export(store, lock, tmp_path / "export")
    assert report["blobs"] == 5 and report["records"] == 5 and report["missing_records"] == []
    assert report["dictionaries"] == (1 if with_dictionary else 0)
    other = Store(tmp_path / "other", durable=False)
    imp = transfer.import_(other, tmp_path / "export")
    assert imp["records_added"] == 5
    for k, r in wanted.items():
        assert other.get_record(k) == r
        assert other.load(k)[1] == store.load(k)[1]
    assert {r["key"] for r in inventory.ls(other)} == set(wanted)
    assert inventory.verify(other).clean
    assert transfer.import_(other, tmp_path / "export")["records_added"] == 0  # idempotent


def test_import_rejects_a_tampered_blob_and_imports_nothing(tmp_path, store):
    recs = {key_of(f"t{i}"): store.put(key_of(f"t{i}"), code_object(i), fields(i)) for i in range(3)}
    transfer.export(store, _lock_for(recs), tmp_path / "export")
    exported = Store(tmp_path / "export")
    victim = exported.blob_path(next(iter(recs.values()))["blob"]["hash"])
    flip_byte(victim)
    other = Store(tmp_path / "other", durable=False)
    with pytest.raises(CorruptArtifactError) as ei:
        transfer.import_(other, tmp_path / "export")
    assert str(victim) in str(ei.value)
    assert inventory.ls(other) == [] and not list((tmp_path / "other").rglob("*.zst"))
    assert victim.exists(), "import never modifies its source"


def test_export_refuses_a_lock_whose_blob_is_missing(tmp_path, store):
    recs = {key_of("m0"): store.put(key_of("m0"), code_object(0), fields(0))}
    from synth_lock import launch_record

    lock = _lock_for(recs, extra=[LaunchEntry(kind="gemm", key=key_of("nope"), blob=Digest("ab" * 32, 4),
                                              launch=launch_record(), record=Digest("cd" * 32, 9))])
    with pytest.raises(GemmarError, match="does not have"):
        transfer.export(store, lock, tmp_path / "export")
    assert not (tmp_path / "export").exists()


# ---- format ----

@pytest.mark.parametrize("content,match", [(f"{STORE_FORMAT + 1}\n", "newer gemmar-aot"),
                                           ("banana\n", "unreadable"),
                                           ("1\n", "older gemmar-aot"),
                                           ("0\n", "unknown store format")])
def test_store_format_refusal(tmp_path, content, match):
    root = tmp_path / "s"
    Store(root, durable=False).put(key_of("f"), b"code", {})
    (root / "STORE_FORMAT").write_text(content)
    with pytest.raises(StoreFormatError, match=match):
        Store(root)


def test_format_2_store_is_migrated_on_first_write(tmp_path):
    """A format-2 store (records plain zstd, per-key build locks in locks/ab/) reads as is; the
    first write moves it to the current format and leaves the lock files in locks/ alone."""
    import zstandard

    root = tmp_path / "old"
    st = Store(root, durable=False)
    rec = st.put(key_of("m"), code_object(5), fields(5))
    # Rewrite it the way format 2 did.
    from gemmar_aot.util.canonical_json import canonical_json_bytes as canonical_json

    st.record_path(key_of("m")).write_bytes(zstandard.ZstdCompressor(level=3).compress(canonical_json(rec)))
    old_lock = root / "locks" / key_of("m")[:2] / f"{key_of('m')}.lock"
    old_lock.parent.mkdir(parents=True)
    old_lock.write_bytes(b"")
    manifest_lock = root / "locks" / "smoke.lock.json"
    from synth_lock import synthetic_lock

    write_lock(manifest_lock, synthetic_lock())
    (root / "STORE_FORMAT").write_text("2\n")
    ro = Store(root, readonly=True)
    assert ro.format == 2 and ro.load(key_of("m")) == (rec, code_object(5))
    st2 = Store(root, durable=False)
    st2.put(key_of("n"), code_object(6), fields(6))
    assert (root / "STORE_FORMAT").read_text() == f"{STORE_FORMAT}\n" and st2.format == STORE_FORMAT
    assert not old_lock.exists() and not old_lock.parent.exists() and manifest_lock.exists()
    assert Store(root).load(key_of("m")) == (rec, code_object(5))
    assert inventory.verify(Store(root)).clean


def test_format_3_store_reads_as_is_and_its_first_write_respells_every_digest(tmp_path):
    """Format 4 spells every digest on disk ``{"hash", "size"}``. A format-3 store -- dictionary
    pointers ``{"digest", "bytes", ...}``, records of record schema 1 -- reads as it is; its first
    write respells the pointers and writes each schema-1 record again in schema 2 (stale: the
    next build derives it again), keeping its mtime. verify is clean before and after."""
    from gemmar_aot.compiler.derive import is_current
    from gemmar_aot.store.local import DICT_POINTERS

    root = tmp_path / "old"
    st = Store(root, durable=False)
    recs = {key_of(f"d{i}"): st.put(key_of(f"d{i}"), code_object(i), fields(i)) for i in range(40)}
    codes = {key_of(f"d{i}"): code_object(i) for i in range(40)}
    samples = [code_object(i) for i in range(40)] * 3
    for kind in DICT_POINTERS:
        st.local.set_dictionary(zstandard.train_dictionary(4096, samples).as_bytes(), kind=kind, trained_on=40)
    # Rewrite it the way format 3 did: records, then pointers, spelled {"digest", ...}.
    old_mtime = {}
    for k, rec in recs.items():
        old = {**rec, "schema": 1, "blob": {"digest": rec["blob"]["hash"], "size": rec["blob"]["size"]}}
        st.local.write_file(st.record_path(k), st.local.encode_record(old))
        os.utime(st.record_path(k), (1_000_000_000, 1_000_000_000))
        old_mtime[k] = st.record_path(k).stat().st_mtime_ns
    pointers = {}
    for kind, name in DICT_POINTERS.items():
        info = json.loads((root / name).read_bytes())
        pointers[kind] = {"digest": info["hash"], "bytes": info["size"], "trained_on": 40, "level": info["level"]}
        (root / name).write_text(json.dumps(pointers[kind]))
    (root / "STORE_FORMAT").write_text("3\n")
    ro = Store(root, readonly=True)
    assert ro.format == 3 and ro.dictionary_info("records")["hash"] == pointers["records"]["digest"]
    k0 = key_of("d0")
    assert ro.load(k0)[1] == code_object(0) and ro.get_record(k0)["blob"] == recs[k0]["blob"]
    assert inventory.verify(Store(root)).clean and (root / "STORE_FORMAT").read_text() == "3\n"  # only read
    # repack's step re-encodes a record's text byte for byte: a schema-1 record stays one until migrated
    text = ro.local.codec.decode_frame_only(ro.record_path(k0).read_bytes())
    st.local.write_file(st.record_path(k0), zstandard.ZstdCompressor(level=-100).compress(text))  # barely
    assert Store(root, durable=False).local.reencode_record(k0, pointers["records"]["digest"]) is not None
    assert ro.local.codec.decode_frame_only(ro.record_path(k0).read_bytes()) == text and b'"digest"' in text
    os.utime(st.record_path(k0), ns=(old_mtime[k0], old_mtime[k0]))
    Store(root, durable=False).put(key_of("new"), code_object(99), fields(99))  # the first write
    assert (root / "STORE_FORMAT").read_text() == f"{STORE_FORMAT}\n"
    for kind, name in DICT_POINTERS.items():
        assert json.loads((root / name).read_bytes()) == {"hash": pointers[kind]["digest"],
                                                         "size": pointers[kind]["bytes"], "trained_on": 40,
                                                         "level": pointers[kind]["level"]}
    fresh = Store(root)
    assert fresh.current_dictionary("records") == pointers["records"]["digest"]
    for k, rec in recs.items():
        on_disk = json.loads(fresh.local.codec.decode_frame_only(fresh.record_path(k).read_bytes()))
        assert on_disk == {**rec, "derive": {"code": None}} and not is_current(on_disk)
        assert fresh.record_path(k).stat().st_mtime_ns == old_mtime[k], "gc's LRU clock kept"
        assert fresh.load(k)[1] == codes[k]
    assert inventory.verify(fresh).clean


def test_layered_remote_reads_through_and_writes_through(tmp_path):
    """The backend seam: a second store directory as the remote (what a shared NFS cache is)."""
    from gemmar_aot.store.local import DirectoryBackend

    remote = DirectoryBackend(tmp_path / "remote", durable=False)
    a = Store(tmp_path / "a", durable=False, remote=remote)
    rec = a.put(key_of("r"), code_object(9), fields(9))
    assert a.counters["uploads"] == 1 and remote.get_record(key_of("r")) == rec  # write-through
    assert remote.find_missing_blobs([Digest(rec["blob"]["hash"], rec["blob"]["size"]), Digest("0" * 64, 1)]) == {Digest("0" * 64, 1)}
    b = Store(tmp_path / "b", durable=False, remote=remote)
    assert b.get_record(key_of("r"), verify=True) == rec and b.counters["remote_hits"] == 1
    assert Store(tmp_path / "b").load(key_of("r")) == (rec, code_object(9))  # read-through kept it
    # A record whose blob the remote lacks is a miss, not an error.
    rec2 = a.put(key_of("r2"), code_object(10), fields(10))
    remote.blob_path(rec2["blob"]["hash"]).unlink()
    assert b.get_record(key_of("r2")) is None and b.counters["remote_record_without_blob"] == 1
    # A remote blob that does not hash to its name is refused and never reaches the local store.
    rec3 = a.put(key_of("r3"), code_object(11), fields(11))
    flip_byte(remote.blob_path(rec3["blob"]["hash"]))
    assert b.get_record(key_of("r3")) is None and not b.has_blob(rec3["blob"]["hash"])
    assert b.counters["remote_errors"] >= 1


def test_store_dirs_without_format_file_are_refused(tmp_path):
    (tmp_path / "s" / "ac").mkdir(parents=True)
    with pytest.raises(StoreFormatError, match="no STORE_FORMAT"):
        Store(tmp_path / "s")


def test_unknown_blob_header_is_corrupt(store):
    rec = store.put(key_of("hdr"), b"payload", {})
    p = store.blob_path(rec["blob"]["hash"])
    p.write_bytes(b"\x50\x2a\x4d\x18" + b"\x04\x00\x00\x00abcd" + p.read_bytes())
    with pytest.raises(CorruptArtifactError, match="skippable"):
        store.load_blob(rec["blob"]["hash"])


# ---- lock files ----

def test_lock_file_is_deterministic_and_validated(tmp_path):
    from synth_lock import synthetic_lock

    lock = synthetic_lock()
    doc = lock.to_json()
    reordered = json.loads(json.dumps(doc, sort_keys=True), object_pairs_hook=lambda kv: dict(reversed(kv)))
    assert Lock.from_json(reordered).to_bytes() == lock.to_bytes()
    assert lock.to_bytes().endswith(b"\n")
    write_lock(tmp_path / "x.lock.json", lock)
    write_lock(tmp_path / "y.lock.json", Lock.from_json(reordered))
    assert (tmp_path / "x.lock.json").read_bytes() == (tmp_path / "y.lock.json").read_bytes()
    assert read_lock(tmp_path / "x.lock.json").check_parts() == lock
    assert not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]
    assert lock.blob_digests() == {e.blob.hash for _w, e in lock.iter_launches()} and len(lock.blob_digests()) > 1
    assert lock.action_keys() == {e.key for _w, e in lock.iter_launches()}


def test_lock_file_refusals(tmp_path):
    from lock_docs import write_doc
    from synth_lock import synthetic_lock

    p = tmp_path / "l.json"
    p.write_text(json.dumps({"schema": LOCK_SCHEMA + 1}))
    with pytest.raises(LockFileError, match="newer"):
        read_lock(p).check_parts()
    p.write_text(json.dumps({"launches": []}))
    with pytest.raises(LockFileError, match="schema"):
        read_lock(p).check_parts()
    doc = synthetic_lock().to_json()
    next(iter(doc["parts"][0]["kernels"].values()))["blob"]["hash"] = "nothex"
    write_doc(p, doc)
    with pytest.raises(LockFileError, match="expected a sha256"):
        read_lock(p).check_parts()
    with pytest.raises(LockFileError, match="no lock file"):
        read_lock(tmp_path / "absent.json").check_parts()


# ---- runtime hygiene and root selection ----

def test_runtime_import_needs_no_build_side_modules(tmp_path):
    store = Store(tmp_path / "s", durable=False)
    rec = store.put(key_of("rt"), code_object(1), fields(1))
    code = (
        "import sys\n"
        "from gemmar_aot.store import Store\n"
        f"s = Store({str(tmp_path / 's')!r}, readonly=True)\n"
        f"assert s.load_blob({rec['blob']['hash']!r}) == {code_object(1)!r}\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('filelock', 'torch', 'flydsl', 'mori', 'mlir')"
        " or m.startswith(('gemmar_aot.compiler', 'gemmar_aot.toolchain', 'gemmar_aot_kernels'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


def test_default_store_root(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMAR_AOT_STORE", str(tmp_path / "env"))
    assert default_store_root(str(tmp_path / "x")) == tmp_path / "x"
    assert default_store_root(None) == tmp_path / "env"
    monkeypatch.delenv("GEMMAR_AOT_STORE")
    assert default_store_root(None) == REPO / "artifacts"


def test_build_stats_are_reported(store):
    store.record_build_stats({"hits": 3, "misses": 1})
    assert inventory.stats(store)["last_build"] == {"hits": 3, "misses": 1}


# ---- gemmar-aot cat / show ----

def _cli(*args):
    from click.testing import CliRunner

    from gemmar_aot.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def test_cat_writes_the_verified_code_object_by_key_or_digest(store, tmp_path):
    recs = {key_of(f"cat{i}"): store.put(key_of(f"cat{i}"), code_object(i), fields(i)) for i in range(3)}
    k, rec = next(iter(recs.items()))
    digest = rec["blob"]["hash"]
    out = tmp_path / "k0.co"
    r = _cli("cat", k[:10], "-o", out, "--store", store.root)
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == code_object(0) and f"sha256 {digest}" in r.stderr
    r = _cli("cat", digest, "--store", store.root)  # the full digest, to standard output
    assert r.exit_code == 0 and r.stdout_bytes == code_object(0)
    # show names the digest and the symbol to use with it
    r = _cli("show", k[:12], "--store", store.root)
    assert r.exit_code == 0 and f"gemmar-aot cat {digest} -o k0.co" in r.output and "symbol k0" in r.output
    # refusals: not hex, unknown, too short
    for bad, msg in (("xyz!", "not a key or blob digest"), ("ffff" * 4, "starts with"), ("ab", "at least 4")):
        r = _cli("cat", bad, "--store", store.root)
        assert r.exit_code == 2 and msg in r.stderr, (bad, r.output)


def test_cat_refuses_a_corrupt_blob_and_writes_nothing(store, tmp_path):
    k = key_of("catbad")
    rec = store.put(k, code_object(5), fields(5))
    flip_byte(store.blob_path(rec["blob"]["hash"]))
    out = tmp_path / "bad.co"
    r = _cli("cat", k, "-o", out, "--store", store.root)
    assert r.exit_code == 2 and "corrupt blob" in r.stderr and not out.exists()
    assert not store.has_blob(rec["blob"]["hash"])  # quarantined: the next build recompiles it


# ---- the record a lock names ----

@pytest.mark.parametrize("with_dictionary", [False, True])
def test_read_record_named_is_the_named_record_or_nothing(store, with_dictionary):
    recs = {key_of(f"n{i}"): store.put(key_of(f"n{i}"), code_object(i), {**fields(i), "compile_seconds": 1.5 + i})
            for i in range(40)}
    if with_dictionary:
        assert dictionaries.optimize(store)["trained"]
    for k, r in recs.items():
        got = store.read_record_named(k, record_digest(r))
        assert got == {f: v for f, v in r.items() if f != "compile_seconds"}  # the named record, byte for byte
    k, r = next(iter(recs.items()))
    # another record's digest, or the same record with one field changed: not this one
    assert store.read_record_named(k, record_digest(recs[key_of("n1")])) is None
    assert store.read_record_named(k, record_digest({**r, "launch": {"kernel": "k0", "grid": [2, 1, 1]}})) is None
    assert store.read_record_named(key_of("absent"), record_digest(r)) is None


def test_a_tampered_record_is_not_the_named_one(store):
    k = key_of("t0")
    r = store.put(k, code_object(0), {**fields(0), "compile_seconds": 2.0})
    want = record_digest(r)
    store.local.put_record(k, {**r, "launch": {"kernel": "k0", "grid": [9, 1, 1]}})  # rewritten in place
    assert store.read_record_named(k, want) is None
    assert record_digest(store.read_record_file(k)) != want  # and the full path names the difference


def test_a_record_with_json_syntax_in_its_strings_is_still_the_named_one(store):
    k = key_of("s0")
    r = store.put(k, code_object(0), {**fields(0), "spec": {"note": 'a": b,"key":"x"}\x1f'}, "compile_seconds": 3.0})
    assert store.read_record_named(k, record_digest(r)) == {f: v for f, v in r.items() if f != "compile_seconds"}
    assert record_digest(store.read_record_file(k)) == record_digest(r)
