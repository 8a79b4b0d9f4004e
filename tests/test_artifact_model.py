"""The artifact model: validation of lock JSON, canonical bytes, refusal of other schemas."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gemmar_aot.model.lock_codec import encode_lock_doc
from gemmar_aot.model.lock import Lock, _Reader, read_lock, write_lock
from gemmar_aot.model.schema import LOCK_SCHEMA, LockFileError
from gemmar_aot.model.types import _TUPLE_ID_KINDS, Digest, TupleId
from gemmar_aot.store.record import record_digest
from lock_docs import decode_lock_doc
from synth_lock import entry, synthetic_lock

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def lock() -> Lock:
    return synthetic_lock()


@pytest.fixture
def doc(lock) -> dict:
    return decode_lock_doc(lock.to_bytes())


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
    assert doc["schema"] == LOCK_SCHEMA == 7 and doc["ep"] == doc["hipcc"] == doc["jitv2"] == []  # one schema, entries or not
    back = Lock.from_json(doc)
    assert back == lock
    assert back.to_bytes() == lock.to_bytes()
    assert Lock.from_bytes(lock.to_bytes()) == lock and lock.to_json() == doc
    # one part per rank, holding that rank's kernels (one entry per action key) and launches
    assert [p["rank"] for p in doc["parts"]] == sorted({r.rank for t in lock.tuples for r in t.ranks})
    kernels = {k: e for p in doc["parts"] for k, e in p["kernels"].items()}
    for p in doc["parts"]:
        assert set(p["kernels"]) == {k for _ti, a, b in p["launches"] for k in a + b}
    assert len(kernels) == len(lock.action_keys()) == len(lock.kernels())
    # one launch record per distinct record
    assert len(doc["launch_records"]) == len({replace(e.launch, kernel="") for e in lock.kernels().values()}) \
        < len({e.launch for e in lock.kernels().values()}) < len(kernels)
    assert {k["symbol"] for k in kernels.values()} == {e.symbol for e in lock.kernels().values()}
    assert lock.blob_digests() == {e.blob.hash for e in lock.kernels().values()}


def test_canonical_bytes_do_not_depend_on_key_order(lock, doc):
    b = lock.to_bytes()
    assert b.endswith(b"\n") and b.startswith(b'{"arch":')
    lines = b.split(b"\n")[:-1]  # JSON Lines: the head, then one line per part, each named by the head
    assert len(lines) == 1 + len(doc["parts"])
    assert json.loads(lines[0])["parts"] == [{"rank": p["rank"], **Digest.of(line).to_json()}
                                             for p, line in zip(doc["parts"], lines[1:])]
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
    (8, "lock schema 8 was written by a newer gemmar-aot; this one reads lock schema 7: upgrade gemmar-aot"),
    # 3 and 4: their records spelled blobs {"digest", "size"} (record schema 1); a rebuild re-derives them
    (4, "lock schema 4 was written by an older gemmar-aot; this one reads lock schema 7 .*rebuild it with "
        "`gemmar-aot build MANIFEST` \\(the store's kernels are reused, nothing is recompiled\\)"),
    (3, "lock schema 3 was written by an older gemmar-aot; this one reads lock schema 7 .*rebuild it with "
        "`gemmar-aot build MANIFEST`"),
    (2, "lock schema 2 was written by an older gemmar-aot; this one reads lock schema 7 .*rebuild it with "
        "`gemmar-aot build MANIFEST`"),
    (1, "lock schema 1 was written by an older gemmar-aot; this one reads lock schema 7 .*rebuild it with "
        "`gemmar-aot build MANIFEST`"),
    (0, "unknown lock schema 0 \\(this gemmar-aot reads lock schema 7\\)"),
    ("2", "\\$.schema is '2', not an integer lock schema"),
    (None, "\\$.schema is None, not an integer lock schema"),
])
def test_other_schemas_are_refused(doc, schema, match):
    doc["schema"] = schema
    _refuse(doc, match)


def test_a_schema_5_lock_is_read_as_one_with_no_hipcc_code_objects(lock, doc):
    """Lock schema 6 added the ``hipcc`` list and nothing else: a lock of schema 5 reads as it is."""
    old = {k: v for k, v in doc.items() if k not in ("hipcc", "jitv2")} | {"schema": 5}
    assert Lock.from_json(old) == lock and Lock.from_json(old).hipcc == ()
    _refuse({**old, "hipcc": []}, r"\$ has unknown field\(s\) 'hipcc' for lock schema")


def test_a_schema_6_lock_is_read_as_one_with_no_jitv2_code_objects(lock, doc):
    """Lock schema 7 added the ``jitv2`` list and nothing else: a lock of schema 6 reads as it is."""
    old = {k: v for k, v in doc.items() if k != "jitv2"} | {"schema": 6}
    assert Lock.from_json(old) == lock and Lock.from_json(old).jitv2 == ()
    _refuse({**old, "jitv2": []}, r"\$ has unknown field\(s\) 'jitv2' for lock schema")


def test_a_schema_1_lock_is_refused_not_migrated():
    old = {"schema": 1, "manifest": {"name": "x"}, "tuples": [{"ranks": [{"launches": [
        {"kind": "gemm", "key": "aa" * 32, "blob": "bb" * 32, "size": 3, "launch": {}}]}]}]}
    _refuse(old, "older gemmar-aot.*does not convert old locks")


# ---- malformed content ----

def _first_kernel(doc) -> str:
    return sorted(doc["parts"][0]["kernels"])[0]


def test_missing_field(doc):
    del doc["parts"][1]["launches"]
    _refuse(doc, r"\$\.parts\[1\] has no 'launches' \(a required field\); rebuild the lock")
    del doc["arch"]
    _refuse(doc, r"\$ has no 'arch'")


def test_unknown_field(doc):
    doc["tuples"][0]["colour"] = "blue"
    _refuse(doc, r"\$\.tuples\[0\] has unknown field\(s\) 'colour' for lock schema 7")


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
    doc["parts"][0]["kernels"][k]["blob"][field] = value
    _refuse(doc, rf"\$\.parts\[0\]\.kernels\.{k}\.blob\.{field} {match}")


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
    (("tuples", 0, "ranks", 0), 2, r"\$\.tuples\[0\]\.ranks\[0\] is 2: the world has 2 ranks"),
    (("tuples", 0, "ranks", 1), 0, r"\$\.tuples\[0\]\.ranks\[1\] is 0: a repeated rank"),
    (("tuples", 0, "ranks", 1), "1", r"\$\.tuples\[0\]\.ranks\[1\] is a string \('1'\), expected an integer"),
    (("parts", 0, "launches", 0, 1, 1), "ff" * 32, r"\$\.parts\[0\]\.launches\[0\]\[1\]\[1\] is 'ffff.*', which "
                                                  r"names no kernel in \$\.parts\[0\]\.kernels"),
    (("parts", 0, "launches", 1, 0), 0, r"\$\.parts\[0\]\.launches\[1\]\[0\] is 0: a repeated tuple"),
    (("parts", 0, "launches", 0), [0, []], r"\$\.parts\[0\]\.launches\[0\] is \[0, \[\]\], expected \[tuple index"),
    (("parts", 0, "rank"), 1, r"\$\.parts\[1\]\.rank is 1: parts are in increasing rank order"),
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
    kernels = doc["parts"][0]["kernels"]
    kernels[k]["launch"] = len(doc["launch_records"])
    _refuse(doc, rf"\$\.parts\[0\]\.kernels\.{k}\.launch is {len(doc['launch_records'])}, expected an index")
    kernels[k]["launch"] = 0
    kernels["KEY"] = kernels.pop(k)
    _refuse(doc, r"\$\.parts\[0\]\.kernels has key 'KEY', expected an action key")


def test_parts_and_tuples_must_agree_on_ranks(doc):
    drop = copy.deepcopy(doc)
    drop["parts"][0]["launches"].pop(0)  # tuple 0 lists rank 0, rank 0's part has nothing for it
    _refuse(drop, r"\$\.parts\[0\]\.launches has nothing for tuple\(s\) \[0\], which list rank 0")
    extra = copy.deepcopy(doc)
    extra["tuples"][0]["ranks"].remove(1)  # rank 1's part still launches tuple 0
    _refuse(extra, r"\$\.parts\[1\]\.launches\[0\]\[0\] is 0: \$\.tuples\[0\] does not list rank 1")
    orphan = copy.deepcopy(doc)
    orphan["parts"].pop(1)
    _refuse(orphan, r"\$\.tuples\[0\]\.ranks\[1\] is 1: \$\.parts has no part for rank 1")
    unused = copy.deepcopy(doc)
    for t in unused["tuples"]:
        t["ranks"].remove(1)
    _refuse(unused, r"\$\.parts\[1\] is rank 1's part, but no tuple or EP entry lists rank 1")


def test_a_rank_reads_its_own_part_and_a_damaged_part_fails_the_ranks_that_use_it(lock, tmp_path):
    data = lock.to_bytes()
    head, *parts, _ = data.split(b"\n")
    i = parts[1].index(b'"hash":"') + 9  # a blob digest in rank 1's part
    parts[1] = parts[1][:i] + (b"0" if parts[1][i:i + 1] != b"0" else b"1") + parts[1][i + 1:]
    p = tmp_path / "x.lock.json"
    p.write_bytes(b"\n".join([head, *parts, b""]))
    back = read_lock(p)  # the head is fine: the lock reads
    t = back.tuples[0]
    assert t.ranks[0] == lock.tuples[0].ranks[0]  # rank 0's part is checked and parsed alone
    with pytest.raises(LockFileError, match=rf"{p}: rank 1's part \(line 3\) is [0-9a-f]{{64}}/\d+, the head names "
                                            rf"[0-9a-f]{{64}}/\d+: the file is damaged or was edited; rebuild"):
        t.ranks[1].launches
    with pytest.raises(LockFileError, match="rank 1's part"):
        back.check_parts()
    with pytest.raises(LockFileError, match="rank 1's part"):
        write_lock(tmp_path / "y.lock.json", back)
    assert not (tmp_path / "y.lock.json").exists()


def test_a_truncated_or_old_lock_file_is_refused(lock, doc, tmp_path):
    p = tmp_path / "x.lock.json"
    data = lock.to_bytes()
    p.write_bytes(data[:data.rindex(b"\n", 0, -1) + 1])  # the last part's line lost
    with pytest.raises(LockFileError, match=r"\$\.parts names 2 part\(s\), the file has 1 line\(s\) after the head"):
        read_lock(p)
    p.write_bytes(data[:-1])
    with pytest.raises(LockFileError, match="does not end in a newline"):
        read_lock(p)
    # a lock of schema 2 was one indented JSON document: refused by its schema, with the fix
    p.write_text(json.dumps({**doc, "schema": 2}, indent=1))
    with pytest.raises(LockFileError, match="lock schema 2 was written by an older gemmar-aot.*gemmar-aot build"):
        read_lock(p)
    # the document written as plain JSON (parts inline) is not a lock file
    p.write_text(json.dumps(doc) + "\n")
    with pytest.raises(LockFileError, match=r"\$\.parts names 2 part\(s\), the file has 0 line"):
        read_lock(p)
    # encode_lock_doc writes any document (tests damage locks with it); the reader judges it
    doc["parts"][0]["kernels"][_first_kernel(doc)]["kind"] = 7
    p.write_bytes(encode_lock_doc(doc))
    with pytest.raises(LockFileError, match=r"kernels\.[0-9a-f]{64}\.kind is an integer \(7\), expected a string"):
        read_lock(p).check_parts()


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

    from gemmar_aot.model.lock_codec import LOCK_ZSTD_MAGIC
    from gemmar_aot.model.lock import compress_lock

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
    code = ("import sys; import gemmar_aot.model.lock; "
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

    def tuple_fast(self, v, ti, parts):
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
    rec = {"schema": 2, "key": "ab" * 32, "blob": {"hash": "cd" * 32, "size": 3}, "spec": {"kind": "gemm"},
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
        assert (rec["blob"]["hash"], rec["blob"]["size"]) == (e.blob.hash, e.blob.size)
        assert rec["spec"]["kind"] == e.kind
        if rec["spec"]["recipe"] in ("hipcc", "jitv2"):  # a code object mori loads whole: every kernel it defines
            assert rec["metadata"]["kernels"] == list(e.symbols) and "launch" not in rec
        else:
            assert rec["launch"]["kernel"] == e.symbol


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


def test_two_threads_reading_one_part_at_once_both_get_it(lock, tmp_path, monkeypatch):
    """Both threads pass the 'not parsed yet' check before either finishes parsing the part."""
    import threading

    read = read_lock(write_lock(tmp_path / "l.lock.json", lock))
    both_in, first_done = threading.Barrier(2, timeout=10), threading.Event()
    original = _Reader.part

    def part(self, p):
        if both_in.wait() == 0:  # one of the two parses first, the other after it finished
            out = original(self, p)
            first_done.set()
            return out
        assert first_done.wait(10)
        return original(self, p)

    monkeypatch.setattr(_Reader, "part", part)
    r = read.tuples[0].ranks[0]
    got, errors = [], []

    def use():
        try:
            got.append(r.launch_keys())
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=use) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors and len(got) == 2 and got[0] == got[1] == lock.tuples[0].ranks[0].launch_keys()


def test_write_refuses_a_lock_the_reader_would_refuse(lock, tmp_path):
    t = lock.tuples[0]
    bad = replace(lock, tuples=(replace(t, id=replace(t.id, n=2048)),) + lock.tuples[1:])  # window says n=1024
    with pytest.raises(LockFileError, match=r"\(not written\): \$\.tuples\[0\]\.layout\.n is 1024, but the "
                                            r"tuple's n is 2048"):
        write_lock(tmp_path / "bad.lock.json", bad)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(TupleId)])
def test_every_tuple_id_field_is_checked_by_both_readers_from_one_table(doc, field):
    """TupleId's fields, each set to a value of the wrong kind (and each int and string to an out
    of range one): both readers refuse it, and the value-by-value one names the field's path --
    the field table (``_TUPLE_ID_KINDS``) covers every field, with no field spelled by hand."""
    kind = _TUPLE_ID_KINDS[field]
    for bad in ([], 0 if kind != "str" else "", 2.5 if kind != "str" else 7):
        d = copy.deepcopy(doc)
        d["tuples"][0][field] = bad
        for reader in (_Reader("l"), _SlowReader("l")):
            with pytest.raises(LockFileError) as ei:
                reader.lock(d)
        assert f"$.tuples[0].{field}" in str(ei.value), (field, bad, str(ei.value))
