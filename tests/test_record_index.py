"""The record index beside a lock (gemmar_aot.store.record_index): one file instead of a record per kernel.

The runtime's lock<->record binding (issue 9) reads the records a lock names from it; every
line is checked against the record digest the lock names (both halves of the record hashed,
only the half the runtime reads parsed), so the index can only be refused, never trusted into
accepting another record. Runs against the real smoke build.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import zstandard

from fakes import FakeCommunicator, FakeHipDriver
from index_frames import find_line, read_frames, write_frames
from gemmar_aot.model.lock import read_lock, write_lock
from gemmar_aot.model.types import Digest
from gemmar_aot.store.record import RECORD_READ_MEMBERS, record_digest, record_digest_of_halves, record_halves
from gemmar_aot.runtime import record_binding
from gemmar_aot.runtime.record_binding import envelope
from gemmar_aot.model.spec import canonical_json
from gemmar_aot.runtime import ArtifactMismatchError, GemmAllReduceOp
from gemmar_aot.store import Store
from gemmar_aot.store.record_index import INDEX_SCHEMA, RecordIndex, RecordIndexError, build_index_from_store, encode_index, write_index
from gemmar_aot.model.bundle import LockBundle

N, K, WORLD = 1024, 256, 2


def _op(artifacts, lock, rank=0):
    return GemmAllReduceOp(FakeCommunicator(rank=rank, nranks=WORLD), n=N, k=K, m_max=512,
                           driver=FakeHipDriver([lock]), self_test=False, artifacts=artifacts)


def _copy(smoke_store: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "store"
    shutil.copytree(smoke_store, root)
    return root, root / "locks" / "smoke.lock.json"


def _no_record_files(monkeypatch):
    """Reading a record file from the store fails the test: the index must serve every record."""
    def refuse(self, key, *a):
        raise AssertionError(f"record {key} read from the store, not from the index")
    monkeypatch.setattr(Store, "read_record_named", refuse)
    monkeypatch.setattr(Store, "read_record_file", refuse)


def test_the_build_writes_an_index_every_line_of_which_is_its_lock_s_record(smoke_store, smoke_lock):
    path = LockBundle(smoke_store / "locks" / "smoke.lock.json").record_index
    assert path == smoke_store / "locks" / "smoke.records.zst" and path.is_file()
    index = RecordIndex.read(path)
    kernels = smoke_lock.kernels()
    assert len(index) == len(kernels)
    wanted = [(k, e.record, e.blob.hash) for k, e in kernels.items()]
    whole, read = index.records(wanted, whole=True), index.records(wanted)
    store = Store(smoke_store, readonly=True)
    for key, rec in whole.items():
        assert isinstance(rec, dict), key
        named = store.read_record_named(key, kernels[key].record)
        assert rec == named  # byte for byte the named record
        # what the runtime parses: the members it reads, nothing of the ingredients or metadata
        assert read[key] == {m: named[m] for m in RECORD_READ_MEMBERS if m in named}  # hipcc: no launch
        assert "ingredients" in named and "metadata" in named
    # the build's index and one made afterwards from the store's records are the same bytes
    assert build_index_from_store(smoke_lock, store) == path.read_bytes()


def test_every_entry_of_a_build_is_bound_by_its_envelope_and_only_the_spec_is_parsed(smoke_store, smoke_lock,
                                                                                     monkeypatch):
    """What the runtime expects a record to start with (the lock's blob, key and launch record,
    as canonical JSON) is how every record the build wrote starts: the binding parses only the
    spec. Taken from the records themselves, not from the envelope code."""
    store = Store(smoke_store, readonly=True)
    for key, e in {e.key: e for _w, e in smoke_lock.iter_launches()}.items():  # what an op binds
        read, _rest = record_halves(store.read_record_named(key, e.record))
        assert read.startswith(envelope(e)), key
        # and no other launch record, symbol or blob gives these bytes
        assert not read.startswith(envelope(replace(e, launch=replace(e.launch, kernel=e.launch.kernel + "x"))))
        assert not read.startswith(envelope(replace(e, blob=Digest(e.blob.hash, e.blob.size + 1))))
    # and so no launch record of the index is parsed when an op gets ready
    parsed = []
    orig = record_binding.parse_lines
    monkeypatch.setattr(record_binding, "parse_lines", lambda texts, path: parsed.extend(texts) or orig(texts, path))
    _op(smoke_store, smoke_lock).close()
    assert parsed and all(t.startswith(b'{"schema":') and b'"launch":' not in t for t in parsed)


def test_the_runtime_reads_the_index_not_the_record_files(smoke_store, smoke_lock, monkeypatch):
    _no_record_files(monkeypatch)
    op = _op(smoke_store, smoke_lock)
    assert op.m_values == (256, 512)
    op.close()


def test_a_missing_index_falls_back_to_the_record_files(smoke_store, smoke_lock, tmp_path, monkeypatch):
    root, lock_path = _copy(smoke_store, tmp_path)
    LockBundle(lock_path).record_index.unlink()
    read = []
    orig = Store.read_record_named
    monkeypatch.setattr(Store, "read_record_named", lambda self, key, want: read.append(key) or orig(self, key, want))
    op = _op(root, smoke_lock)
    op.close()
    assert read and set(read) == {le.key for e in op._entries.values() for le in (*e.launches, *e.self_test)}


@pytest.mark.parametrize("loss", ["missing", "one byte flipped", "record dictionary damaged"])
def test_without_the_index_a_record_that_cannot_be_read_is_refused_never_unchecked(
        smoke_store, smoke_lock, tmp_path, loss):
    """The record check never fails open: the index gone and a record the lock names missing or
    unreadable, the op is refused naming that record and the fix, rather than built unchecked."""
    root, lock_path = _copy(smoke_store, tmp_path)
    LockBundle(lock_path).record_index.unlink()
    st = Store(root)
    r0 = next(r for t in smoke_lock.tuples if t.id.transport == "fused-sdma" for r in t.ranks if r.rank == 0)
    entry = r0.launches[0]
    rec_file = st.record_path(entry.key)
    if loss == "missing":
        rec_file.unlink()
    elif loss == "one byte flipped":
        data = bytearray(rec_file.read_bytes())
        data[len(data) // 2] ^= 0x01
        rec_file.write_bytes(bytes(data))
    else:
        info = st.dictionary_info("records")
        assert info is not None, "the smoke store's records use a dictionary"
        for p in (st.blob_path(info["hash"]), st.local.spare_path(info["hash"])):
            data = bytearray(p.read_bytes())
            data[len(data) // 2] ^= 0x01
            p.write_bytes(bytes(data))
    with pytest.raises(ArtifactMismatchError) as err:
        _op(root, read_lock(lock_path)).close()
    msg = str(err.value)
    assert "neither a record index beside the lock nor the store has it readable" in msg
    assert "rebuild the manifest into this store" in msg


def test_a_tampered_index_line_is_refused_naming_both_digests(smoke_store, smoke_lock, tmp_path):
    root, lock_path = _copy(smoke_store, tmp_path)
    path = LockBundle(lock_path).record_index
    head, groups = read_frames(path)
    prefix = head["prefix_hex"]
    # the rank-0 reduce at M=512: relabel it as rank 1's (what a lock pointing at the wrong rank's
    # phase kernel would need the record to say)
    key = next(le.key for t in smoke_lock.tuples if t.id.transport == "fused-sdma" and t.id.k == K
               and t.id.m == 512 and t.id.gather_dtype == "bf16" for r in t.ranks if r.rank == 0
               for le in r.launches if le.kind == "reduce")
    g, i = find_line(head, groups, key)
    line = groups[g][i]
    read, _sep, rest = line[prefix:].partition(b"\x1f")
    assert b'"rank":0' in read
    groups[g][i] = line = line.replace(b'"rank":0', b'"rank":1', 1)  # in the half the runtime parses
    write_frames(path, head, groups)
    want = smoke_lock.kernels()[key].record
    with pytest.raises(ArtifactMismatchError) as ei:
        _op(root, smoke_lock)
    msg = str(ei.value)
    assert want.hash in msg and str(path) in msg and "record index holds" in msg
    restored = line[prefix:].partition(b"\x1f")[0].replace(b'"key":""', f'"key":"{key}"'.encode()).replace(
        b'"blob":{"hash":""', f'"blob":{{"hash":"{smoke_lock.kernels()[key].blob.hash}"'.encode())
    derive_key = Store(smoke_store, readonly=True).get_record(key)["derive"]["key"]  # left out of the line
    got = record_digest_of_halves(restored, rest.replace(b'"key":""}', f'"key":"{derive_key}"}}'.encode(), 1))
    assert got.hash in msg  # both digests: the lock's and the line's


def test_the_half_the_runtime_never_parses_is_still_checked(smoke_store, smoke_lock, tmp_path):
    """One byte of a record's ingredients changed in the index: never parsed, yet refused."""
    root, lock_path = _copy(smoke_store, tmp_path)
    path = LockBundle(lock_path).record_index
    head, groups = read_frames(path)
    key = next(le.key for t in smoke_lock.tuples if t.id.transport == "fused-sdma" and t.id.k == K
               and t.id.m == 256 and t.id.gather_dtype == "bf16" for r in t.ranks if r.rank == 0
               for le in r.launches if le.kind == "gemm")
    g, i = find_line(head, groups, key)
    line = groups[g][i]
    j = line.index(b"\x1f") + line[line.index(b"\x1f"):].index(b'"mori_version":"') + len(b'"mori_version":"')
    groups[g][i] = line[:j] + (b"9" if line[j:j + 1] != b"9" else b"8") + line[j + 1:]
    write_frames(path, head, groups)
    with pytest.raises(ArtifactMismatchError, match=f"the lock was made from record {smoke_lock.kernels()[key].record.hash}"
                                                    r".*the record index holds"):
        _op(root, smoke_lock)


