"""The artifact model: validation of lock JSON, canonical bytes, refusal of other schemas."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gemmar_aot.artifact_model import (
    _Reader,
    LOCK_SCHEMA,
    Digest,
    Lock,
    LockFileError,
    read_lock,
    record_digest,
    write_lock,
)
from synth_lock import entry, synthetic_lock

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def lock() -> Lock:
    return synthetic_lock()


@pytest.fixture
def doc(lock) -> dict:
    return json.loads(lock.to_bytes())


def _shuffled(obj, rng):
    if isinstance(obj, dict):
        items = list(obj.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(obj, list):
        return [_shuffled(v, rng) for v in obj]
    return obj


def _refuse(doc, match, where="x.lock.json"):
    with pytest.raises(LockFileError, match=match) as ei:
        Lock.from_json(doc, where)
    assert where in str(ei.value)
    return str(ei.value)


# ---- round trip and canonical bytes ----

def test_round_trip(lock, doc):
    assert doc["schema"] == LOCK_SCHEMA == 2
    back = Lock.from_json(doc)
    assert back == lock
    assert back.to_bytes() == lock.to_bytes()
    # one kernel entry per action key, one launch record per distinct record
    assert len(doc["kernels"]) == len(lock.action_keys()) == len(lock.kernels())
    assert len(doc["launch_records"]) == len({replace(e.launch, kernel="") for e in lock.kernels().values()}) \
        < len({e.launch for e in lock.kernels().values()}) < len(doc["kernels"])
    assert {k["symbol"] for k in doc["kernels"].values()} == {e.symbol for e in lock.kernels().values()}
    assert lock.blob_digests() == {e.blob.hash for e in lock.kernels().values()}


def test_canonical_bytes_do_not_depend_on_key_order(lock, doc):
    b = lock.to_bytes()
    assert b.endswith(b"\n") and b.startswith(b'{\n "arch": ')
    for seed in range(3):
        again = Lock.from_json(_shuffled(copy.deepcopy(doc), random.Random(seed)))
        assert again.to_bytes() == b


def test_canonical_bytes_are_the_same_in_another_process(lock, tmp_path):
    code = ("import sys; sys.path.insert(0, 'tests'); from synth_lock import synthetic_lock; "
            "sys.stdout.buffer.write(synthetic_lock().to_bytes())")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}).stdout
    assert out == lock.to_bytes()


def test_write_and_read(lock, tmp_path):
    p = write_lock(tmp_path / "locks" / "synth.lock.json", lock)
    assert p.read_bytes() == lock.to_bytes()
    assert read_lock(p) == lock
    assert not [f for f in p.parent.iterdir() if f.name.endswith(".tmp")]
    with pytest.raises(LockFileError, match="no lock file at .*gemmar-aot build"):
        read_lock(tmp_path / "absent.lock.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(LockFileError, match="bad.json is not valid JSON"):
        read_lock(tmp_path / "bad.json")


def test_one_action_key_is_one_kernel(lock):
    t = lock.tuples[0]
    e = t.ranks[0].launches[1]
    other = replace(e, blob=Digest("ee" * 32, 7))
    r0 = replace(t.ranks[0], launches=(t.ranks[0].launches[0], other) + t.ranks[0].launches[2:])
    bad = replace(lock, tuples=(replace(t, ranks=(r0,) + t.ranks[1:]),) + lock.tuples[1:] + (t,))
    with pytest.raises(LockFileError, match=f"action key {e.key} names two different kernels"):
        bad.to_bytes()


# ---- schema ----

@pytest.mark.parametrize("schema, match", [
    (3, "lock schema 3 was written by a newer gemmar-aot; this one reads lock schema 2: upgrade gemmar-aot"),
    (1, "lock schema 1 was written by an older gemmar-aot; this one reads lock schema 2 .*rebuild it with "
        "`gemmar-aot build MANIFEST`"),
    (0, "unknown lock schema 0 \\(this gemmar-aot reads lock schema 2\\)"),
    ("2", "\\$.schema is '2', not an integer lock schema"),
    (None, "\\$.schema is None, not an integer lock schema"),
])
def test_other_schemas_are_refused(doc, schema, match):
    doc["schema"] = schema
    _refuse(doc, match)


def test_a_schema_1_lock_is_refused_not_migrated():
    old = {"schema": 1, "manifest": {"name": "x"}, "tuples": [{"ranks": [{"launches": [
        {"kind": "gemm", "key": "aa" * 32, "blob": "bb" * 32, "size": 3, "launch": {}}]}]}]}
    _refuse(old, "older gemmar-aot.*does not convert old locks")


# ---- malformed content ----

def _first_kernel(doc) -> str:
    return sorted(doc["kernels"])[0]


def test_missing_field(doc):
    del doc["tuples"][0]["ranks"][1]["self_test"]
    _refuse(doc, r"\$\.tuples\[0\]\.ranks\[1\] has no 'self_test' \(a required field\); rebuild the lock")
    del doc["arch"]
    _refuse(doc, r"\$ has no 'arch'")


def test_unknown_field(doc):
    doc["tuples"][0]["colour"] = "blue"
    _refuse(doc, r"\$\.tuples\[0\] has unknown field\(s\) 'colour' for lock schema 2")


@pytest.mark.parametrize("field, value, match", [
    ("hash", "ab" * 31, "is 'abab.*', expected a sha256 \\(64 lowercase hex digits\\)"),
    ("hash", "AB" * 32, "is .ABAB.*, expected a sha256"),
    ("hash", 12, "is 12, expected a sha256"),
    ("size", -1, "is -1, expected an integer >= 0"),
    ("size", "100", "is a string \\('100'\\), expected an integer"),
    ("size", True, "is a boolean \\(True\\), expected an integer"),
    ("size", 1.5, "is a number \\(1.5\\), expected an integer"),
])
def test_bad_digest(doc, field, value, match):
    k = _first_kernel(doc)
    doc["kernels"][k]["blob"][field] = value
    _refuse(doc, rf"\$\.kernels\.{k}\.blob\.{field} {match}")


def test_digest_type_validates():
    Digest("ab" * 32, 0)
    for h, s in (("ab" * 31, 1), ("ab" * 32 + "0", 1), ("xy" * 32, 1), ("ab" * 32, -1), ("ab" * 32, True),
                 ("ab" * 32, 1.0)):
        with pytest.raises(ValueError):
            Digest(h, s)
    assert Digest.of(b"abc") == Digest("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", 3)


@pytest.mark.parametrize("path, value, match", [
    (("tuples", 0, "m"), "256", r"\$\.tuples\[0\]\.m is a string \('256'\), expected an integer"),
    (("tuples", 0, "m"), 0, r"\$\.tuples\[0\]\.m is 0, expected an integer >= 1"),
    (("tuples", 0, "transport"), "fused-nccl", r"transport is 'fused-nccl', expected one of fused-sdma, split-sdma"),
    (("tuples", 0, "ranks"), {}, r"\$\.tuples\[0\]\.ranks is an object \(\{\}\), expected a list"),
    (("tuples", 0, "ranks", 0, "rank"), 2, r"ranks\[0\]\.rank is 2: the world has 2 ranks"),
    (("tuples", 0, "ranks", 1, "rank"), 0, r"ranks\[1\]\.rank is 0: a repeated rank"),
    (("tuples", 0, "ranks", 0, "launches", 1), "ff" * 32, r"launches\[1\] is 'ffff.*', which names no kernel"),
    (("tuples", 0, "layout", "n"), 2048, r"\$\.tuples\[0\]\.layout\.n is 2048, but the tuple's n is 1024"),
    (("tuples", 0, "layout", "call"), None, r"layout\.call does not describe the tuple's M=256"),
    (("tuples", 0, "layout"), None, r"layout is null, but a fused-sdma tuple has a window"),
    (("tuples", 0, "layout", "recv_slot_offs", 1), "x", r"recv_slot_offs\[1\] is a string"),
    (("env", "X"), 1, r"\$\.env\.X is an integer \(1\), expected a string or null"),
    (("toolchain", "digest"), "nope", r"\$\.toolchain\.digest is 'nope', expected a sha256"),
    (("toolchain", "ingredients", "toolchain", "x"), 0.5, r"ingredients\.toolchain\.x is 0.5; a lock holds no "
                                                          r"fractional numbers"),
    (("manifest", "sha256"), None, r"\$\.manifest\.sha256 is None, expected a sha256"),
    (("launch_records", 0, "grid"), [1, 1], r"launch_records\[0\]\.grid is \[1, 1\], expected three"),
    (("launch_records", 0, "params", 0), "f32", r"params\[0\] is 'f32', expected one of ptr, len32"),
    (("launch_records", 0, "args", 0, "params", 0), 9, r"args\[0\]\.params\[0\] is 9, expected a host "
                                                       r"parameter index \(0\.\.2\)"),
    (("code_object_version",), 0, r"\$\.code_object_version is 0, expected an integer >= 1"),
])
def test_wrong_types_and_values(doc, path, value, match):
    o = doc
    for p in path[:-1]:
        o = o[p]
    o[path[-1]] = value
    _refuse(doc, match)


def test_kernel_references(doc):
    k = _first_kernel(doc)
    doc["kernels"][k]["launch"] = len(doc["launch_records"])
    _refuse(doc, rf"\$\.kernels\.{k}\.launch is {len(doc['launch_records'])}, expected an index")
    doc["kernels"][k]["launch"] = 0
    doc["kernels"]["KEY"] = doc["kernels"].pop(k)
    _refuse(doc, r"\$\.kernels has key 'KEY', expected an action key")


def test_not_an_object():
    with pytest.raises(LockFileError, match="holds a JSON object, this holds a list"):
        Lock.from_json([], "l.json")


def test_entries_are_shared_and_validated():
    e = entry(1)
    assert e.symbol == e.launch.kernel
    with pytest.raises(ValueError, match="action key"):
        replace(e, key="k")


def test_a_zstd_compressed_lock_reads_back_and_a_flipped_byte_is_refused(lock, tmp_path):
    """An artifact wheel's lock.json.zst goes through the one reader; damage is a clear error."""
    import zstandard

    from gemmar_aot.artifact_model import LOCK_ZSTD_MAGIC, compress_lock

    data = compress_lock(lock)
    assert data[:4] == LOCK_ZSTD_MAGIC and compress_lock(lock) == data  # deterministic
    p = tmp_path / "lock.json.zst"
    p.write_bytes(data)
    assert read_lock(p) == lock and Lock.from_bytes(data, "w").to_bytes() == lock.to_bytes()
    for i in (len(data) // 2, len(data) - 2):  # in the compressed block; in the checksum
        bad = bytearray(data)
        bad[i] ^= 0x01
        p.write_bytes(bytes(bad))
        with pytest.raises(LockFileError, match=f"{p} is a zstd-compressed lock that does not decompress.*reinstall"):
            read_lock(p)
    # a frame without a checksum (not what compress_lock writes) is refused: damage could go unseen
    p.write_bytes(zstandard.ZstdCompressor(write_checksum=False).compress(lock.to_bytes()))
    with pytest.raises(LockFileError, match="no checksum"):
        read_lock(p)
    # valid zstd holding something that is not a lock: the JSON/model errors, naming the file
    p.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(b"{not json"))
    with pytest.raises(LockFileError, match="lock.json.zst is not valid JSON"):
        read_lock(p)