def test_lines_are_grouped_by_rank_and_a_rank_reads_only_its_own(smoke_store, smoke_lock, tmp_path):
    head, groups = read_frames(LockBundle(smoke_store / "locks" / "smoke.lock.json").record_index)
    n = head["prefix_hex"]
    ranks = sorted({r.rank for t in (*smoke_lock.tuples, *smoke_lock.eps) for r in t.ranks})
    hipcc = {(h.variant.arch, h.variant.nic, h.variant.host_proxy) for h in smoke_lock.hipcc}
    jitv2 = {(j.variant.arch, j.variant.nic) for j in smoke_lock.jitv2}  # whole code objects: a group per pod
    assert head["schema"] == INDEX_SCHEMA == 5 and len(groups) == len(ranks) + len(hipcc) + len(jitv2) > len(ranks) > 1
    seen: set[bytes] = set()
    for rank, lines in zip(ranks, groups):  # a key in the group of the first rank that launches it
        want = {le.key[:n].encode() for t in (*smoke_lock.tuples, *smoke_lock.eps) for r in t.ranks
                if r.rank == rank for le in (*r.launches, *r.self_test)} - seen
        assert {line[:n] for line in lines} == want
        seen |= want
    root, lock_path = _copy(smoke_store, tmp_path)
    op = _op(root, smoke_lock, rank=1)
    index = op.artifacts.record_index(op._entries[256].lock)
    op.close()
    assert index._groups[0] is not None and index._groups[1] is None  # rank 0's frame never decompressed
    # rank 0's frame damaged: rank 1 does not notice, rank 0 is refused naming the index
    data = bytearray(LockBundle(lock_path).record_index.read_bytes())
    start = len(data) - sum(nbytes for nbytes, _p in head["groups"])
    data[start + head["groups"][0][0] // 2] ^= 0x20
    LockBundle(lock_path).record_index.write_bytes(bytes(data))
    _op(root, smoke_lock, rank=1).close()
    with pytest.raises(ArtifactMismatchError, match="smoke.records.zst.*delete"):
        _op(root, smoke_lock, rank=0)


def test_a_group_holding_other_lines_than_its_header_names_is_refused(smoke_store, smoke_lock, tmp_path):
    root, lock_path = _copy(smoke_store, tmp_path)
    head, groups = read_frames(LockBundle(lock_path).record_index)
    groups[0], groups[1] = groups[1], groups[0]  # the frames swapped, the header left as it was
    write_frames(LockBundle(lock_path).record_index, head, groups)
    with pytest.raises(ArtifactMismatchError, match="does not hold the lines its header names"):
        _op(root, smoke_lock)


def test_a_prefix_two_groups_name_finds_a_line_that_must_still_be_the_named_record(smoke_store, smoke_lock,
                                                                                   tmp_path):
    """A group that also names another rank's key (a damaged or forged header): whichever line a
    look-up finds under the prefix is checked against the record digest the lock names, so the
    forged one is refused (its digest handed back), never taken for the record."""
    root, lock_path = _copy(smoke_store, tmp_path)
    path = LockBundle(lock_path).record_index
    head, groups = read_frames(path)
    n = head["prefix_hex"]
    kernels = smoke_lock.kernels()
    victim = groups[0][0][:n].decode()
    key = next(k for k in kernels if k.startswith(victim))
    other = groups[1][0]  # rank 1's first line, put in group 1 again under the victim's prefix
    groups[1] = sorted([*groups[1], victim.encode() + other[n:]])
    head["groups"][1][1] = "".join(line[:n].decode() for line in groups[1])
    head["kernels"] += 1
    write_frames(path, head, groups)
    index = RecordIndex.read(path)
    rank1 = [(k, e.record, e.blob.hash) for k, e in kernels.items() if k[:n].encode() == other[:n]]
    assert isinstance(index.records(rank1)[rank1[0][0]], dict)  # group 1 read: its forged line too
    got = index.records([(key, kernels[key].record, kernels[key].blob.hash)])[key]
    assert isinstance(got, Digest) and got != kernels[key].record


@pytest.mark.parametrize("schema", [1, 2, 3, 4])
def test_an_index_of_an_older_schema_is_refused_with_the_fix(smoke_store, smoke_lock, tmp_path, schema):
    """Schemas 1 and 2 held whole records for the record digests of older locks; 3 and 4, records
    of record schema 1 (blobs spelled ``{"digest", "size"}``) for locks of schemas 3 and 4."""
    root, lock_path = _copy(smoke_store, tmp_path)
    head, groups = read_frames(LockBundle(lock_path).record_index)
    lines = sorted(line for g in groups for line in g)
    old = canonical_json({k: v for k, v in head.items() if k != "groups"} | {"schema": schema}).encode()
    LockBundle(lock_path).record_index.write_bytes(zstandard.ZstdCompressor(write_checksum=True, write_content_size=True)
                                      .compress(b"\n".join([old, *lines])))
    with pytest.raises(ArtifactMismatchError, match=f"record index schema {schema}, this gemmar-aot reads 5 .*"
                                                    "rebuild the manifest.*or delete"):
        _op(root, smoke_lock)


def test_an_index_written_for_another_lock_is_refused(smoke_store, smoke_lock, tmp_path):
    root, lock_path = _copy(smoke_store, tmp_path)
    # the index of a lock without the K=256 tuples beside the whole lock
    other = read_lock(lock_path)
    from dataclasses import replace

    other = replace(other, tuples=tuple(t for t in other.tuples if t.id.k != K))
    write_index(LockBundle(lock_path).record_index, build_index_from_store(other, Store(root, readonly=True)))
    with pytest.raises(ArtifactMismatchError, match=r"has no record for that key: it was written for another lock"):
        _op(root, smoke_lock)


def test_a_lock_whose_records_are_all_in_the_index_is_served(smoke_store, smoke_lock, tmp_path, monkeypatch):
    """A subset of the lock (a tuple dropped by hand) keeps the index: each line it uses is checked."""
    from dataclasses import replace

    root, lock_path = _copy(smoke_store, tmp_path)
    write_lock(lock_path, replace(smoke_lock, tuples=tuple(t for t in smoke_lock.tuples if t.id.k == K)))
    _no_record_files(monkeypatch)
    _op(root, smoke_lock).close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "schema", "miscount"])
def test_a_damaged_index_is_refused_naming_it_and_the_fix(smoke_store, smoke_lock, tmp_path, damage):
    root, lock_path = _copy(smoke_store, tmp_path)
    path = LockBundle(lock_path).record_index
    data = bytearray(path.read_bytes())
    if damage == "flip":  # in the header's frame (the groups' frames: the test above)
        head, _groups = read_frames(path)
        data[(len(data) - sum(nbytes for nbytes, _p in head["groups"])) // 2] ^= 0x40
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        head, groups = read_frames(path)
        write_frames(path, {**head, "schema": 99} if damage == "schema" else {**head, "kernels": head["kernels"] + 1},
                     groups)
    with pytest.raises(ArtifactMismatchError, match="delete .*smoke.records.zst to check the records one by one"):
        _op(root, smoke_lock)


def test_abridging_falls_back_to_the_verbatim_form_when_it_would_not_round_trip(tmp_path):
    key, blob = "a" * 64, "b" * 64
    plain = {"schema": 2, "key": key, "blob": {"hash": blob, "size": 3}, "spec": {"kind": "gemm"}}
    tricky = {**plain, "aaa": {"key": ""}}  # an earlier '"key":""' than the record's own key
    tricky = {**plain, "blob": {"a": {"key": ""}, "hash": blob, "size": 3}}  # '"key":""' in the read half
    entries = {key: (plain, blob), "c" * 64: ({**tricky, "key": "c" * 64}, blob)}
    path = tmp_path / "x.records.zst"
    path.write_bytes(encode_index(entries))
    _head, [lines] = read_frames(path)  # no groups given: one
    assert lines[0][8:].startswith(b"{") and b"a" * 64 not in lines[0] and b"b" * 64 not in lines[0]  # abridged
    assert lines[1][8:].startswith(b"=")  # verbatim
    index = RecordIndex.read(path)
    got = index.records([(k, record_digest(r), blob) for k, (r, _b) in entries.items()], whole=True)
    assert got[key] == plain and got["c" * 64]["blob"]["a"] == {"key": ""}
    # a wrong digest gives the line's own; an unknown key gives None
    assert index.records([(key, Digest.of(b"x"), blob)])[key] == record_digest(plain)
    assert index.records([("d" * 64, Digest.of(b"x"), blob)])["d" * 64] is None
    with pytest.raises(RecordIndexError, match="not a gemmar-aot record index"):
        RecordIndex.from_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(b"{}\n"), path)