def test_the_model_is_standard_library_only():
    code = ("import sys; import gemmar_aot.artifact_model; "
            "mods = {m.split('.')[0] for m in sys.modules}; "
            "ours = sorted(m for m in sys.modules if m.startswith('gemmar_aot')); "
            "bad = sorted(m for m in mods - set(sys.stdlib_module_names) - {'gemmar_aot'} if not m.startswith('_')); "
            "print(bad, ours)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    bad, ours = out.split("] [")
    assert bad == "[", bad
    assert "gemmar_aot.store" not in ours and "gemmar_aot.runtime" not in ours, ours


class _SlowReader(_Reader):
    """Validation one value at a time only (the bulk fast paths switched off)."""

    def kernels_valid(self, v, records):
        return False

    def tuple_fast(self, v, kernels):
        return None


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, list) and obj:
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))
    else:
        yield path


_ODD_VALUES = (None, -1, 0, 1, 3, 2.5, True, "", "x", "ab" * 32, "AB" * 32, [], {}, [1], "fused-sdma", "lsa")


def test_bulk_validation_accepts_exactly_what_one_by_one_validation_accepts(doc):
    """Every leaf of a lock, set to each of a set of odd values: the fast (bulk) and the slow
    (one value at a time) readers agree on accept/refuse, and on the result."""
    rng = random.Random(7)
    paths = list(_leaves(doc))
    checked = refused = 0
    for path in rng.sample(paths, min(len(paths), 200)):
        for value in rng.sample(_ODD_VALUES, 3):
            d = copy.deepcopy(doc)
            o = d
            for p in path[:-1]:
                o = o[p]
            o[path[-1]] = value
            outcomes = []
            for reader in (_Reader("l"), _SlowReader("l")):
                try:
                    outcomes.append(reader.lock(d).to_bytes())
                except LockFileError as e:
                    outcomes.append(type(e))
            assert outcomes[0] == outcomes[1], (path, value)
            checked += 1
            refused += outcomes[0] is LockFileError
    assert checked >= 600 and refused > checked // 2


def test_record_digest_leaves_out_timings():
    rec = {"schema": 1, "key": "ab" * 32, "blob": {"digest": "cd" * 32, "size": 3}, "spec": {"kind": "gemm"},
           "compile_seconds": 1.25}
    assert record_digest(rec) == record_digest({**rec, "compile_seconds": 7.5}) == record_digest(
        {k: v for k, v in rec.items() if k != "compile_seconds"})
    assert record_digest(rec) != record_digest({**rec, "spec": {"kind": "drain"}})


def test_a_built_lock_names_each_kernel_s_record(smoke_store, smoke_lock):
    """Every entry's record digest is the store's record for its key (without timings)."""
    from gemmar_aot.store import Store

    st = Store(smoke_store, readonly=True)
    kernels = smoke_lock.kernels()
    assert len(kernels) > 20
    for key, e in kernels.items():
        rec = st.get_record(key)
        assert record_digest(rec) == e.record
        assert (rec["blob"]["digest"], rec["blob"]["size"]) == (e.blob.hash, e.blob.size)
        assert rec["spec"]["kind"] == e.kind and rec["launch"]["kernel"] == e.symbol


def test_a_read_lock_resolves_rank_launches_lazily_and_copies_like_a_built_one(lock, tmp_path):
    import pickle
    import threading

    p = write_lock(tmp_path / "l.lock.json", lock)
    read = read_lock(p)
    r = read.tuples[0].ranks[0]
    assert "launches" not in r.__dict__  # nothing built yet
    assert pickle.loads(pickle.dumps(read)) == copy.deepcopy(read) == lock
    again = read_lock(p)
    got = []
    threads = [threading.Thread(target=lambda: got.append([x.launches for t in again.tuples for x in t.ranks]))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(g == got[0] for g in got)
    assert r.launch_keys() == (tuple(e.key for e in lock.tuples[0].ranks[0].launches),
                               tuple(e.key for e in lock.tuples[0].ranks[0].self_test))
    with pytest.raises(AttributeError):
        r.not_a_field  # noqa: B018


def test_write_refuses_a_lock_the_reader_would_refuse(lock, tmp_path):
    t = lock.tuples[0]
    bad = replace(lock, tuples=(replace(t, id=replace(t.id, n=2048)),) + lock.tuples[1:])  # window says n=1024
    with pytest.raises(LockFileError, match=r"\(not written\): \$\.tuples\[0\]\.layout\.n is 1024, but the "
                                            r"tuple's n is 2048"):
        write_lock(tmp_path / "bad.lock.json", bad)
    assert not list(tmp_path.iterdir())