def test_the_derive_key_is_left_out_of_each_line_and_restored_from_the_line_itself(smoke_store, smoke_lock):
    """Schema 4: a line's second half omits the record's derive key when its blob, launcher and
    derive code give it (the oracle: the derive step's own ``derive_key``), and the reader puts
    it back; the line still hashes to the lock's record digest."""
    from gemmar_aot.compiler.derive import derive_key
    from gemmar_aot.store.record_index import derive_key_of, encode_line

    st = Store(smoke_store, readonly=True)
    kernels = smoke_lock.kernels()
    for key in sorted(k for k in kernels if k not in {h.entry.key for h in smoke_lock.hipcc})[:20]:
        rec = st.get_record(key)  # (a hipcc code object has no launcher: its line is written whole)
        e = kernels[key]
        launcher = rec["launcher"]["hash"]
        assert derive_key_of(e.blob.hash, launcher, rec["derive"]["code"]) == rec["derive"]["key"]
        assert derive_key(e.blob.hash, launcher) == rec["derive"]["key"]  # this derive code made it
        line = encode_line(rec, key, e.blob.hash)
        assert rec["derive"]["key"].encode() not in line and b'"key":""}' in line
    index = RecordIndex.read(LockBundle(smoke_store / "locks" / "smoke.lock.json").record_index)
    got = index.records((k, e.record, e.blob.hash) for k, e in kernels.items())
    assert all(isinstance(v, dict) for v in got.values()) and len(got) == len(kernels)


def test_a_line_whose_derive_key_is_not_the_derivable_one_is_written_whole(smoke_store, smoke_lock):
    from gemmar_aot.store.record_index import encode_line

    st = Store(smoke_store, readonly=True)
    key, e = next(iter(sorted(smoke_lock.kernels().items())))
    rec = st.get_record(key)
    odd = {**rec, "derive": {**rec["derive"], "key": "f" * 64}}
    line = encode_line(odd, key, e.blob.hash)
    assert b'"key":"' + b"f" * 64 in line  # kept: restoring it would give another record
